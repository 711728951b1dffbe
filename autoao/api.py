"""`autoao.optimize`: workload -> measure -> bench -> search and anytime -> finalize -> outputs.

    result = autoao.optimize(model, example_inputs, budget="10m", max_accuracy_drop=0.01)
    result.model, result.plan, result.summary (its .speedup, .verdict), result.report_path

The model is quantized in place (like torchao's quantize_): afterwards it carries the chosen plan.
`run_stages` is the list of stage calls, each a function with a typed input and output (the stage
modules say what each does); the command line calls it with its own hooks (options.RunHooks).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from autoao import workers
from autoao.budget import MIN_TRIAL_S, WRITE_SECONDS, TimePlan
from autoao.common import BASELINE, cache_dir
from autoao.decisions import NothingToTry, Resumed, RunInterrupted, StudyClosed, Verified
from autoao.evaluators.cache import ResultCache, TimingCache, digest
from autoao.evaluators.judge import Judge, JudgeContext, deciding_judge
from autoao.evaluators.timing import LatencyTable
from autoao.export import targets
from autoao.export.deploy import deploy
from autoao.export.targets import Target
from autoao.kernels.algorithms import algorithm_seconds
from autoao.ledger import Interrupted, RunLedger
from autoao.options import Options, RunHooks
from autoao.plan import Plan
from autoao.records import ParetoRow, RunSummary, TimingHealth, write
from autoao.stages.anytime import MIN_ROUNDS, Anytime, Incumbent
from autoao.stages.bench import ModelBench
from autoao.stages.finalize import finalize
from autoao.stages.inputs import Inputs, build_inputs, grid_warning, settle_cpu_threads
from autoao.stages.judges import Judges, build_judges
from autoao.stages.measure import (Measurements, costs, estimated_cells, measure, measure_baselines, measure_seconds,
                                   record_final, time_candidates)
from autoao.stages.outputs import pareto_rows, read_state, run_context, run_summary, write_outputs, write_state
from autoao.stages.search import Group, SearchConfig, SearchOutcome, make_groups, plan_from_params, run_search, uniform_names
from autoao.types import FromBytes


@dataclass
class OptimizeResult:
    """What `optimize` returns; everything is also on disk in `out_dir`."""

    model: nn.Module  # the same object that was passed in, now quantized by `plan`
    plan: Plan
    summary: RunSummary  # speed-up with its interval, the verdicts, decisions, stage times (summary.json)
    pareto: list[ParetoRow]  # the Pareto plans: trial, predicted ms, drop, tier, layer summary
    study: Any  # the optuna.Study
    out_dir: Path
    report_path: Path | None = None


def _keeps_torch_threads(fn: Callable[..., OptimizeResult]) -> Callable[..., OptimizeResult]:
    """optimize runs on one thread on a busy CPU (workload.settle_cpu_threads): when it returns or
    raises, torch's thread count is the caller's again."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> OptimizeResult:
        threads = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
    return run


def optimize(model: nn.Module, example_inputs: Any, *, budget: str | int = "5m",
             accuracy: None | str | list[str] | Callable[[nn.Module], Any] = None, max_accuracy_drop: float = 0.01,
             tokenizer: Any = None, eval_inputs: Any = None, candidates: list[Any] | None = None,
             target: str = "autoao", storage: str | None = None, out_dir: str | Path = "autoao-report",
             seed: int = 0, workload: Callable[[nn.Module], Any] | None = None,
             progress: bool = True) -> OptimizeResult:
    """Find the fastest per-layer plan whose accuracy drop stays within `max_accuracy_drop`, apply it
    to `model` in place, and write plan.json, pareto.json, summary.json, the study, the saved model
    and report.html to `out_dir`. A plan ships only when its verdicts hold (the drop's 95% interval
    within the budget) and it is measured faster than the model as it came (and in `workload`, where
    given); otherwise the model stays as it came and `result.summary.decisions` say why.
    docs/python-api.md has the details.

    Args:
        model: any nn.Module with nn.Linear layers, on the device it will run on.
        example_inputs: what the model runs (a tensor, a tuple of args, a dict of kwargs, or a list
            of those): layer shapes, token counts and latencies come from these.
        budget: wall time ("90s", "10m", "1h") or a number of trials (200); covers the whole run.
        accuracy: None (the label-free proxy decides), lm-eval task names (need `tokenizer`), or a
            callable(model) -> float or per-item scores (higher is better).
        max_accuracy_drop: the largest drop allowed, in [0, 1], in the deciding metric's units.
        tokenizer: the model's tokenizer: lm-eval tasks, and held-out text for the proxy.
        eval_inputs: held-out inputs for the proxy (default: built when the examples are too few).
        candidates: names or Candidates (default: the target's search space; bf16 always included).
        target: the engine the plan is made for: "autoao" (its own modules), "vllm", "sglang" or
            "transformers" (compressed-tensors; the search holds only what the engine loads, and
            layers it fuses share one scheme); `autoao export` writes the checkpoint.
        storage: Optuna RDB URL (default: SQLite in out_dir); a database server shares the study
            with `autoao worker` processes.
        out_dir: where everything is written. seed: the sampler's seed.
        workload: what you run, as a callable(model), e.g. lambda m: m.generate(ids, max_new_tokens=64):
            the final comparison times it too, in alternation, in your mode (eager, or compiled by
            your code); a plan ships only if faster there (summary.workload has the numbers).
        progress: progress bars and stage messages on stderr.
    """
    opts = Options.check(budget=budget, accuracy=accuracy, tokenizer=tokenizer, max_accuracy_drop=max_accuracy_drop,
                         candidates=candidates, eval_inputs=eval_inputs, storage=storage, out_dir=out_dir, seed=seed,
                         progress=progress, target=target, workload=workload)
    return run_stages(model, example_inputs, opts, RunHooks())


