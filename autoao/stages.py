"""The stages `autoao.optimize` runs, each a function with a typed input and output:

    profile_workload  model + inputs                -> Workload       (layers, token counts, siblings)
    time_candidates   Workload + candidates         -> LatencyTable   (cached per-layer timings)
    measure           Workload + LatencyTable       -> Measurements   (cost model, choices, layer errors,
                                                                       proxy and tier-2 baselines)
    search            Measurements + SearchConfig   -> SearchOutcome  (the Optuna study)
    choose            SearchOutcome + Measurements  -> Choice         (the plan that holds, and why)
    finalize          Choice                        -> Final          (applied, measured against bf16)
    run_context / run_summary                       -> the typed run files the report reads

`ModelBench` is the one object that changes the model while choosing: it swaps trial modules in
and out, scores plans on the proxy and tier 2, and measures plans end to end.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import statistics
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import optuna
import torch
from torch import nn

from autoao import search_space
from autoao.calibration import Calibration
from autoao.clock import PairedSpeedup, paired_speedup
from autoao.common import BASELINE, __version__, call_model, input_numel, model_device, triton_version
from autoao.cost import CostModel, fused_shape, layer_calls, token_counts
from autoao.evaluators.cache import ResultCache, Timing, TimingCache, digest
from autoao.evaluators.sensitivity import (Accuracy, CallableEvaluator, LmEvalEvaluator, ProxyEvaluator,
                                           layer_errors, token_ids)
from autoao.evaluators.timing import (NOT_TIMED, LatencyTable, default_mode, measure_latencies, measure_model,
                                      route_timing, spot_check, workload_us)
from autoao.kernels import cpu_isa
from autoao.kernels._base import canonical_on_device
from autoao.kernels.algorithms import algorithm_seconds
from autoao.ledger import RunLedger
from autoao.plan import Plan, apply, set_module
from autoao.profile import GRID_CANDIDATE, ModelProfile, int4_grid_layers, profile
from autoao.runfiles import (AccuracyResult, AccuracySpec, AnchorRecord, CandidateRecord, Decision, DeviceInfo, FusedRecord,
                             GroupRecord, KernelTimes, LayerRecord, Latency, MeasuredPlan, ModelInfo, RunContext,
                             RunSummary, TimingHealth, UniformRow, WeightBytes, describe)
from autoao.search import Group, SearchConfig, SearchOutcome, TrialResult, make_groups, plan_from_params, run_search
from autoao.search_space import Candidate

TIER2_CHECKS = 4  # plans checked with lm-eval / the user metric, by bisection (choose_tier2)
# Where tier 2 decides, trials are feasible up to this x the budget on the proxy (the sampler's
# constraint, and the first plan tier 2 checks: choose_tier2): top-1 agreement moves more than a
# task's accuracy. SmolLM2, uniform int8_wo: agreement 1.6 points below its floor on a Xeon
# (benchmarks/results/2026-12-01-cpu/budget-xeon/5m-quiet-0/report_trials.csv, trial 4) and 4.1 on
# an EPYC (benchmarks/results/2026-12-02-epyc/search-screen/), while autoao_facts rose 1.1 points
# (benchmarks/results/2026-11-30-cpu/accuracy_table.md).
TIER1_SCREEN = 5.0
RERANK_BAND = 0.05  # without tier 2, plans predicted within 5% of the chosen one are measured (rerank)
RERANK_PLANS = 3  # at most this many, the chosen one included
RERANK_MARGIN = 0.03  # another plan replaces the chosen one only if measured > 3% faster
# Of what a time budget has left after profiling, the share kernel timing may take: the layer
# errors, the proxy, the trials and the final comparison need the rest.
TIMING_SHARE = 0.4
E2E_SHARE = 0.1  # of a time budget left: at most this for the unchanged model's first measurement
ERRORS_SHARE = 0.25  # of what is left after timing: tier-0 layer errors (they only seed the search)
# lm-eval under a time budget: the baseline and up to TIER2_EVALS - 1 checks share TIER2_SHARE of
# what is left; the document count per task is fitted from the time of the first PROBE_DOCS (all
# of a task's documents once they fit, or FULL_TASK_DOCS: the bundled autoao_facts has 372)
TIER2_SHARE = 0.3
TIER2_EVALS = 3
PROBE_DOCS = 24
FULL_TASK_DOCS = 10_000
WRITE_SECONDS = 5.0  # saving the model and rendering the report, for the budget's reserve
# Fewer token positions than this cannot judge a plan on the proxy: top-1 agreement moves in steps
# of 1/n (a decode step's one token: all or nothing)
MIN_PROXY_TOKENS = 64


##### profile ###################################################################################

@dataclass
class Workload:
    """What the model runs and what its linear layers see."""

    prof: ModelProfile
    examples: list[Any]  # the example inputs, one forward each
    eval_inputs: Any  # held-out inputs for the tier-1 proxy
    siblings: list[tuple[str, ...]]  # layers reading one input, fused where timing says so
    device: torch.device
    dtype: torch.dtype  # the layers' dtype (bf16 if any layer is)
    tokens: list[int]  # every M (rows per call) any layer saw
    notes: list[Decision] = field(default_factory=list)  # said about the inputs, shown with the final decisions

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(N, K) of every profiled layer, each once (fused groups' shapes are timed separately)."""
        return unique_shapes(self.prof)

    @property
    def fused_shapes(self) -> list[tuple[int, int]]:
        """(N, K) of every sibling group run as one module."""
        return sorted({fused_shape(self.prof, g)[::-1] for g in self.siblings})


# On a CPU shared with other work, each of torch's parallel regions waits at its barrier for a
# thread that lost its core: a bf16 576x1536 layer at M=256 took 18.8 ms on 2 threads and 0.55 ms
# on 1 next to other jobs (benchmarks/results/2026-12-01-cpu/threads-under-load/). A run whose
# smallest example is this much faster on one thread than on torch's threads runs on one.
BUSY_CPU_FACTOR = 1.5
# ... and at least this many seconds slower: a stalled barrier costs whole scheduler slices
# (milliseconds), while a tiny model's call takes tens of microseconds and a microsecond's hiccup
# makes either side 1.5x the other (the test suite's two 64 x 64 layers: 18-24 us a call on 1 or
# 2 threads, once flagged busy on a quiet machine).
BUSY_CPU_STALL_S = 1e-3


def settle_cpu_threads(model: nn.Module, example_inputs: Any) -> Decision | None:
    """On the CPU with more than one torch thread: the smallest example, called at torch's thread
    count and at one thread in turn (after one warm-up call, 3 calls each, the median of each: a
    neighbour that leaves one call alone can still stall most of them).
    When one thread is more than BUSY_CPU_FACTOR x and BUSY_CPU_STALL_S faster, torch is set to one thread (the caller
    restores its count when the run ends) and the `busy_cpu` decision says so; else None. Inputs
    that cannot be called are left for the profiler to report."""
    threads = torch.get_num_threads()
    if threads == 1 or model_device(model).type != "cpu":
        return None
    examples = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    try:
        ex = min(examples, key=input_numel)
        with torch.no_grad():
            call_model(model, ex)
            took: dict[int, list[float]] = {threads: [], 1: []}
            for _ in range(3):
                for n in (threads, 1):
                    torch.set_num_threads(n)
                    t0 = time.perf_counter()
                    call_model(model, ex)
                    took[n].append(time.perf_counter() - t0)
            best = {n: statistics.median(t) for n, t in took.items()}
    except Exception:  # noqa: BLE001 - bad inputs are the profiler's to report, with its message
        torch.set_num_threads(threads)
        return None
    if best[1] * BUSY_CPU_FACTOR < best[threads] and best[threads] - best[1] > BUSY_CPU_STALL_S:
        torch.set_num_threads(1)
        return Decision("busy_cpu", numbers={"threads": threads, "threads_ms": best[threads] * 1e3,
                                             "one_ms": best[1] * 1e3})
    torch.set_num_threads(threads)
    return None


def profile_workload(model: nn.Module, example_inputs: Any, eval_inputs: Any = None,
                     fuse_groups: bool = True) -> Workload:
    prof = profile(model, example_inputs)
    return Workload(prof, example_inputs if isinstance(example_inputs, list) else [example_inputs],
                    eval_inputs if eval_inputs is not None else example_inputs,
                    prof.siblings if fuse_groups else [], model_device(model), layer_dtype(prof), token_counts(prof))


