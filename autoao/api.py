"""`autoao.optimize`: workload -> measure -> bench -> anchors -> search -> choose -> finalize -> outputs.

    result = autoao.optimize(model, example_inputs, budget="10m", max_accuracy_drop=0.01)
    result.model, result.plan, result.summary (its .speedup, .verdict), result.report_path

The model is quantized in place (like torchao's quantize_): afterwards it carries the chosen plan.
`_run` is the list of stage calls, each a function with a typed input and output (the stage
modules say what each does); the command line calls it with its own hooks (options.RunHooks).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from autoao import workers
from autoao.anchors import Anchored, anchor_cost
from autoao.bench import ModelBench
from autoao.budget import TimePlan
from autoao.choose import choose
from autoao.common import BASELINE, cache_dir
from autoao.decisions import NothingToTry, StudyClosed
from autoao.evaluators.cache import ResultCache, TimingCache, digest
from autoao.evaluators.tier2 import LmEvalJudge, MetricJudge
from autoao.evaluators.timing import LatencyTable
from autoao.export import targets
from autoao.export.deploy import deploy
from autoao.export.targets import Target
from autoao.finalize import MIN_ROUNDS, finalize
from autoao.kernels.algorithms import algorithm_seconds
from autoao.ledger import RunLedger
from autoao.measure import (Judges, Measurements, build_judges, costs, estimated_cells, measure, measure_baselines,
                            record_final, time_candidates)
from autoao.options import Options, RunHooks
from autoao.outputs import pareto_rows, run_context, run_summary, write_outputs
from autoao.plan import Plan
from autoao.records import ParetoRow, RunSummary, TimingHealth, write
from autoao.search import Group, SearchConfig, SearchOutcome, make_groups, plan_from_params, run_search
from autoao.workload import Workload, build_workload, grid_warning, settle_cpu_threads


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
    return _run(model, example_inputs, opts, RunHooks())


@_keeps_torch_threads
def _run(model: nn.Module, example_inputs: Any, opts: Options, hooks: RunHooks) -> OptimizeResult:
    """The stages in order; `opts` checked, `hooks` the command line's."""
    ledger = RunLedger(opts.budget, opts.progress, spent=hooks.spent)
    fits, rcache = algorithm_seconds(), ResultCache(cache_dir() / "timings.sqlite")
    tier2 = tier2_judge(opts, model, rcache)  # the user's metric runs once here: a broken one costs nothing
    engine = targets.get(opts.target)
    with ledger.stage("profile and baselines"):
        busy = settle_cpu_threads(model, example_inputs)  # before profiling, which runs every example
        ledger.say("profiling")
        work = build_workload(model, example_inputs, eval_inputs=opts.eval_inputs, tokenizer=opts.tokenizer,
                              fuse_groups=opts.fuse_groups, busy=busy, seed=opts.seed,
                              screen_positions=opts.screen_positions, confirm=opts.accuracy is None)
        for note in work.notes:
            ledger.say(note.describe())
        ledger.say(grid_warning(work, list(opts.candidates)) or f"{len(work.prof.layers)} linear layers")
        base = measure_baselines(model, work, cache=rcache, ledger=ledger, workload=opts.workload)
        judges = build_judges(model, work, tier2, opts.max_accuracy_drop, cache=rcache, weights_key=base.weights_key,
                              ledger=ledger)
        # an estimated plan is not measured: no anchors, and no final rounds to keep time for
        plan = TimePlan(ledger, costs(base, judges, 0 if engine.estimate else MIN_ROUNDS),
                        skip=("anchors",) if base.compile or engine.estimate else ())
        notes = work.notes + too_short(plan, ledger)
    with ledger.stage("kernel timing"):
        table, health = timing_table(work, opts, engine, TimingCache(rcache.path), plan, ledger)
    with ledger.stage("layer errors"):
        meas = measure(model, work, list(opts.candidates), table, base, health, cache=rcache, ledger=ledger,
                       deadline=plan.deadline("layer errors"), allow_emulated=opts.allow_emulated or bool(engine.estimate),
                       allowed=engine.supports)
    groups = make_groups(meas.choices, siblings(work, engine))
    bench = ModelBench(model, work.prof, work.examples, compile=base.compile, groups=groups, cost=meas.cost,
                       table=meas.table, estimate=engine.estimate, workload=opts.workload)
    with ledger.stage("anchors"):
        anchored = anchor_cost(bench, base.bf16_us, ledger, plan.deadline("anchors"))
    config = search_config(opts, hooks, judges, groups, meas, anchored, plan)
    context = run_context(model, work, list(opts.candidates), meas, anchored.cost, groups, judges,
                          budget=str(opts.budget), seed=opts.seed, storage=config.storage or "",
                          study_name=config.study_name, command=hooks.command, bf16_us=base.bf16_us,
                          started=ledger.elapsed(), left_out=hooks.left_out, anchors=anchored.records,
                          target=opts.target, estimate=engine.estimate)
    write(opts.out_dir / "context.json", context)
    with ledger.stage("search trials"):
        outcome, closed = trials(opts, hooks, config, bench, judges, meas, anchored, work, plan, ledger)
    with ledger.stage("accuracy verdicts"):
        choice = choose(outcome, bench, judges, plan, ledger)
    with ledger.stage("final measurement"):
        final = finalize(bench, choice, meas, anchored.cost, base, notes + closed, ledger)
        record_final(rcache, base, work, ledger.stage_seconds()["final measurement"], final.rounds)
        summary = run_summary(final, outcome, meas, context, model, ledger, plan.planned,
                              {a: s - fits.get(a, 0.0) for a, s in algorithm_seconds().items()}, base.bf16_us,
                              deploy(final.plan, model, opts.target, str(opts.out_dir)))
        shipped = write_outputs(opts.out_dir, final, summary, outcome, model)
    ledger.say(result_line(summary, shipped, opts.out_dir))
    from autoao.reports import render  # lazy: jinja2 and matplotlib load only here

    return OptimizeResult(model, shipped, summary, pareto_rows(outcome), outcome.study, opts.out_dir,
                          report_path=render(opts.out_dir))