@_keeps_torch_threads
def run_stages(model: nn.Module, example_inputs: Any, opts: Options, hooks: RunHooks) -> OptimizeResult:
    """The stages in order; `opts` checked, `hooks` the command line's. SIGINT or SIGTERM at any
    moment ends the run with the best plan verified so far written (`_interrupted`)."""
    ledger = RunLedger(opts.budget, opts.progress, spent=hooks.spent)
    with ledger.interruptible():
        prepared = _prepare(model, example_inputs, opts, hooks, ledger)
        try:
            for said in prepared.anytime.decisions:  # continued from an earlier run
                ledger.say(said.describe())
            closed = improve(prepared.anytime, prepared, opts, hooks, ledger)
            return _finish(prepared, opts, ledger, closed, None)
        except Interrupted as stop:
            with ledger.shielded():
                ledger.say(f"{stop.name}: writing the best plan verified so far")
                stop.result = _finish(prepared, opts, ledger, (), stop)
                stop.kept = _kept(stop.result)
            raise


@dataclass
class Prepared:
    """What the run measured before its first trial, and the anytime run built on it."""

    model: nn.Module
    work: Inputs
    base: Any  # measure.Baselines
    judges: Judges
    meas: Measurements
    bench: ModelBench
    config: SearchConfig
    context: Any  # records.RunContext
    time_plan: TimePlan
    notes: tuple[Any, ...]
    anytime: Anytime
    fits: dict[str, float]
    rcache: ResultCache
    outcome: SearchOutcome | None = None  # the study's trials so far (set by each search slice)