def check_proxy_inputs(work: Workload, held_out: Callable[[], list[torch.Tensor]] | None,
                       ledger: RunLedger) -> None:
    """When the proxy would score the example inputs (no eval_inputs given) and they are token ids
    with fewer than MIN_PROXY_TOKENS positions in all (a decode step has one), too few to judge a
    plan: with `held_out` (held-out text in the model's tokenizer) the proxy scores that instead;
    either way a decision (`small_inputs`) says so."""
    inputs = work.eval_inputs if isinstance(work.eval_inputs, list) else [work.eval_inputs]
    ids = [token_ids(ex) for ex in inputs]
    if not ids or any(t is None for t in ids):
        return
    n = sum(t.numel() for t in ids)  # type: ignore[union-attr]
    if n >= MIN_PROXY_TOKENS:
        return
    text = held_out() if held_out is not None else None
    if text:
        work.eval_inputs = [t.to(work.device) for t in text]
    work.notes.append(Decision("small_inputs", numbers={"tokens": n, "held_out": sum(t.numel() for t in text or [])}))
    ledger.say(describe(work.notes[-1]))


def int4_grid_check(model: nn.Module, work: Workload, cands: list[Candidate], ledger: RunLedger) -> int:
    """How many profiled layers' weights sit on a 4-bit grid of groups of 32 (int4_grid_layers);
    said on the console when the search may pick GRID_CANDIDATE, which would measure near lossless
    on them."""
    grid = len(int4_grid_layers(model, work.prof))
    if grid and any(c.name == GRID_CANDIDATE for c in cands):
        ledger.say(f"warning: the weights of {grid} of {len(work.prof.layers)} layers sit on a 4-bit grid of groups "
                   f"of 32 (a GGUF Q4 source?): {GRID_CANDIDATE} re-quantizes that grid and will measure near "
                   "lossless on them")
    return grid


def unique_shapes(prof: ModelProfile) -> list[tuple[int, int]]:
    return sorted({(lay.out_features, lay.in_features) for lay in prof.layers})


def shape_calls(prof: ModelProfile, siblings: list[tuple[str, ...]]) -> dict[tuple[int, int], dict[int, int]]:
    """(N, K) -> {M: calls per forward, summed over the layers (and fused sibling groups) of that
    shape}: how the workload weighs each token count when timing chooses among a candidate's kernels."""
    out: dict[tuple[int, int], dict[int, int]] = {}
    calls = layer_calls(prof)
    shaped = [((lay.out_features, lay.in_features), lay.fqn) for lay in prof.layers]
    shaped += [(fused_shape(prof, g)[::-1], g[0]) for g in siblings]
    for shape_nk, fqn in shaped:
        shape = out.setdefault(shape_nk, {})
        for m, n in calls[fqn].items():
            shape[m] = shape.get(m, 0) + n
    return out


def layer_dtype(prof: ModelProfile) -> torch.dtype:
    dtypes = {lay.dtype for lay in prof.layers}
    return torch.bfloat16 if torch.bfloat16 in dtypes or not dtypes else next(iter(dtypes))


##### measure ###################################################################################

def time_candidates(work: Workload, cands: list[Candidate], *, cache: TimingCache, ledger: RunLedger,
                    allow_emulated: bool = False, keep: float = 0.0) -> tuple[LatencyTable, TimingHealth]:
    """Every pickable candidate on every layer shape at every token count, and the candidates that
    fuse on the sibling groups' shapes, within TIMING_SHARE of what a time budget has left after
    `keep` seconds (the cells that weigh least in the workload are left out first; the layer
    shapes and the fused shapes share that time by their cell counts). Emulated candidates can never be picked unless
    allowed, and their reference paths are the slowest to time (fp8 on the CPU: ~40x int8), so
    they are not timed (`autoao kernels` times them). First, a few cached cells are re-timed: a
    cache measured on a busy machine is found and measured again."""
    pickable = [c for c in cands if allow_emulated or not c.emulated(work.device)]
    calls = shape_calls(work.prof, work.siblings)
    check = spot_check(work.shapes, work.tokens, device=work.device, dtype=work.dtype, cache=cache)
    if check.stale:
        ledger.say(check.message())
    deadline = ledger.deadline(TIMING_SHARE, keep=keep)
    fusable = [c for c in pickable if c.fusable]
    fused_cells = len(work.fused_shapes) * len(fusable)
    if deadline is not None and fused_cells:
        now = time.perf_counter()
        main_deadline = now + (deadline - now) * (1 - fused_cells / (fused_cells + len(work.shapes) * len(pickable)))
    else:
        main_deadline = deadline
    table = measure_latencies(work.shapes, work.tokens, pickable, device=work.device, dtype=work.dtype,
                              cache=cache, progress=ledger.progress, calls=calls, deadline=main_deadline)
    if fused_cells:
        table = table.merged(measure_latencies(work.fused_shapes, work.tokens, fusable, device=work.device,
                                               dtype=work.dtype, cache=cache, progress=ledger.progress,
                                               calls=calls, deadline=deadline))
    timings = [r.timing for r in table.rows]
    health = TimingHealth(check.message() if check.stale else "", len(timings),
                          sum(not t.reliable for t in timings), sum(t.discarded for t in timings),
                          sum(t.error == NOT_TIMED for t in timings))
    if health.not_timed:
        ledger.say(f"{health.not_timed} of {health.cells} cells not timed within the budget: those layers keep "
                   "fewer candidates")
    return table, health


@dataclass
class Baselines:
    """The model as it came, measured before any kernel is timed: these costs come whatever plan is
    found, so a time budget knows what it must keep for them before it shares out the rest."""

    bf16_us: float  # the unchanged model, end to end
    e2e_seconds: float  # what that one measurement cost (its compiles included)
    compile: bool  # end-to-end measurements compile the model (as timing compiled layers)
    proxy: ProxyEvaluator  # tier 1, its reference outputs computed
    tier2: LmEvalEvaluator | CallableEvaluator | None  # its baseline set
    tier2_seconds: float  # what one tier-2 evaluation costs (the baseline's own time)
    weights_key: str  # the model's weights, for result-cache keys
    proxy_seconds: float = 0.0  # the proxy's reference pass: about what one trial costs
    # tier-2 checks a time budget keeps room for after the trials (1 to TIER2_CHECKS: tier2_checks)
    tier2_checks: int = 1
    # compiled only, from earlier runs of this model on this device (0: none): the longest first
    # measurement (a cold compile cache's) and the last final comparison's seconds (final_seconds)
    cold_seconds: float = 0.0
    final_seen: float = 0.0


def measure_baselines(model: nn.Module, work: Workload, tier2: LmEvalEvaluator | CallableEvaluator | None, *,
                      cache: ResultCache, ledger: RunLedger) -> Baselines:
    """The unchanged model end to end (the cost model's rest), the proxy's reference outputs
    (tier 1) and the tier-2 baseline."""
    # End-to-end measurements run the model as per-layer timing ran its layers: compiled on CUDA
    # (kernels whose speed comes from inductor's fusion measure ~2x slower eagerly).
    compile = default_mode(work.device) == "compile"
    ledger.say("the unchanged model end to end")
    t0 = ledger.elapsed()
    if compile:
        bf16_us = measure_examples(model, work.examples, compile=True)
    else:
        # The profiling pass just ran every example, so the model is warm (the demo's next prefill
        # ran within 3% of the one after). This number only sets the cost model's rest (the final
        # comparison measures both sides again, interleaved): when E2E_SHARE of the budget left
        # cannot hold three runs, one run of each example, retakes or not.
        remaining = ledger.remaining()
        tight = remaining is not None and E2E_SHARE * remaining < 3 * work.prof.seconds
        bf16_us = measure_examples(model, work.examples, warmup=0, reps=1 if tight else None,
                                   max_seconds=0.0 if tight else 3.0)
    e2e_seconds = ledger.elapsed() - t0
    weights_key = digest("model", *[t for t in model.state_dict().values()])
    seen = compiled_costs(cache, weights_key, work, e2e_seconds) if compile else {}
    ledger.say("reference outputs for the proxy (tier 1)")
    t0 = ledger.elapsed()
    # a plan that changes no layer is the reference: its proxy score is the baseline, not run again
    proxy = ProxyEvaluator(model, work.eval_inputs, cache=cache, reference_key=f"{weights_key}:{plan_key(Plan())}")
    proxy.calibrate(model)  # a plan within the model's own numerical noise is never rejected
    if proxy.noise:
        ledger.say(f"the proxy's floor: {proxy.floor:.4f} top-1 agreement ({proxy.noise} of the unchanged model)")
    proxy_seconds = ledger.elapsed() - t0
    if tier2 is not None and tier2.baseline is None:  # a user callable was scored up front
        ledger.say("baseline accuracy (tier 2)")
        if isinstance(tier2, LmEvalEvaluator) and tier2.limit is None and ledger.remaining() is not None:
            fit_lm_eval_limit(tier2, model, f"{weights_key}:{plan_key(Plan())}", ledger)
        tier2.set_baseline(model, key=f"{weights_key}:{plan_key(Plan())}")
    # what one tier-2 evaluation costs: its own time, also when the baseline came from the cache
    tier2_seconds = tier2.seconds if tier2 is not None else 0.0
    return Baselines(bf16_us, e2e_seconds, compile, proxy, tier2, tier2_seconds, weights_key, proxy_seconds,
                     tier2_checks(tier2_seconds, ledger.remaining()), seen.get("cold_seconds", 0.0),
                     seen.get("final_seconds", 0.0))