def timing_table(work: Workload, opts: Options, engine: Target, cache: TimingCache, plan: TimePlan,
                 ledger: RunLedger) -> tuple[LatencyTable, TimingHealth]:
    """Every candidate's cells, timed here; for a target priced from weight bytes (Target.estimate)
    only the unchanged layers are timed, and every other cell is estimated from them."""
    cands = list(opts.candidates)
    timed = [c for c in cands if c.name == BASELINE] if engine.estimate else cands
    table, health = time_candidates(work, timed, cache=cache, ledger=ledger, deadline=plan.deadline("kernel timing"),
                                    allow_emulated=opts.allow_emulated)
    if not engine.estimate:
        return table, health
    ledger.say(f"{engine.engine}'s layer costs: {engine.estimate}")
    return estimated_cells(table, work, cands, engine.weight_bytes, engine.estimate), health


def siblings(work: Workload, engine: Target) -> list[tuple[str, ...]]:
    """The layer groups that take one choice: the groups the target's engine fuses (vLLM's
    qkv_proj, gate_up_proj), which must share one scheme there; and for llama.cpp, which fuses none,
    nothing more; otherwise also the workload's siblings (same input, fusable in autoao's runtime),
    a layer in both keeping the engine's group."""
    shared = [g for _, g in engine.shared_groups([lay.fqn for lay in work.prof.layers])]
    if engine.format == "gguf":
        return shared
    taken = {f for g in shared for f in g}
    return shared + [g for g in work.siblings if not taken & set(g)]