def _prepare(model: nn.Module, example_inputs: Any, opts: Options, hooks: RunHooks, ledger: RunLedger) -> Prepared:
    """Profile, baselines, judges, timing and layer errors; the run's context written; the anytime
    run built, continuing an earlier run of the same command where its out_dir holds one."""
    fits, rcache = algorithm_seconds(), ResultCache(cache_dir() / "timings.sqlite")
    tier2 = tier2_judge(opts, model, rcache)  # the user's metric runs once here: a broken one costs nothing
    engine = targets.get(opts.target)
    estimated = isinstance(engine.pricing, FromBytes)  # priced from bytes: nothing measured end to end
    with ledger.stage("profile and baselines"):
        busy = settle_cpu_threads(model, example_inputs)  # before profiling, which runs every example
        ledger.say("profiling")
        work = build_inputs(model, example_inputs, eval_inputs=opts.eval_inputs, tokenizer=opts.tokenizer,
                              fuse_groups=opts.fuse_groups, busy=busy, seed=opts.seed,
                              screen_positions=opts.screen_positions, confirm=opts.accuracy is None)
        for note in work.notes:
            ledger.say(note.describe())
        ledger.say(grid_warning(work, list(opts.candidates)) or f"{len(work.prof.layers)} linear layers")
        base = measure_baselines(model, work, cache=rcache, ledger=ledger, workload=opts.workload)
        rounds = 0 if estimated else MIN_ROUNDS  # an estimated plan is not measured end to end
        # where not even one plan's measurement and the end fit, no plan can be judged: build what trials need
        measure_s = measure_seconds(base, rounds)
        left, floor = ledger.remaining(), measure_s + WRITE_SECONDS + MIN_TRIAL_S
        judges = build_judges(model, work, tier2, opts.max_accuracy_drop, cache=rcache, weights_key=base.weights_key,
                              ledger=ledger, light=left is not None and left < floor)
        time_plan = TimePlan(ledger, costs(base, judges, measure_s))
        notes = work.notes + too_short(time_plan, ledger)
    with ledger.stage("kernel timing"):
        table, health = timing_table(model, work, opts, engine, rcache, time_plan, ledger)
    with ledger.stage("layer errors"):
        meas = measure(model, work, list(opts.candidates), table, base, health, cache=rcache, ledger=ledger,
                       deadline=time_plan.deadline("layer errors"),
                       allow_emulated=opts.allow_emulated or estimated, allowed=engine.supports)
    groups = make_groups(meas.choices, siblings(work, engine))
    bench = ModelBench(model, work.prof, work.examples, compile=base.compile, groups=groups, cost=meas.cost,
                       table=meas.table, pricing=engine.pricing, workload=opts.workload, base_replays=base.replays)
    config = search_config(opts, hooks, judges, groups, meas.cost, time_plan)
    context = run_context(model, work, list(opts.candidates), meas, meas.cost, groups, judges,
                          budget=str(opts.budget), seed=opts.seed, storage=config.storage or "",
                          study_name=config.study_name, command=hooks.command, bf16_us=base.bf16_us,
                          started=ledger.elapsed(), left_out=hooks.left_out, target=opts.target,
                          pricing=engine.pricing)
    write(opts.out_dir / "context.json", context)
    earlier = read_state(opts.out_dir, config.study_name)
    run = Anytime(bench, judges, time_plan, ledger, meas.cost, time_plan.costs.measure_s,
                  incumbent=Incumbent.from_record(earlier.incumbent) if earlier and earlier.incumbent else None,
                  tried=earlier.tried if earlier else None,
                  on_better=lambda inc: write_state(opts.out_dir, config.study_name, run))
    if earlier and earlier.incumbent:
        run.decisions.append(Resumed(run.curve[0].plan, run.incumbent.speedup, len(run.tried)))
    return Prepared(model, work, base, judges, meas, bench, config, context, time_plan, notes, run, fits, rcache)


def improve(run: Anytime, p: Prepared, opts: Options, hooks: RunHooks, ledger: RunLedger) -> tuple[StudyClosed, ...]:
    """The anytime loop: the warm start's uniform plans scored, then, while the budget lasts, the
    most valuable plan verified (Anytime.step) or, when none is worth its time, a slice of search
    (the warm start's other seeds first); a shared study is published first and closed after."""
    if opts.shared:
        workers.publish(p.config, p.bench.groups, p.meas.cost, p.meas.sqnr, p.judges, p.bench.model, p.work)
        ledger.say(f"study {p.config.study_name} published on {workers.shown(p.config.storage)}: "
                   f"autoao worker --storage URL --study {p.config.study_name} --model ... joins it")
        if hooks.on_study is not None:
            hooks.on_study(p.config.study_name)
    deadline = p.time_plan.deadline("search trials")
    seeds = replace(p.config, seconds=None if deadline is None else deadline - ledger.clock())
    with ledger.stage("search trials"):
        ledger.say(f"searching: {len(p.bench.groups)} choices, the uniform plans first "
                   f"({ledger.elapsed():.0f} s spent on measurements)")
        # the uniform plans until one is worth verifying: the first incumbent before the rest
        p.outcome = search(run, p, opts, seeds, queued_only=len(uniform_names(p.bench.groups)),
                           stop=lambda: run.worth_securing(p.outcome))
    slices = 0
    while True:
        with ledger.stage("verifying plans"):
            tried = run.step(p.outcome)
        if tried is not None:
            continue
        if opts.budget.trials is not None and slices:
            break  # a trial budget: its trials ran in the first slice
        seconds = p.time_plan.slice_seconds(run.first_price())  # a verification's first looks fit after it
        if seconds == 0.0 or (opts.budget.trials is None and seconds is None):
            break
        slices += 1
        before = len(p.outcome.trials)
        with ledger.stage("search trials"):
            p.outcome = search(run, p, opts, replace(p.config, seconds=seconds, seed=p.config.seed + slices))
        if len(p.outcome.trials) == before:
            break  # the study has nothing left to try
    run.conclude(p.outcome)
    if not opts.shared:
        return ()
    closed = workers.close(p.outcome, p.config, run.cost, p.bench.scorer(p.judges.screen), ledger, keep=0.0)
    ledger.say(closed.describe())
    return (closed,)