def _compiled_key(weights_key: str, work: Workload) -> str:
    device = torch.cuda.get_device_name(work.device) if work.device.type == "cuda" else work.device.type
    return f"compiled-costs:{weights_key}:{device}:{torch.__version__}:{_describe_shapes(work.examples)}"


def compiled_costs(cache: ResultCache, weights_key: str, work: Workload, e2e_seconds: float) -> dict[str, float]:
    """What compiled measurements of this model and workload cost on this device in earlier runs:
    {"cold_seconds": the longest first measurement (this one included), "final_seconds": the last
    final comparison (absent before one ran)}; stores the first."""
    key = _compiled_key(weights_key, work)
    seen = dict(cache.get(key) or {})
    seen["cold_seconds"] = max(seen.get("cold_seconds", 0.0), e2e_seconds)
    cache.put(key, seen)
    return seen


def record_final(cache: ResultCache, base: Baselines, work: Workload, final: Final, seconds: float) -> None:
    """Remember what this run's compiled final comparison took (`seconds`; one that measured a
    plan), for the next run's reserve."""
    if base.compile and final.rounds:
        key = _compiled_key(base.weights_key, work)
        cache.put(key, {**(cache.get(key) or {}), "final_seconds": seconds})


def screen_drop(max_drop: float, proxy: ProxyEvaluator) -> float:
    """Where tier 2 decides: the tier-1 drop up to which the sampler counts a trial feasible,
    TIER1_SCREEN x the budget, or x the proxy's own noise where that is larger (1 - the agreement
    the unchanged model reaches with its float32 twin: no proxy screens finer than it resolves;
    SmolLM2's is 2 points of top-1 agreement on the demo's held-out text)."""
    noise = 1.0 - proxy.baseline.get("noise_agreement", 1.0)
    return min(1.0, TIER1_SCREEN * max(max_drop, noise))


def tier2_checks(seconds: float, remaining: float | None) -> int:
    """How many tier-2 checks (of `seconds` each) the search keeps time for after its trials: as many
    as TIER2_SHARE of the `remaining` budget holds, 1 to TIER2_CHECKS (all of them for a trial
    budget). Each check halves the stretch of the Pareto front left to search, and is worth more
    than the trials it displaces: a 15-minute demo search on a 2-core EPYC ran 504 proxy trials
    and one tier-2 check of 34 s, its only one (benchmarks/results/2026-12-02-epyc/search-one-tier2-check/)."""
    if remaining is None or seconds <= 0:
        return TIER2_CHECKS
    return max(1, min(TIER2_CHECKS, int(TIER2_SHARE * remaining / seconds) - 1))


@dataclass
class Measurements:
    """Everything the search and the final choice read, measured once."""

    base: Baselines
    table: LatencyTable
    cost: CostModel
    choices: dict[str, list[str]]  # FQN -> candidate names the search may pick
    excluded: dict[str, dict[str, str]]  # FQN -> candidate -> why it may not
    sqnr: dict[str, dict[str, float]]  # tier 0: FQN -> candidate -> layer output SQNR (dB)


def measure(model: nn.Module, work: Workload, cands: list[Candidate], table: LatencyTable, base: Baselines, *,
            cache: ResultCache, ledger: RunLedger, allow_emulated: bool = False) -> Measurements:
    """The cost model (layer timings plus the rest of the unchanged model's time), what each layer
    may pick, and the layer errors (tier 0) of those candidates."""
    cost = CostModel.build(work.prof, table).with_rest_from(base.bf16_us)
    choices, excluded = layer_choices(work.prof, cands, table, work.device, allow_emulated)
    used = [c for c in cands if any(c.name in ch for ch in choices.values())]
    ledger.say("measuring layer errors (tier 0)")
    sqnr = layer_errors(model, work.prof, used, cache=cache, progress=ledger.progress,
                        deadline=ledger.deadline(ERRORS_SHARE, keep=reserve_seconds(base)))
    return Measurements(base, table, cost, choices, excluded, sqnr)


def fit_lm_eval_limit(tier2: LmEvalEvaluator, model: nn.Module, key: str, ledger: RunLedger) -> None:
    """Set `tier2.limit` (documents per task) so that the baseline and TIER2_EVALS - 1 checks take
    at most TIER2_SHARE of what is left of a time budget, from the time of the first PROBE_DOCS
    documents (which stay cached as that limit's baseline). Every task's documents when they fit."""
    tier2.limit = PROBE_DOCS
    # the evaluation's own seconds, stored with its result: a cached probe costs nothing now but
    # says what a check of a new plan will cost
    probe = tier2.measure(model, key)
    per_doc = probe["seconds"] / (PROBE_DOCS * len(tier2.tasks))
    remaining = ledger.remaining() or 0.0
    fits = int(TIER2_SHARE * remaining / TIER2_EVALS / max(per_doc, 1e-6) / len(tier2.tasks))
    if fits >= min(FULL_TASK_DOCS, max(probe.get("documents", {}).values(), default=FULL_TASK_DOCS)):
        tier2.limit = None
    else:
        # under twice the probe: the probe's documents (its baseline is measured) beat a second baseline
        tier2.limit = fits if fits >= 2 * PROBE_DOCS else PROBE_DOCS
        ledger.say(f"tier 2 on {tier2.limit} documents per task: all of them would not fit the budget "
                   f"({per_doc:.2f} s a document here)")


def layer_choices(prof: ModelProfile, cands: list[Candidate], table: LatencyTable, device: torch.device,
                  allow_emulated: bool) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """FQN -> candidate names the search may pick; and FQN -> candidate -> why it may not."""
    choices: dict[str, list[str]] = {}
    excluded: dict[str, dict[str, str]] = {}
    calls = layer_calls(prof)
    for lay in prof.layers:
        ok, why = [BASELINE], {}
        for c in cands:
            if c.name == BASELINE:
                continue
            reason = c.supports(lay.spec, device)
            if reason is None and c.emulated(device) and not allow_emulated:
                reason = f"emulated on {device.type}: {c.emulated(device)}"
            if reason is None:
                failed = [(m, t) for m in calls[lay.fqn] if not (t := table.get(c.name, m, lay.in_features,
                                                                               lay.out_features)).ok]
                if failed:
                    reason = f"timing failed at M={failed[0][0]}: {failed[0][1].error}"
            if reason:
                why[c.name] = reason
            else:
                ok.append(c.name)
        choices[lay.fqn] = ok
        excluded[lay.fqn] = why
    return choices, excluded


def measure_examples(model: nn.Module, examples: list[Any], compile: bool = False, reps: int | None = None,
                     warmup: int = 2, max_seconds: float = 3.0) -> float:
    """Sum of end-to-end medians (us) over the examples (workload_timing)."""
    return workload_timing(model, examples, compile, reps, warmup, max_seconds)[0]


def workload_timing(model: nn.Module, examples: list[Any], compile: bool = False, reps: int | None = None,
                    warmup: int = 2, max_seconds: float = 3.0) -> tuple[float, float, float]:
    """(median, p20, p80) us of the workload: each summed over the examples' measurements;
    examples of the same shapes are timed once (a workload like "prefill 256 tokens, then 32
    decode steps" repeats one decode shape).
    compile: torch.compile the model for each shape, from a reset dynamo (static shapes; dynamo's
    recompile limit never reached however many plans are measured on one model object)."""
    seen: dict[str, Timing] = {}
    for ex in examples:
        key = _describe_shapes(ex)
        if key not in seen:
            if compile:
                torch._dynamo.reset()
            seen[key] = measure_model(model, ex, compile=compile, reps=reps, warmup=warmup, max_seconds=max_seconds)
    times = [seen[_describe_shapes(ex)] for ex in examples]
    return (sum(t.median_us for t in times), sum(t.p20_us for t in times), sum(t.p80_us for t in times))


