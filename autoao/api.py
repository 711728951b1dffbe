"""`autoao.optimize`: profile -> candidates -> measure -> search -> choose -> apply -> report.

    result = autoao.optimize(model, example_inputs, budget="10m", max_accuracy_drop=0.01)
    result.model, result.plan, result.summary, result.study, result.out_dir, result.report_path

The model is quantized in place (like torchao's quantize_): afterwards it carries the chosen plan.
Each step is a function of autoao.stages with a typed input and output; this module only calls them
in order and writes what they return.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from autoao import runfiles, stages, workers
from autoao.common import atomic_write, cache_dir
from autoao.evaluators.cache import ResultCache, TimingCache, digest
from autoao.evaluators.sensitivity import CallableEvaluator
from autoao.kernels.algorithms import algorithm_seconds
from autoao.ledger import RunLedger
from autoao.models import text_inputs
from autoao.plan import Plan, save
from autoao.runfiles import RunSummary
from autoao.search import Budget, SearchConfig
from autoao.search_space import Candidate


@dataclass
class OptimizeResult:
    """What `optimize` returns; everything is also on disk in `out_dir`."""

    model: nn.Module  # the same object that was passed in, now quantized by `plan`
    plan: Plan
    summary: RunSummary  # latencies, accuracy with its tier, decisions, stage times (summary.json)
    pareto: list[dict[str, Any]]  # the Pareto plans: trial, predicted ms, drop, tier, layer summary
    study: Any  # the optuna.Study
    out_dir: Path
    report_path: Path | None = None


def _keeps_torch_threads(fn: Callable[..., OptimizeResult]) -> Callable[..., OptimizeResult]:
    """optimize runs on one thread on a busy CPU (stages.settle_cpu_threads): when it returns or
    raises, torch's thread count is the caller's again."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> OptimizeResult:
        threads = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
    return run