def search(run: Anytime, p: Prepared, opts: Options, config: SearchConfig, queued_only: int | None = None,
           stop: Callable[[], bool] | None = None) -> SearchOutcome:
    """One slice of the study (config.seconds long; `stop()` asked after every trial may end it
    sooner), scored by the judges' screen on the anytime run's cost model, a trial failed when its
    scoring outlasts the slice (ledger.time_limit: one plan's proxy pass took a minute on an
    encoder); the best screened plan so far on disk (best_plan.json) after every trial."""
    end = None if config.seconds is None else RunLedger.clock() + config.seconds
    score = p.bench.scorer(p.judges.screen)

    def limited(plan: Plan) -> Any:
        left = None if end is None else max(end - RunLedger.clock(), MIN_TRIAL_S)
        with RunLedger.time_limit(left, "scoring this plan on the screen"):
            return score(plan)

    def on_trial(r: Any, outcome: SearchOutcome) -> None:
        p.outcome = outcome  # an interrupt in the next trial keeps this one
        p.time_plan.observe_machine()  # has another process taken the CPU since?
        if outcome.best is r:
            plan_from_params(p.bench.groups, r.params, run.cost.fusion_pays, trial=r.number,
                             predicted_ms=r.predicted_ms, drop=r.drop).save(opts.out_dir / "best_plan.json")

    return run_search(p.bench.groups, run.cost, limited, config, layer_sqnr=p.meas.sqnr, on_trial=on_trial,
                      progress=opts.progress, queued_only=queued_only, stop=stop)


def _finish(p: Prepared, opts: Options, ledger: RunLedger, closed: tuple[StudyClosed, ...],
            stop: Interrupted | None) -> OptimizeResult:
    """The incumbent applied and its comparison completed (not after an interrupt), the run files,
    the model and the report written."""
    run = p.anytime
    outcome = p.outcome or run_search(p.bench.groups, run.cost, p.bench.scorer(p.judges.screen),
                                      replace(p.config, trials=0), progress=False)
    decisions = _notes(p.notes, run) + list(closed) + run.decisions
    if stop is not None:
        decisions.append(RunInterrupted(stop.name, ledger.elapsed(), _words(run.incumbent, p.bench)))
    with ledger.stage("final measurement"):
        final = finalize(p.bench, run.incumbent, decisions, p.meas, run.cost, p.base, ledger,
                         measured=run.measured_plans(), extend=stop is None)
        record_final(p.rcache, p.base, p.work, ledger.stage_seconds()["final measurement"], final.rounds)
        context = replace(p.context, anchors=list(run.anchors))
        write(opts.out_dir / "context.json", context)
        write_state(opts.out_dir, p.config.study_name, run)
        summary = run_summary(final, outcome, p.meas, context, p.model, ledger, p.time_plan.planned,
                              {a: s - p.fits.get(a, 0.0) for a, s in algorithm_seconds().items()}, p.base.bf16_us,
                              deploy(final.plan, p.model, opts.target, str(opts.out_dir)),
                              curve=run.curve, interrupted=stop.name if stop else "")
        shipped = write_outputs(opts.out_dir, final, summary, outcome, p.model)
    ledger.say(result_line(summary, shipped, opts.out_dir))
    from autoao.reports import render  # lazy: jinja2 and matplotlib load only here

    return OptimizeResult(p.model, shipped, summary, pareto_rows(outcome), outcome.study, opts.out_dir,
                          report_path=render(opts.out_dir))


def _notes(notes: tuple[Any, ...], run: Anytime) -> list[Any]:
    """The early notes; the time plan's word that the budget was too short stands only if nothing
    was verified after all."""
    verified = any(isinstance(d, Verified) for d in run.decisions)
    return [d for d in notes if not (verified and isinstance(d, NothingToTry))]


def _kept(result: OptimizeResult) -> str:
    """What an interrupted run wrote, in one line."""
    s = result.summary
    if not result.plan.layers:
        return f"the model as it came (no plan verified yet); run files in {result.out_dir}/"
    return (f"{result.plan.words()}, {s.speedup.measured or s.speedup.predicted:.2f}x, verified at "
            f"{s.curve[-1].seconds:.0f} s; plan.json and the report in {result.out_dir}/")


def _words(inc: Incumbent, bench: ModelBench) -> str:
    return plan_from_params(bench.groups, inc.params).words() if inc.params else "the model as it came"