def _describe_shapes(example: Any) -> str:
    if isinstance(example, torch.Tensor):
        return f"T{tuple(example.shape)}{example.dtype}"
    if isinstance(example, (tuple, list)):
        return "(" + ",".join(_describe_shapes(e) for e in example) + ")"
    if isinstance(example, dict):
        return "{" + ",".join(f"{k}:{_describe_shapes(v)}" for k, v in example.items()) + "}"
    return repr(example)


def plan_key(plan: Plan) -> str:
    """A plan's result-cache key: its candidates, and where it names them its kernels and fusions
    (a kernel's rounding moves a task's score: benchmarks/results/2026-12-02-epyc/kernels-move-accuracy/)."""
    layers = sorted((f, c.name) for f, c in plan.layers.items())
    if not plan.kernels and not plan.fusions:
        return digest(layers)
    return digest(layers, sorted(plan.kernels.items()), sorted(plan.fusions))


##### the model under test ######################################################################

class ModelBench:
    """Switches the model between plans by swapping modules, building each (layer, candidate)
    module once (trials revisit the same choices; rebuilding would dominate a CPU search), and
    scores or measures the plan in place. `restore()` puts the original modules back."""

    def __init__(self, model: nn.Module, work: Workload, meas: Measurements, groups: list[Group]) -> None:
        self.model, self.work, self.meas, self.groups = model, work, meas, groups
        self.original = {lay.fqn: model.get_submodule(lay.fqn) for lay in work.prof.layers}
        self.calibration: Calibration = work.prof.calibration
        self.bank: dict[tuple[str, str], nn.Module] = {}
        self.current: dict[str, str] = {}

    def set(self, plan: Plan) -> None:
        """Swap in the plan's trial modules (unfused, default kernels: as the search scores them)."""
        for fqn, orig in self.original.items():
            cand = plan.layers.get(fqn)
            name = cand.name if cand is not None else BASELINE
            if self.current.get(fqn, BASELINE) == name:
                continue
            if cand is None:
                module = orig
            else:
                if (fqn, name) not in self.bank:
                    with torch.no_grad(), canonical_on_device():  # trial modules are never saved
                        self.bank[(fqn, name)] = cand.build(orig, self.calibration[fqn], fqn=fqn)
                module = self.bank[(fqn, name)]
            set_module(self.model, fqn, module)
            self.current[fqn] = name

    def restore(self) -> None:
        """The original modules back in every profiled layer, whatever put others there."""
        for fqn, orig in self.original.items():
            set_module(self.model, fqn, orig)
        self.current = {}

    def install(self, modules: dict[str, nn.Module]) -> None:
        """The original modules, then `modules` (FQN -> module, e.g. an applied plan's) in place."""
        self.restore()
        for fqn, module in modules.items():
            set_module(self.model, fqn, module)

    def proxy(self, plan: Plan) -> Accuracy:
        """Tier 1 of a plan; a plan that fails to apply scores -inf (that trial fails, not the search)."""
        try:
            self.set(plan)
        except Exception as e:  # noqa: BLE001 - a candidate failing on a layer fails this trial only
            return Accuracy(1, -math.inf, math.inf, {}, f"plan failed to apply: {type(e).__name__}: {e}")
        return self.meas.base.proxy(self.model, key=f"{self.meas.base.weights_key}:{plan_key(plan)}")

    def tier2(self, plan: Plan) -> Accuracy:
        """Tier 2 of the plan as it would ship (fused groups, each layer's timed kernels: kernels
        round differently, and a task's score moves with it), applied fresh and undone after."""
        assert self.meas.base.tier2 is not None
        params = {g.name: plan.layers[g.fqns[0]].name if g.fqns[0] in plan.layers else BASELINE for g in self.groups}
        shipped = self.shipped(params)
        with self.applied(shipped):
            return self.meas.base.tier2(self.model, key=f"{self.meas.base.weights_key}:{plan_key(shipped)}")

    def shipped(self, params: dict[str, str], **metadata: Any) -> Plan:
        """The plan these search params make, as it ships: fused groups, the timed kernel per layer."""
        searched = plan_from_params(self.groups, params, self.meas.cost.fusion_pays)
        return Plan.for_model(self.model, searched.layers, kernels_for(searched, self.work.prof, self.meas.table),
                              searched.fusions, **metadata)

    def measure(self, params: dict[str, str]) -> float:
        """End-to-end us of the plan these params make, applied as it would ship; inf if it cannot
        be applied or run (then it is not chosen). The model is restored afterwards."""
        with self.applied(self.shipped(params)):
            return measure_examples(self.model, self.work.examples, compile=self.meas.base.compile)

    @contextlib.contextmanager
    def applied(self, plan: Plan) -> Iterator[nn.Module]:
        """The model with `plan` applied afresh as it ships (measured or scored, then undone: no
        host copy of its weights is kept); the original modules are back afterwards, also on error."""
        self.restore()
        try:
            with canonical_on_device():
                apply(self.model, plan, calibration=self.calibration)
            yield self.model
        finally:
            self.restore()


def kernels_for(plan: Plan, prof: ModelProfile, table: LatencyTable) -> dict[str, str]:
    """FQN -> the CUDA kernel timing chose for the layer's candidate and shape (where it had a
    choice); the members of a fusion get the one chosen for the fused shape."""
    shapes = {lay.fqn: (lay.in_features, lay.out_features) for lay in prof.layers}
    for group in plan.fusions:
        shape = fused_shape(prof, group)
        shapes.update({f: shape for f in group})
    chosen = {fqn: table.kernel_for(c.name, *shapes[fqn]) for fqn, c in plan.layers.items() if fqn in shapes}
    return {fqn: kern for fqn, kern in chosen.items() if kern is not None}


##### anchoring the cost model on uniform plans ################################################

# On the CPU the cells' sum misjudges how much a plan saves inside the model: SmolLM2 on a 2-core
# EPYC, uniform int4 g64 predicted 1.21x from its cells (benchmarks/results/2026-12-02-epyc/
# search-screen/, trial 5), measured 1.58x end to end; in the model its layers ran 0.91x their
# cells, bf16's 1.11x, and the rest of the workload shrank from 666 to 611 ms
# (benchmarks/results/2026-12-02-epyc/inmodel-vs-cells/). Before the search, the uniform plan
# of each candidate (fastest predicted first, while ANCHOR_SHARE of a time budget lasts) is
# measured end to end in alternation with the unchanged model, and the candidate's cells are
# scaled so that its uniform plan's predicted speed-up is the measured one; mixed plans add up the
# scaled cells. Factors are clamped to ANCHOR_FACTORS: a wider one says the measurement, not the
# cells, was off (a 5-minute demo search on that EPYC fitted 0.5 to 0.65 for int4, int8_wo and
# both int8_dyn).
# Two rounds whose paired ratios differ by more than ANCHOR_AGREE say one of them was disturbed
# (one plan's per-round ratios spread from 1.11x to 2.06x on a quiet 2-core Xeon; a neighbour's
# burst on one side makes worse): ANCHOR_ROUNDS more are taken and the median ratio kept, so one
# disturbed round cannot set a candidate's factor.
ANCHOR_SHARE = 0.15  # of what a time budget has left after kernel timing and layer errors
ANCHOR_ROUNDS = 2
ANCHOR_AGREE = 1.25
ANCHOR_FACTORS = (0.25, 4.0)