@_keeps_torch_threads
def optimize(
    model: nn.Module,
    example_inputs: Any,
    *,
    budget: str | int | Budget = "5m",
    accuracy: None | str | list[str] | Callable[[nn.Module], float] = None,
    tokenizer: Any = None,
    max_accuracy_drop: float = 0.01,
    candidates: list[str | Candidate] | None = None,
    eval_inputs: Any = None,
    storage: str | None = None,
    out_dir: str | Path = "autoao-report",
    seed: int = 0,
    fuse_groups: bool = True,
    allow_emulated: bool = False,
    lm_eval_limit: int | float | None = None,
    left_out: dict[str, str] | None = None,
    progress: bool = True,
    command: str | None = None,
    spent: float = 0.0,
    study_name: str | None = None,
    heartbeat: int = workers.DEFAULT_HEARTBEAT,
    on_study: Callable[[str], Any] | None = None,
) -> OptimizeResult:
    """Find the fastest per-layer plan whose accuracy drop stays within `max_accuracy_drop`, apply
    it to `model` in place, and write plan.json, pareto.json, the study and the saved model.

    The search ranks plans by a cost model (per-layer timings summed); where the proxy decides
    accuracy, the few plans it predicts within 5% of the fastest are then applied and measured end
    to end, and the fastest measured one is returned (`summary.measured_plans`). A plan that
    measures no faster end to end than the model as it came is not applied: the model stays in
    bf16, and `summary.decisions` says so. End-to-end measurements run the model as per-layer
    timing ran its layers: torch.compile'd on CUDA (one compile per plan and input shape, counted
    in the budget), eagerly on the CPU.

    Args:
        model: any nn.Module with nn.Linear layers, on the device it will run on.
        example_inputs: what the model runs on (autoao.profile's convention: tensor, tuple of args,
            dict of kwargs, or a list of those). Layer shapes, token counts and activation statistics
            come from these, and latencies are measured at these token counts.
        budget: wall time ("90s", "10m", "1h") or a number of trials (200). Covers the whole run.
        accuracy: None: the tier-1 proxy decides (next-token accuracy / output error on
            `eval_inputs`). lm-eval task names (str or list; needs `tokenizer`) or a
            callable(model) -> float (higher is better): tier 2, checked on the Pareto plans, and
            the returned plan holds on it.
        tokenizer: the model's tokenizer, for lm-eval tasks.
        max_accuracy_drop: allowed drop in [0, 1], absolute in the accuracy's units (0.01 = 1 point).
        candidates: names or Candidates to consider (default: every registered one). bf16 is
            always included (it is the baseline).
        eval_inputs: held-out inputs for the tier-1 proxy (default: example_inputs).
        storage: Optuna RDB URL (default: SQLite in out_dir). Same storage + same model continues
            the earlier study. A database server's URL (postgresql://user@host/db) publishes the
            study for `autoao worker` processes, which run trials of it too (autoao.workers); this
            call coordinates them and alone makes the final choice.
        study_name: the study's name in `storage` (default: derived from the model's weights, the
            search space and the accuracy budget, so the same run continues it).
        heartbeat: with a database server, seconds between a running trial's heartbeats: a trial
            silent for 3x this (its process died) is failed and retried once.
        on_study: called with the study's name once it is published on a database server (the
            command line starts its local workers here).
        out_dir: where everything is written.
        seed: sampler seed; the same seed on the same measurements gives the same plan.
        fuse_groups: sibling layers that read the same input (found by the profile: q/k/v and
            gate/up projections) share one choice, and run as one kernel on their concatenated
            weights where timing of the fused shape says that is faster.
        allow_emulated: time the candidates that are only emulated on this device and let the search
            pick them (their timings are real, but not those of a fast kernel); off by default, when
            they are neither timed nor picked (`autoao kernels` still times them).
        lm_eval_limit: documents per lm-eval task (fast mode), None = all.
        left_out: candidates the caller did not pass in -> why (`autoao search` leaves out what a
            built-in model's provenance misrepresents): listed in the report as "left out".
        progress: progress bars and stage messages on stderr.
        command: the command line that started this run, recorded for the report's "reproduce".
        spent: seconds of a time budget already used before this call (`autoao search` passes its
            process's age, so the budget covers start-up and model loading too).
    """
    # every argument is checked before anything is measured
    ledger = RunLedger(Budget.parse(budget), progress, spent=spent)
    fits_at_start = algorithm_seconds()  # calibrated fits (GPTQ, ...) count from here
    config = SearchConfig(max_accuracy_drop=max_accuracy_drop, seed=seed)  # validates the drop
    out_dir = Path(out_dir)
    stages.check_out_dir(out_dir)
    cands = stages.resolve_candidates(candidates)
    config.storage = workers.driver_url(storage) if storage else f"sqlite:///{(out_dir / 'study.db').resolve()}"
    stages.check_storage(config.storage)
    shared = workers.is_server(config.storage)
    if shared and (not isinstance(heartbeat, int) or heartbeat < 1):
        raise ValueError(f"heartbeat must be a whole number of seconds >= 1, got {heartbeat!r}")
    rcache = ResultCache(cache_dir() / "timings.sqlite")
    tier2 = stages.tier2_evaluator(accuracy, tokenizer, lm_eval_limit, rcache)
    if isinstance(tier2, CallableEvaluator):
        tier2.set_baseline(model)  # the user's metric, once, on the model as it came

    # what the unchanged model costs to measure comes first: the budget left after it is shared out
    with ledger.stage("profile and baselines"):
        busy = stages.settle_cpu_threads(model, example_inputs)  # before profiling, which runs every example
        if busy is not None:
            ledger.say(runfiles.describe(busy))
        ledger.say("profiling")
        work = stages.profile_workload(model, example_inputs, eval_inputs, fuse_groups)
        if busy is not None:
            work.notes.append(busy)
        if eval_inputs is None:
            stages.check_proxy_inputs(work, None if tokenizer is None else lambda: text_inputs(
                tokenizer, seq_len=128, n_seqs=2, held_out=True), ledger)
        ledger.say(f"{len(work.prof.layers)} linear layers, token counts {work.tokens}")
        grid = stages.int4_grid_check(model, work, cands, ledger)
        base = stages.measure_baselines(model, work, tier2, cache=rcache, ledger=ledger)
        if tier2 is not None:  # the proxy screens, tier 2 decides (choose_tier2)
            config.screen_drop = stages.screen_drop(max_accuracy_drop, base.proxy)
    with ledger.stage("kernel timing and layer errors"):
        ledger.say(f"timing candidates on {work.device}")
        table, health = stages.time_candidates(work, cands, cache=TimingCache(rcache.path), ledger=ledger,
                                               allow_emulated=allow_emulated, keep=stages.reserve_seconds(base))
        meas = stages.measure(model, work, cands, table, base, cache=rcache, ledger=ledger,
                              allow_emulated=allow_emulated)
    groups = stages.search_groups(meas, work)
    bench = stages.ModelBench(model, work, meas, groups)
    with ledger.stage("cost model anchors"):
        anchors = stages.anchor_cost(bench, ledger)  # CPU: uniform plans end to end scale their cells

    # one study per (model weights, search space, budget constraint): the same run continues it,
    # a different model or constraint in the same storage starts its own
    config.study_name = study_name or "autoao-" + digest([(g.name, g.choices) for g in groups], max_accuracy_drop,
                                                         meas.base.weights_key)[:12]
    remaining = ledger.remaining()
    if remaining is None:
        config.budget = ledger.budget
    else:
        config.budget = Budget(seconds=max(remaining, 1.0))
        config.reserve_seconds = stages.reserve_seconds(base)  # the search still scores its first trial
    context = stages.run_context(model, work, cands, meas, groups, config, budget=str(ledger.budget),
                                 accuracy=accuracy, command=command, timing=health, left_out=left_out,
                                 int4_grid_layers=grid, anchors=anchors)
    runfiles.write(out_dir / "context.json", context)

    if shared:  # other processes may run trials: the budget is the study's, published with its inputs
        config.role, config.worker, config.heartbeat = "coordinator", workers.label("coordinator"), heartbeat
        if config.budget.seconds is not None:
            config.deadline = time.time() + max(config.budget.seconds - config.reserve_seconds, 1.0)
        workers.publish(config, groups, meas, model, work)
        ledger.say(f"study {config.study_name} published on {workers.shown(config.storage)}: "
                   f"autoao worker --storage URL --study {config.study_name} --model ... joins it")
        if on_study is not None:
            on_study(config.study_name)
    with ledger.stage("search trials"):
        outcome = stages.search(groups, bench, config, ledger, on_best=lambda p: p.save(out_dir / "best_plan.json"))
        closed = (workers.close(outcome, config, meas.cost, bench.proxy, ledger, keep=stages.reserve_seconds(base))
                  if shared else None)
    with ledger.stage("tier-2 checks and re-rank"):
        choice = stages.choose(outcome, bench, max_accuracy_drop, ledger)
        if closed is not None:
            ledger.say(runfiles.describe(closed))
            choice.decisions.insert(0, closed)
    with ledger.stage("final measurement"):
        t0 = time.perf_counter()
        final = stages.finalize(bench, choice, ledger)
        stages.record_final(rcache, base, work, final, time.perf_counter() - t0)
        summary = stages.run_summary(final, outcome, meas, context, model, ledger, fits_at_start)

    plan = final.plan
    plan.metadata.update({"plan_ms": runfiles.to_dict(summary.plan_ms), "speedup": runfiles.to_dict(summary.speedup),
                          "accuracy": runfiles.to_dict(summary.accuracy) if summary.accuracy else None,
                          "device": summary.device})
    plan.save(out_dir / "plan.json")
    pareto = stages.pareto_rows(outcome)
    atomic_write(out_dir / "pareto.json", lambda f: f.write(json.dumps(pareto, indent=2).encode()))
    runfiles.write(out_dir / "summary.json", summary)
    save(model, out_dir / "model")
    acc = summary.accuracy
    ledger.say(f"plan: {plan.summary() or 'unchanged'}; predicted {summary.speedup.predicted:.2f}x, measured "
               f"{summary.speedup.measured:.2f}x; accuracy drop {acc.drop if acc else 0:+.4f} "
               f"(tier {acc.tier if acc else '-'}); written to {out_dir}/")
    from autoao.reports import render  # lazy: jinja2 and matplotlib load only here

    return OptimizeResult(model, plan, summary, pareto, outcome.study, out_dir, report_path=render(out_dir))