def too_short(plan: TimePlan, ledger: RunLedger) -> tuple[NothingToTry, ...]:
    """The decision that the time budget cannot hold a search, said now (the run goes on with what
    the timing cache and the trials that still fit allow)."""
    short = plan.shortfall()
    if short is None:
        return ()
    note = NothingToTry(0, "profile and baselines", short[0], math.ceil(short[2] / 30) * 30, short[1])
    ledger.say(note.describe())
    return (note,)


def tier2_judge(opts: Options, model: nn.Module, cache: ResultCache) -> LmEvalJudge | MetricJudge | None:
    """The judge of the user's tasks or metric (None: the proxy decides). A metric is scored on
    the model as it came right away: a broken one fails before anything is measured."""
    if opts.accuracy is None:
        return None
    if callable(opts.accuracy):
        judge = MetricJudge(opts.accuracy)
        judge.set_baseline(model)
        return judge
    return LmEvalJudge(opts.tokenizer, list(opts.accuracy), cache=cache, seed=opts.seed)


def search_config(opts: Options, hooks: RunHooks, judges: Judges, groups: list[Group], meas: Measurements,
                  anchored: Anchored, plan: TimePlan) -> SearchConfig:
    """The search's configuration, built once: one study per (model weights, search space,
    accuracy budget), so the same run continues it and a different one starts its own."""
    name = hooks.study_name or "autoao-" + digest([(g.name, g.choices) for g in groups], judges.budget.max_drop,
                                                   judges.weights_key)[:12]
    deadline = plan.deadline("search trials")
    seconds = None if deadline is None else max(deadline - plan.ledger.clock(), 1.0)  # for Optuna's timeout
    shared = dict(role="coordinator", worker=workers.label("coordinator"), heartbeat=hooks.heartbeat,
                  deadline=None if seconds is None else plan.ledger.wall_time(seconds)) if opts.shared else {}
    return SearchConfig(judges.budget, trials=opts.budget.trials, seconds=seconds, seed=opts.seed,
                        storage=opts.storage, study_name=name, **shared)


def trials(opts: Options, hooks: RunHooks, config: SearchConfig, bench: ModelBench, judges: Judges,
           meas: Measurements, anchored: Anchored, work: Workload, plan: TimePlan, ledger: RunLedger
           ) -> tuple[SearchOutcome, tuple[StudyClosed, ...]]:
    """The study's trials, scored by the judges' screen; on a database server, published for
    `autoao worker` processes first and closed after (workers), what the close did recorded as a
    decision. The best feasible plan so far is on disk (best_plan.json) after every trial, so a
    killed run leaves it."""
    if opts.shared:
        workers.publish(config, bench.groups, anchored.cost, meas.sqnr, judges, bench.model, work)
        ledger.say(f"study {config.study_name} published on {workers.shown(config.storage)}: "
                   f"autoao worker --storage URL --study {config.study_name} --model ... joins it")
        if hooks.on_study is not None:
            hooks.on_study(config.study_name)

    def on_trial(r: Any, outcome: SearchOutcome) -> None:
        plan.observe_machine()  # has another process taken the CPU since?
        if outcome.best is r:
            plan_from_params(bench.groups, r.params, anchored.cost.fusion_pays, trial=r.number, predicted_ms=r.predicted_ms,
                             drop=r.drop).save(opts.out_dir / "best_plan.json")

    ledger.say(f"searching: {len(bench.groups)} choices, budget {ledger.budget} ({ledger.elapsed():.0f} s spent on measurements)")
    outcome = run_search(bench.groups, anchored.cost, bench.scorer(judges.screen), config, layer_sqnr=meas.sqnr,
                         on_trial=on_trial, progress=opts.progress, stop=lambda: plan.past("search trials"))
    if not opts.shared:
        return outcome, ()
    closed = workers.close(outcome, config, anchored.cost, bench.scorer(judges.screen), ledger, keep=plan.reserve())
    ledger.say(closed.describe())
    return outcome, (closed,)


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