def anchor_cost(bench: ModelBench, ledger: RunLedger) -> list[AnchorRecord]:
    """Scale `bench.meas.cost`'s cells of each candidate whose uniform plan could be measured end
    to end (module comment above); its variants that run the same kernels (Candidate.timing_name)
    take the same factor. Only where end-to-end measurements run eagerly (the CPU): compiled
    measurements (CUDA) compile the model once per plan, and there the cells, CUDA-graph replays of
    the compiled layers, predict the Llama-shaped stacks within a few percent (benchmarks/NOTES.md);
    not a 1.6 ms encoder batch, whose plans measured 1.4-1.9x where the cells predicted 1.05x
    (benchmarks/results/2026-12-02-h200/real-models/). A plan that fails to apply is left out. The
    model is restored afterwards."""
    meas = bench.meas
    if meas.base.compile:
        return []
    cost = meas.cost
    names = list(dict.fromkeys(c for g in bench.groups for c in g.choices if c != BASELINE))
    timing_of = {n: search_space.get(n).timing_name for n in names}
    uniform = []
    for name in names:
        if timing_of[name] != name:  # a variant timed as another candidate: that one's factor
            continue
        params = {g.name: name if name in g.choices else BASELINE for g in bench.groups}
        plan = plan_from_params(bench.groups, params, cost.fusion_pays)
        if plan.layers:
            uniform.append((cost.predict(plan), name, params, plan))
    deadline = ledger.deadline(ANCHOR_SHARE, keep=reserve_seconds(meas.base))
    run = meas.base.bf16_us / 1e6  # one workload run; an anchor takes a warm-up and two a round
    measured: dict[str, tuple[float, Plan, int]] = {}  # name -> (speed-up, plan, rounds)
    bf16_runs: list[float] = [meas.base.bf16_us]

    def fits(rounds: int) -> bool:  # a warm-up and `rounds` rounds of two runs before the deadline
        return deadline is None or time.perf_counter() + (2 * rounds + 2) * run <= deadline

    for _, name, params, plan in sorted(uniform, key=lambda u: u[0]):
        if not fits(ANCHOR_ROUNDS):
            break
        try:
            with bench.applied(bench.shipped(params)) as model:
                applied = {fqn: model.get_submodule(fqn) for fqn in plan.layers}
                base, planned = interleaved(bench, applied, ANCHOR_ROUNDS)
                ratios = [b[0] / p[0] for b, p in zip(base, planned)]
                if max(ratios) > ANCHOR_AGREE * min(ratios) and fits(ANCHOR_ROUNDS):
                    more_base, more_planned = interleaved(bench, applied, ANCHOR_ROUNDS)
                    base, planned = base + more_base, planned + more_planned
        except Exception as e:  # noqa: BLE001 - a plan that cannot run only goes unanchored
            ledger.say(f"{name} everywhere could not be measured end to end ({type(e).__name__}: {e}): its "
                       "cells stay as timed")
            continue
        measured[name] = (statistics.median(b[0] / p[0] for b, p in zip(base, planned)), plan, len(base))
        bf16_runs += [b[0] for b in base]
    if not measured:
        return []
    # the unchanged model's every run, not the first alone, sets the rest: a VM's speed drifts (the
    # demo's bf16 workload measured 1.6 to 2.7 s at the starts of searches on one EPYC)
    cost = cost.with_rest_from(statistics.median(bf16_runs))
    whole = cost.predict(Plan())
    records: list[AnchorRecord] = []
    low, high = ANCHOR_FACTORS
    for name, (speedup, plan, rounds) in measured.items():
        changed, unchanged = cost.split(plan)
        factor = min(high, max(low, (whole / speedup - unchanged) / changed)) if changed > 0 else 1.0
        records.append(AnchorRecord(name, len(plan.layers), rounds, speedup, whole / cost.predict(plan), factor))
    factors = {n: r.factor for r in records for n in names if timing_of[n] == r.candidate}
    meas.cost = cost.scaled(factors)
    ledger.say("the cost model anchored on uniform plans measured end to end: " + "; ".join(
        f"{r.candidate} {r.measured:.2f}x (cells {r.predicted:.2f}x, scaled {r.factor:.2f})" for r in records))
    return records


##### search ####################################################################################

def search_groups(meas: Measurements, work: Workload) -> list[Group]:
    return make_groups(meas.choices, work.siblings)


def reserve_seconds(base: Baselines) -> float:
    """Seconds a time budget keeps for what runs after the trials: the trial still running when
    the search's time is up (about one proxy pass); with tier 2, `base.tier2_checks` checks
    (choose_tier2 runs more only if time is left); without, up to RERANK_PLANS plans measured end
    to end; then the final comparison."""
    checks = base.tier2_checks * base.tier2_seconds if base.tier2 is not None else RERANK_PLANS * base.e2e_seconds
    return base.proxy_seconds + checks + final_seconds(base)


def final_seconds(base: Baselines) -> float:
    """What finalize costs, then writing the model and the report. Compiled: a dropped bf16
    measurement and one round, three compiled measurements; bf16's two cost about what its first
    one did, but the plan's graph is new to inductor's cache, so it compiles as the unchanged model
    did on a cold cache (the longest first measurement seen here), and no less than the last final
    comparison of this model here took (SmolLM2 on an H200: a 22 s first measurement on a warm
    cache, 59 s cold, final comparisons of 88-100 s:
    benchmarks/results/2026-12-02-h200/final-stage/). On the CPU the plan's warm-up and MIN_ROUNDS
    interleaved runs per side (each at most as long as the unchanged model's)."""
    if base.compile:
        e2e = base.e2e_seconds
        return max(3 * e2e, 2 * e2e + base.cold_seconds, base.final_seen) + WRITE_SECONDS
    return (1 + 2 * MIN_ROUNDS) * base.bf16_us / 1e6 + WRITE_SECONDS


def search(groups: list[Group], bench: ModelBench, config: SearchConfig, ledger: RunLedger,
           on_best: Callable[[Plan], None] | None = None) -> SearchOutcome:
    """The study over `groups`, trials scored by the bench's proxy; `on_best(plan)` gets each new
    best feasible plan (so a killed run leaves it on disk)."""
    cost = bench.meas.cost

    def on_trial(r: TrialResult, outcome: SearchOutcome) -> None:
        if on_best is not None and outcome.best is r:
            on_best(plan_from_params(groups, r.params, cost.fusion_pays, trial=r.number,
                                     predicted_ms=r.predicted_us / 1e3, drop=r.drop, tier=r.tier))

    ledger.say(f"searching: {len(groups)} choices, budget {ledger.budget} "
               f"({ledger.elapsed():.0f} s spent on measurements)")
    return run_search(groups, cost, bench.proxy, config, layer_sqnr=bench.meas.sqnr, on_trial=on_trial,
                      progress=ledger.progress)


##### choose ####################################################################################

@dataclass
class Choice:
    """The plan that holds the accuracy budget on the tier the user asked for (None: none did)."""

    trial: TrialResult | None
    accuracy: Accuracy | None
    decisions: list[Decision] = field(default_factory=list)
    measured_plans: list[MeasuredPlan] = field(default_factory=list)


def choose(outcome: SearchOutcome, bench: ModelBench, max_drop: float, ledger: RunLedger) -> Choice:
    """With tier 2: `choose_tier2`. Without: the fastest feasible plan, re-ranked end to end."""
    front = sorted((r for r in outcome.pareto if r.feasible), key=lambda r: r.predicted_us)
    if not front:
        return Choice(None, None, [Decision("no_feasible_plan")])
    base = bench.meas.base
    final = final_seconds(base)

    def time_for(seconds: float) -> bool:  # another step of `seconds` still leaves the final comparison room
        left = ledger.remaining()
        return left is None or left > seconds + final

    if base.tier2 is not None:
        # the baseline's own evaluation prices a check; a check already run prices it better (a
        # quantized plan's evaluation may run slower kernels or compile for new shapes)
        return choose_tier2(outcome, bench.tier2, max_drop, ledger,
                            lambda longest: time_for(max(base.tier2_seconds, longest)))
    choice = rerank(outcome, front[0], bench.measure, ledger, lambda: time_for(base.e2e_seconds))
    t = choice.trial
    assert t is not None
    choice.accuracy = Accuracy(t.tier, t.accuracy, t.drop, {}, "proxy (tier 1)")
    return choice