def timing_table(model: nn.Module, work: Inputs, opts: Options, engine: Target, results: ResultCache,
                 time_plan: TimePlan, ledger: RunLedger) -> tuple[LatencyTable, TimingHealth]:
    """Every candidate's cells, timed here (in `results`' timing cache); for a target priced from
    weight bytes (Target.pricing: FromBytes) only the unchanged layers are timed, and every other
    cell is estimated from them."""
    cands, pricing = list(opts.candidates), engine.pricing
    timed = [c for c in cands if c.name == BASELINE] if isinstance(pricing, FromBytes) else cands
    table, health = time_candidates(work, timed, cache=TimingCache(results.path), ledger=ledger,
                                    deadline=time_plan.deadline("kernel timing"), allow_emulated=opts.allow_emulated,
                                    model=model, results=results)
    if not isinstance(pricing, FromBytes):
        return table, health
    ledger.say(f"{engine.engine}'s layer costs: {pricing.reason}")
    return estimated_cells(table, work, cands, engine.weight_bytes, pricing), health


def siblings(work: Inputs, engine: Target) -> list[tuple[str, ...]]:
    """The layer groups that take one choice (Target.choice_groups): the groups the target's engine
    fuses (vLLM's qkv_proj, gate_up_proj), which must share one scheme there, and where autoao's
    fusion runs in the engine the workload's siblings (same input), a layer in both keeping the
    engine's group."""
    return engine.choice_groups([lay.fqn for lay in work.prof.layers], list(work.siblings))


def too_short(time_plan: TimePlan, ledger: RunLedger) -> tuple[NothingToTry, ...]:
    """The decision that the time budget cannot hold a search, said now (the run goes on with what
    the timing cache and the trials that still fit allow)."""
    short = time_plan.shortfall()
    if short is None:
        return ()
    note = NothingToTry(0, "profile and baselines", short[0], math.ceil(short[2] / 30) * 30, short[1])
    ledger.say(note.warning())
    return (note,)


def tier2_judge(opts: Options, model: nn.Module, cache: ResultCache) -> Judge | None:
    """The judge of the user's tasks or metric (None: the proxy decides), as registered
    (evaluators.judge). A metric is scored on the model as it came right away: a broken one fails
    before anything is measured."""
    return deciding_judge(opts.accuracy, JudgeContext(opts.tokenizer, model, cache, opts.seed))


def search_config(opts: Options, hooks: RunHooks, judges: Judges, groups: list[Group], cost: Any,
                  time_plan: TimePlan) -> SearchConfig:
    """The search's configuration, built once: one study per (model weights, search space,
    accuracy budget), so the same run continues it and a different one starts its own. A shared
    study's deadline is the run's budget less the end's reserve (workers stop starting trials)."""
    name = hooks.study_name or "autoao-" + digest([(g.name, g.choices) for g in groups], judges.budget.max_drop,
                                                   judges.weights_key)[:12]
    left = time_plan.ledger.remaining()
    shared = dict(role="coordinator", worker=workers.label("coordinator"), heartbeat=hooks.heartbeat,
                  deadline=None if left is None else time_plan.ledger.wall_time(max(left - time_plan.final_reserve(), 1.0))
                  ) if opts.shared else {}
    return SearchConfig(judges.budget, trials=opts.budget.trials, seed=opts.seed, storage=opts.storage,
                        study_name=name, **shared)


def result_line(summary: RunSummary, plan: Plan, out_dir: Path) -> str:
    """The run's last console line: the plan, its speed-up with its interval, its verdict."""
    verdict = summary.verdict
    said = verdict.describe() if verdict is not None else "the model as it came (no verdict needed)"
    return f"plan: {plan.summary() or 'unchanged'}; {speed_line(summary)}; accuracy {said}; written to {out_dir}/"


def speed_line(summary: RunSummary) -> str:
    """The plan's speed as the run knows it: measured against the model as it came (with the user's
    workload, where given), or estimated where nothing could be measured."""
    s = summary
    if s.speedup.measured is None:
        return (f"estimated {s.speedup.predicted:.2f}x from weight bytes ({s.baseline_ms.predicted:.2f} -> "
                f"{s.plan_ms.predicted:.2f} ms predicted, not measured)")
    line = (f"{s.baseline_ms.measured:.2f} -> {s.plan_ms.measured:.2f} ms measured, {s.speedup.measured:.2f}x (at least "
            f"{s.speedup_bound:.2f}x, {s.rounds} interleaved rounds), predicted {s.speedup.predicted:.2f}x")
    w = s.workload
    return line if w is None else (f"{line}; your workload {w.baseline_ms:.1f} -> {w.plan_ms:.1f} ms, {w.speedup:.2f}x "
                                   f"(at least {w.bound:.2f}x, {w.rounds} rounds)")