def choose_tier2(outcome: SearchOutcome, tier2: Callable[[Plan], Accuracy], max_drop: float,
                 ledger: RunLedger, time_left: Callable[[float], bool] = lambda seconds: True) -> Choice:
    """The fastest plan on the search's Pareto front that holds on tier 2 (`tier2(plan)`, seconds
    each), found by bisection in at most TIER2_CHECKS checks.

    The front (predicted latency against the proxy's drop, screened or not; plans that change no
    layer left out) runs from the fastest plan, with the most proxy drop, to the unchanged model,
    which holds by definition. The first check is the fastest plan the proxy's screen admits (the
    search's `best`); each later one halves the stretch between the slowest plan known to break
    and the fastest known to hold. The proxy ranks plans but cannot say where the task's budget
    falls on the front: a small model's top-1 agreement moves with any rounding (SmolLM2 on a
    2-core EPYC: uniform int8_wo 4.1 points below its float32 floor, uniform int4 g64 36.7,
    int8_dyn 11.3; on autoao_facts int8_wo gains 1.1 points, int4 g64 loses 8, int8_dyn 3.2:
    benchmarks/results/2026-12-02-epyc/search-screen/). Where the task's drop does not grow along
    the front the plan returned still held on tier 2, though a faster one may have too. After the
    first check, another runs only while `time_left(seconds)` says the time budget has room for
    one more, `seconds` being the longest check so far (each decision records its check's seconds)."""
    front = [r for r in outcome.pareto if any(c != BASELINE for c in r.params.values())]  # fastest first
    decisions: list[Decision] = []
    if not front:
        decisions.append(Decision("tier2_none_held", None, {"checked": 0}))
        return Choice(None, None, decisions)
    keys = [tuple(sorted(r.params.items())) for r in front]
    best = tuple(sorted(outcome.best.params.items())) if outcome.best is not None else None
    start = keys.index(best) if best in keys else len(front) // 2
    lo, hi = -1, len(front)  # front[lo] broke (-1: none known), front[hi] held (len: the unchanged model)
    held: Accuracy | None = None
    checked, longest = 0, 0.0
    mid = start
    while hi - lo > 1:
        if checked == TIER2_CHECKS:
            break
        if checked and not time_left(longest):
            decisions.append(Decision("out_of_time", front[mid].number, {"checked": checked}, "more tier-2 checks"))
            break
        r = front[mid]
        checked += 1
        ledger.say(f"checking trial {r.number} on tier 2 (plan {mid + 1} of the {len(front)} on the Pareto front, "
                   "fastest first)")
        t0 = time.perf_counter()
        acc = tier2(plan_from_params(outcome.groups, r.params))
        seconds = time.perf_counter() - t0
        longest = max(longest, seconds)
        numbers = {"predicted_ms": r.predicted_us / 1e3, "drop": acc.drop, "proxy_drop": r.drop, "seconds": seconds}
        if acc.drop <= max_drop:
            hi, held = mid, acc
            decisions.append(Decision("tier2_held", r.number, numbers, acc.source))
        else:
            lo = mid
            decisions.append(Decision("tier2_rejected", r.number, numbers, acc.source))
        mid = (lo + hi) // 2
    if held is None:
        decisions.append(Decision("tier2_none_held", None, {"checked": checked}))
        return Choice(None, None, decisions)
    if hi > 0:
        decisions.append(Decision("tier2_chose_slower", front[hi].number, {
            "checked": checked, "faster": hi, "broke": sum(d.kind == "tier2_rejected" for d in decisions),
            "unchecked": hi - 1 - lo}))
    return Choice(front[hi], held, decisions)


def distinct_feasible(outcome: SearchOutcome) -> list[TrialResult]:
    """The feasible trials, fastest predicted first (then least drop), each plan once (its first
    trial: samplers revisit plans)."""
    seen: set[tuple] = set()
    out = []
    for r in sorted((r for r in outcome.trials if r.feasible), key=lambda r: (r.predicted_us, r.drop)):
        key = tuple(sorted(r.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def rerank(outcome: SearchOutcome, chosen: TrialResult, measure: Callable[[dict[str, str]], float],
           ledger: RunLedger, time_left: Callable[[], bool] = lambda: True) -> Choice:
    """The chosen plan, or a feasible plan predicted nearly as fast that runs faster end to end.

    The cost model sums per-layer times measured one layer at a time; between plans a few % apart it
    ranks only as well as that sum predicts the whole model (llama8 at M=1 on the H200: the
    searched plan, predicted 0.843 ms, ran 0.820; uniform fp8_wo, predicted 0.863, ran 0.780). So
    the distinct feasible plans predicted within RERANK_BAND of the chosen one (at most
    RERANK_PLANS, fastest predicted first, the chosen one among them) are measured
    (`measure(params)` -> us; raising = cannot be run), and the fastest replaces the chosen one if
    it is more than RERANK_MARGIN faster. Only where the proxy decides accuracy: every plan here is
    feasible on it, as the chosen one is. Skipped when `time_left()` says the time budget has no
    room for it."""
    near = [r for r in distinct_feasible(outcome)
            if r.params != chosen.params and r.predicted_us <= (1 + RERANK_BAND) * chosen.predicted_us]
    plans = [chosen, *near[:RERANK_PLANS - 1]]
    if len(plans) == 1:
        return Choice(chosen, None)
    if not time_left():
        return Choice(chosen, None, [Decision("out_of_time", chosen.number, {"plans": len(plans)},
                                              "measuring the plans predicted nearly as fast end to end")])
    ledger.say(f"measuring the {len(plans)} plans predicted within {RERANK_BAND:.0%} of the fastest end to end")
    decisions: list[Decision] = []
    times = []
    for r in plans:
        try:
            times.append(measure(r.params))
        except Exception as e:  # noqa: BLE001 - one plan failing must not lose the search's result
            decisions.append(Decision("plan_unmeasurable", r.number, reason=f"{type(e).__name__}: {e}"))
            times.append(math.inf)
    best = min(range(len(plans)), key=lambda i: times[i])
    pick = best if times[best] * (1 + RERANK_MARGIN) < times[0] else 0
    rows = [MeasuredPlan(r.number, r.predicted_us / 1e3, t / 1e3, i == pick) for i, (r, t) in enumerate(zip(plans, times))]
    if pick:
        decisions.append(Decision("rerank_chose", plans[pick].number, {
            "measured_ms": times[pick] / 1e3, "pick": chosen.number, "pick_measured_ms": times[0] / 1e3,
            "pick_predicted_ms": chosen.predicted_us / 1e3}))
    else:
        decisions.append(Decision("rerank_kept", chosen.number, {
            "measured_ms": times[0] / 1e3, "band": RERANK_BAND, "margin": RERANK_MARGIN},
            others={r.number: t / 1e3 for r, t in zip(plans[1:], times[1:])}))
    return Choice(plans[pick], None, decisions, rows)


##### finalize ##################################################################################

@dataclass
class Final:
    """The plan applied to the model, and its end-to-end time next to the unchanged model's."""

    plan: Plan
    accuracy: Accuracy | None  # None: the model is unchanged
    baseline_us: float  # bf16: median over the interleaved rounds
    plan_us: float
    speedup_range: tuple[float, float]  # lowest and highest per-round bf16 / plan ratio
    rounds: int  # interleaved (bf16, plan) measurement rounds; 0: nothing to compare (empty plan)
    speedup_bound: float  # what the plan was shown to be at least: finalize's `low` (1.0: unchanged)
    predicted_baseline_us: float
    predicted_us: float
    decisions: list[Decision]
    measured_plans: list[MeasuredPlan]


# bf16 and the plan are measured in alternation. On the CPU (whose timings move with other
# processes: the same bf16 demo workload measured 2.1 to 2.8 s in consecutive rounds on a quiet
# Xeon) rounds continue, from MIN_ROUNDS up to MAX_ROUNDS or what the time budget leaves, until
# the paired speed-up's 95% lower bound is above 1 (faster) or its estimate is not (clock.paired_speedup);
# on CUDA once (each measurement there compiles the model; the round's spread is the graph replays').
MIN_ROUNDS, MAX_ROUNDS = 3, 10


def finalize(bench: ModelBench, choice: Choice, ledger: RunLedger) -> Final:
    """Apply the chosen plan for real (fresh modules, validated) and compare it with the model as it
    came, measured in alternation. A plan not shown faster only costs accuracy: the model then stays
    unchanged (per-layer timings summed can promise a speed-up the whole model does not deliver:
    SmolLM2 at M=2048 on the H200, 2:4 everywhere predicted 1.03x, measured 0.87x). Shown faster: on
    the CPU, the 95% lower confidence bound of the rounds' paired speed-up is above 1.00x; on CUDA,
    the one round's slowest plan replays beat the fastest bf16 ones. An empty plan is the unchanged
    model: 1.00x by definition, not measured again."""
    model, meas = bench.model, bench.meas
    decisions, rows = list(bench.work.notes) + list(choice.decisions), list(choice.measured_plans)
    bench.restore()
    trial = choice.trial
    plan = bench.shipped(trial.params if trial else {}, trial=trial.number if trial else None)
    predicted_base = meas.cost.predict(Plan())
    if not plan.layers:
        if all(ch == [BASELINE] for ch in meas.choices.values()):
            not_timed = sum(r.timing.error == NOT_TIMED for r in meas.table.rows)
            decisions.append(Decision("nothing_to_try", numbers={"not_timed": not_timed}))
        elif trial is not None:  # the search's best feasible plan changes no layer
            decisions.append(Decision("best_is_unchanged", trial.number))
            plan = bench.shipped({})  # the model as it came, whichever trial found it (the decision says)
        return Final(plan, None, meas.base.bf16_us, meas.base.bf16_us, (1.0, 1.0), 0, 1.0, predicted_base,
                     predicted_base, decisions, rows)
    apply(model, plan, calibration=bench.calibration)
    applied = {fqn: model.get_submodule(fqn) for fqn in plan.layers}
    compiled = meas.base.compile
    base, planned = interleaved(bench, applied, _rounds(meas, ledger), settled=None if compiled else _settled)
    # the rounds' lowest and highest ratio, from the two sides' quantiles (one CPU sample a side:
    # its value; CUDA's one round: the graph replays' p20 and p80)
    spread = (min(b[1] / p[2] for b, p in zip(base, planned)), max(b[2] / p[1] for b, p in zip(base, planned)))
    base_us, plan_us = statistics.median(b[0] for b in base), statistics.median(p[0] for p in planned)
    paired = _paired(base, planned)
    low = spread[0] if compiled else paired.low
    accuracy = choice.accuracy
    if low <= 1.0:
        decisions.append(Decision("kept_unchanged", plan.metadata.get("trial"), {
            "plan_ms": plan_us / 1e3, "baseline_ms": base_us / 1e3, "low": spread[0], "high": spread[1],
            "rounds": len(base), **({} if compiled else {"estimate": paired.estimate, "bound": paired.low})}))
        ledger.say(describe(decisions[-1]))
        bench.restore()
        plan, accuracy = bench.shipped({}), None
        plan_us, spread, low = base_us, (1.0, 1.0), 1.0
        rows = [MeasuredPlan(r.trial, r.predicted_ms, r.measured_ms, False) for r in rows]
    return Final(plan, accuracy, base_us, plan_us, spread, len(base), low, predicted_base, meas.cost.predict(plan),
                 decisions, rows)


def _settled(base: list[tuple[float, float, float]], planned: list[tuple[float, float, float]]) -> bool:
    """Whether the CPU's rounds so far decide: after MIN_ROUNDS, the plan is shown faster (lower
    bound above 1) or not faster on average (estimate at most 1), either of which more rounds
    would rarely overturn."""
    if len(base) < MIN_ROUNDS:
        return False
    paired = _paired(base, planned)
    return paired.low > 1.0 or paired.estimate <= 1.0


def _paired(base: list[tuple[float, float, float]], planned: list[tuple[float, float, float]]) -> PairedSpeedup:
    """The rounds' paired speed-up, from each side's (median, p20, p80) us per round."""
    return paired_speedup([b[0] for b in base], [p[0] for p in planned])


def _rounds(meas: Measurements, ledger: RunLedger) -> int:
    """The most rounds that fit in what is left of a time budget (at least MIN_ROUNDS); one on CUDA."""
    if meas.base.compile:
        return 1
    remaining = ledger.remaining()
    if remaining is None:
        return MAX_ROUNDS
    run = meas.base.bf16_us / 1e6  # one workload run (the plan's warm-up, then one per side a round)
    return max(MIN_ROUNDS, min(MAX_ROUNDS, int((remaining - WRITE_SECONDS - run) / max(2 * run, 1e-3))))


def interleaved(bench: ModelBench, applied: dict[str, nn.Module], rounds: int,
                settled: Callable[[list, list], bool] | None = None,
                ) -> tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]:
    """End-to-end (median, p20, p80) us of the unchanged model and of the model with `applied` modules, measured
    A, B, A, B, ...: both see the same machine state, round by round; at most `rounds` rounds, fewer
    once `settled(base, planned)` says the rounds so far decide. Leaves `applied` in place.
    Compiled (CUDA), the unchanged model is measured once more first and that number dropped: the
    first compiled measurement after a plan was applied and taken out again read 8.6% slow on the
    H200, the next ones did not (benchmarks/results/2026-12-01-h200/gpu_check/)."""
    model, examples, compile = bench.model, bench.work.examples, bench.meas.base.compile
    if compile:
        bench.install({})
        measure_examples(model, examples, compile=True, reps=5)
        reps, warmup = 5, 2
    else:
        # the plan's fresh modules warmed once (the unchanged model's eager layers keep no state to
        # warm, and it ran the examples already); then every round takes one clean run of the
        # workload per side, so A and B alternate run by run, not block by block
        bench.install(applied)
        with torch.no_grad():
            for ex in examples:
                call_model(model, ex)
        reps, warmup = 1, 0
    base, planned = [], []
    for _ in range(rounds):
        for modules, out in (({}, base), (applied, planned)):
            bench.install(modules)
            # on the CPU one sample a side, disturbed or not (max_seconds=0; CUDA's replays ignore
            # it): a busy neighbour disturbs both sides of a round alike, and re-takes would double
            # a loaded machine's rounds
            out.append(workload_timing(model, examples, compile=compile, reps=reps, warmup=warmup, max_seconds=0.0))
        if settled is not None and settled(base, planned):
            break
    return base, planned


##### the run files #############################################################################

def run_context(model: nn.Module, work: Workload, cands: list[Candidate], meas: Measurements,
                groups: list[Group], config: SearchConfig, *, budget: str, accuracy: Any,
                command: str | None, timing: TimingHealth, left_out: dict[str, str] | None = None,
                int4_grid_layers: int = 0, anchors: list[AnchorRecord] | None = None) -> RunContext:
    """Everything the report needs that is known before the first trial (context.json). left_out:
    candidates not considered -> why (listed as "left out")."""
    calls = layer_calls(work.prof)
    layers = [_layer_record(lay, calls[lay.fqn], cands, meas, work.device) for lay in work.prof.layers]
    tier2 = meas.base.tier2
    base2 = getattr(tier2, "baseline", None)
    return RunContext(
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model=ModelInfo(type(model).__name__, sum(p.numel() for p in model.parameters()), weight_bytes(model),
                        str(work.dtype).removeprefix("torch."), len(work.prof.layers)),
        device=DeviceInfo(work.device.type, meas.table.device, meas.table.mode,
                          cpu_isa.describe_features() if work.device.type == "cpu" else ""),
        versions={"autoao": __version__, "torch": torch.__version__, "triton": triton_version(),
                  "optuna": optuna.__version__, "python": sys.version.split()[0]},
        budget=budget, max_accuracy_drop=config.max_accuracy_drop, screen_drop=config.screen_drop, seed=config.seed,
        command=command,
        accuracy=AccuracySpec(
            tier=2 if tier2 is not None else 1,
            tasks=tier2.tasks if isinstance(tier2, LmEvalEvaluator) else None,
            metric=getattr(accuracy, "__name__", None) if callable(accuracy) else None,
            baseline_tier1=dict(meas.base.proxy.baseline), proxy=meas.base.proxy.describe(),
            baseline_tier2=(base2["accuracy"] if isinstance(base2, dict) else base2),
            baseline_tier2_metrics=({f"{t}/{k}": v for t, m in base2["metrics"].items() for k, v in m.items()
                                     if not k.endswith("_stderr")} if isinstance(base2, dict) else {})),
        storage=config.storage or "", study_name=config.study_name,
        baseline_ms=Latency(meas.cost.predict(Plan()) / 1e3, meas.base.bf16_us / 1e3),
        rest_ms=meas.cost.rest_us / 1e3,
        candidates=[_candidate_record(c, layers, work.device) for c in cands]
        + [CandidateRecord(name, search_space.get(name).describe(work.device), "left out", 0, None, [why])
           for name, why in (left_out or {}).items()],
        groups=[GroupRecord(g.name, list(g.fqns), list(g.choices)) for g in groups],
        fused=[FusedRecord(list(g), {c: t for c, t in per.items() if math.isfinite(t)})
               for g, per in meas.cost.fused_us.items()],
        layers=layers, timing=timing, int4_grid_layers=int4_grid_layers, anchors=anchors or [],
    )


def _layer_record(lay: Any, calls: dict[int, int], cands: list[Candidate], meas: Measurements,
                  device: torch.device) -> LayerRecord:
    times, errors, emulated = {}, {}, []
    for c in cands:
        if c.name not in meas.cost.layer_us[lay.fqn]:  # not timed (emulated and not allowed)
            errors[c.name] = f"not timed: {c.emulated(device)} (allow_emulated=True times and allows it)"
            emulated.append(c.name)
            continue
        ts = [meas.table.get(c.name, m, lay.in_features, lay.out_features) for m in calls]
        if all(t.ok for t in ts):
            times[c.name] = meas.cost.layer_us[lay.fqn][c.name]
            if any(t.emulated for t in ts):
                emulated.append(c.name)
        else:
            errors[c.name] = next(t.error or "" for t in ts if not t.ok)
    kernels = {}
    for c in cands:
        by_kernel = meas.table.kernel_timings.get((c.name, lay.in_features, lay.out_features))
        if by_kernel:
            chosen = meas.table.kernel_for(c.name, lay.in_features, lay.out_features)
            us = {kern: workload_us(ts, calls) for kern, ts in by_kernel.items()}
            if chosen is not None and chosen not in us:  # a route: each M at its own kernel's time
                us[chosen] = workload_us({m: route_timing(by_kernel, chosen, m) for m in next(iter(by_kernel.values()))},
                                         calls)
            kernels[c.name] = KernelTimes(chosen, us)
    return LayerRecord(lay.fqn, lay.in_features, lay.out_features, lay.tokens, calls, times, errors, kernels,
                       emulated, dict(meas.sqnr.get(lay.fqn, {})), list(meas.choices[lay.fqn]),
                       dict(meas.excluded[lay.fqn]), list(lay.tied))


def _candidate_record(c: Candidate, layers: list[LayerRecord], device: torch.device) -> CandidateRecord:
    reasons = {lay.excluded.get(c.name) for lay in layers} - {None}
    n_ok = sum(c.name in lay.choices for lay in layers)
    emu = c.emulated(device)
    status = ("available" if n_ok == len(layers) else "partly available" if n_ok else
              "emulated" if emu else "unsupported")
    return CandidateRecord(c.name, c.describe(device), status, n_ok, emu, sorted(r for r in reasons if r)[:5])


def run_summary(final: Final, outcome: SearchOutcome, meas: Measurements, context: RunContext,
                model: nn.Module, ledger: RunLedger, fits_at_start: dict[str, float] | None = None) -> RunSummary:
    """What the finished run measured and decided (summary.json). fits_at_start: the calibrated
    algorithms' fit seconds (algorithm_seconds()) when the run began."""
    fits = {alg: round(sec - (fits_at_start or {}).get(alg, 0.0), 2) for alg, sec in algorithm_seconds().items()}
    plan = final.plan
    acc = final.accuracy
    return RunSummary(
        device=meas.table.device, budget=str(ledger.budget), seconds=ledger.elapsed(),
        trials=len([r for r in outcome.trials if r.state == "COMPLETE"]), stopped=outcome.stopped_because,
        baseline_ms=Latency(final.predicted_baseline_us / 1e3, final.baseline_us / 1e3),
        baseline_ms_at_start=meas.base.bf16_us / 1e3,
        plan_ms=Latency(final.predicted_us / 1e3, final.plan_us / 1e3),
        speedup=Latency(final.predicted_baseline_us / final.predicted_us, final.baseline_us / final.plan_us),
        speedup_range=list(final.speedup_range), rounds=final.rounds, speedup_bound=final.speedup_bound,
        accuracy=None if acc is None else AccuracyResult(acc.tier, acc.accuracy, acc.drop, dict(acc.metrics),
                                                         acc.source),
        max_accuracy_drop=context.max_accuracy_drop, decisions=final.decisions, storage=context.storage,
        study_name=context.study_name, seed=context.seed, command=context.command,
        weight_bytes=WeightBytes(context.model.weight_bytes, weight_bytes(model)),
        uniform=uniform_rows(outcome), measured_plans=final.measured_plans,
        plan={fqn: c.name for fqn, c in plan.layers.items()}, kernels=dict(plan.kernels),
        fusions=[list(g) for g in plan.fusions], stage_seconds=ledger.stage_seconds(),
        # the timing stage by candidate (and kernel), largest first: cache misses only (0 when warm)
        timing_seconds={label: round(sec, 2) for label, sec in
                        sorted(meas.table.seconds_by_kernel.items(), key=lambda kv: -kv[1])},
        algorithm_seconds={alg: sec for alg, sec in fits.items() if sec > 0},
    )


def uniform_rows(outcome: SearchOutcome) -> list[UniformRow]:
    """The warm-start uniform plans (one candidate wherever it applies) as the search scored them:
    what the searched plan must beat."""
    rows: list[UniformRow] = []
    for r in outcome.trials:
        names = set(r.params.values()) - {BASELINE}
        if r.state == "COMPLETE" and len(names) <= 1:
            name = next(iter(names), BASELINE)
            if not any(x.candidate == name for x in rows):
                rows.append(UniformRow(name, r.number, r.predicted_us / 1e3, r.drop, r.tier, r.feasible,
                                       sum(v == name for v in r.params.values())))
    return rows


def pareto_rows(outcome: SearchOutcome) -> list[dict[str, Any]]:
    """pareto.json: the Pareto plans with their predicted time, drop, tier and layer summary."""
    return [{"trial": r.number, "predicted_ms": r.predicted_us / 1e3, "drop": r.drop, "accuracy": r.accuracy,
             "tier": r.tier, "feasible": r.feasible, "plan": plan_from_params(outcome.groups, r.params).summary()}
            for r in outcome.pareto]


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's state (parameters and persistent buffers; quantized layers count their
    quantized tensors), each shared tensor once."""
    seen, total = set(), 0
    for t in model.state_dict().values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


##### arguments #################################################################################

def resolve_candidates(candidates: list[str | Candidate] | None) -> list[Candidate]:
    """Names or Candidates (default: every registered one), bf16 always included."""
    if candidates is None:
        return search_space.all_candidates()
    out = [search_space.get(c) if isinstance(c, str) else c for c in candidates]
    if not any(c.name == BASELINE for c in out):
        out.insert(0, search_space.get(BASELINE))
    return out


def tier2_evaluator(accuracy: Any, tokenizer: Any, limit: int | float | None,
                    cache: ResultCache) -> LmEvalEvaluator | CallableEvaluator | None:
    """None (the proxy decides), the user's callable, or lm-eval tasks (which need the tokenizer)."""
    if accuracy is None:
        return None
    if callable(accuracy):
        return CallableEvaluator(accuracy)
    tasks = [t.strip() for t in (accuracy.split(",") if isinstance(accuracy, str) else accuracy) if t.strip()]
    if tokenizer is None:
        raise ValueError(f"accuracy={tasks} are lm-eval tasks, which need the model's tokenizer: pass tokenizer=...")
    from autoao.evaluators import lmeval  # lazy: lm-eval is heavy

    lmeval.check_tasks(tasks)
    unknown = [t for t in tasks if t not in lmeval.task_names()]
    if unknown:
        import warnings

        warnings.warn(f"tasks {unknown} are not bundled with autoao; lm-eval must find their data offline",
                      stacklevel=3)
    return LmEvalEvaluator(tokenizer, tasks, limit=limit, cache=cache)


def check_storage(url: str) -> None:
    """ValueError naming the URL unless an Optuna RDB storage can be reached there (a few seconds at
    most: checked before anything is measured)."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception as e:  # noqa: BLE001 - sqlalchemy's ArgumentError and friends
        raise ValueError(f"storage {url!r} is not a database URL ({e}); e.g. sqlite:///study.db or "
                         "postgresql://user@host/db") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            parent = Path(db).expanduser().resolve().parent
            if not parent.is_dir():
                raise ValueError(f"storage {url!r}: folder {parent} does not exist")
        return
    connect_args = {"connect_timeout": 5} if parsed.get_backend_name().startswith("postgres") else {}
    try:
        engine = sqlalchemy.create_engine(parsed, connect_args=connect_args)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as e:  # noqa: BLE001 - driver missing, refused, auth: all one message
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"storage {url!r} cannot be reached: {first}") from None


def check_out_dir(out_dir: Path) -> None:
    """ValueError unless `out_dir` can be created and written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".autoao-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"output directory {out_dir} cannot be written: {e.strerror or e}") from None
