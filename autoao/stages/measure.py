"""Stage 2: what the model as it came costs, and every candidate's cost (the judges of accuracy,
built between the two, are autoao.stages.judges').

    base = measure_baselines(model, work, cache=..., ledger=...)       -> Baselines
    table, health = time_candidates(work, cands, cache=..., deadline=..., model=model, results=...)
    meas = measure(model, work, cands, table, base, health, ...)       -> Measurements

Everything here is measured once and handed on frozen; the later stages read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from autoao.budget import Costs
from autoao.common import BASELINE, call_model
from autoao.cost import CostModel, layer_calls
from autoao.evaluators.cache import ResultCache, Timing, TimingCache, weights_key
from autoao.evaluators.order import workload_weight
from autoao.evaluators.sensitivity import layer_errors
from autoao.evaluators.timing import (NOT_TIMED, LatencyRow, LatencyTable, default_mode, measure_latencies,
                                      measure_model, spot_check)
from autoao.ledger import RunLedger
from autoao.profile import ModelProfile
from autoao.records import TimingHealth
from autoao.search_space import Candidate
from autoao.stages.inputs import Inputs
from autoao.stages.judges import Judges
from autoao.types import FromBytes, LayerSpec

E2E_SHARE = 0.1  # of a time budget left: at most this for the unchanged model's first measurement
Allowed = Callable[[Candidate, LayerSpec], "str | None"]  # a serving target's rule: None, or why not


##### the model as it came ######################################################################

@dataclass(frozen=True)
class Baselines:
    """The model as it came, measured before any kernel is timed."""

    bf16_us: float  # the unchanged model, end to end
    e2e_seconds: float  # what that one measurement cost (its compiles included)
    compile: bool  # end-to-end measurements compile the model (as timing compiled layers)
    weights_key: str  # the model's weights, for result-cache keys
    # compiled only, from earlier runs of this model on this device (0: none): the longest first
    # measurement (a cold compile cache's) and the last final comparison's seconds
    cold_seconds: float = 0.0
    final_seen: float = 0.0
    # compiled only: the unchanged model compiled and captured again, inductor's caches warm (what
    # a verification's measurement costs for the plan's side; 0: not measured)
    warm_seconds: float = 0.0
    # that capture: the unchanged model's workload as CUDA-graph replays (captured), the baseline
    # side of every verification's measurement (its graphs read the original weights and the
    # examples, which the run keeps; empty: not compiled)
    replays: tuple[Callable[[], None], ...] = field(default=(), compare=False, repr=False)
    workload_s: float = 0.0  # one warm call of the user's workload on the unchanged model (0: none given)
    # its first call: a loop that compiles itself pays that once per model (transformers' generate()
    # with a static cache on CUDA: 15 s, against 0.23 s warm; docs/measuring.md#end-to-end-on-a-gpu)
    workload_cold_s: float = 0.0


def measure_baselines(model: nn.Module, work: Inputs, *, cache: ResultCache, ledger: RunLedger,
                      workload: Callable[[nn.Module], Any] | None = None) -> Baselines:
    """The unchanged model end to end (the cost model's rest). Compiled on CUDA, as per-layer timing
    ran its layers (kernels whose speed comes from inductor's fusion measure ~2x slower eagerly),
    then compiled again on warm caches and captured (`replays`: every verification's baseline side;
    its seconds, `warm_seconds`, price a verification's plan side). With the user's `workload`, two
    calls of it (the first may compile), to price the final comparison's warm-ups and rounds."""
    compile = default_mode(work.device) == "compile"
    ledger.say("the unchanged model end to end")
    t0 = time.perf_counter()
    if compile:
        bf16_us = measure_examples(model, work.examples, compile=True)
    else:
        # The profiling pass just ran every example, so the model is warm. This number only sets the
        # cost model's rest (the final comparison measures both sides again, interleaved): when
        # E2E_SHARE of the budget left cannot hold three runs, one run of each example.
        remaining = ledger.remaining()
        tight = remaining is not None and E2E_SHARE * remaining < 3 * work.prof.seconds
        bf16_us = measure_examples(model, work.examples, warmup=0, reps=1 if tight else None,
                                   max_seconds=0.0 if tight else 3.0)
    e2e = time.perf_counter() - t0
    warm, replays = 0.0, []
    if compile:
        t0 = time.perf_counter()
        torch._dynamo.reset()
        try:
            replays = captured(torch.compile(model), work.examples)
            warm = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - then each measurement compiles both sides, priced cold
            ledger.say(f"the unchanged model could not be captured again ({type(e).__name__}: {e}); "
                       "each measurement compiles it")
    weights = weights_key(model)
    seen = compiled_costs(cache, weights, work, e2e) if compile else {}
    cold_run = warm_run = 0.0
    if workload is not None:
        ledger.say("your workload, twice, on the model as it came")
        cold_run, warm_run = run_seconds(model, workload), run_seconds(model, workload)
    return Baselines(bf16_us, e2e, compile, weights, seen.get("cold_seconds", 0.0), seen.get("final_seconds", 0.0),
                     warm, tuple(replays), workload_s=warm_run, workload_cold_s=cold_run)


def captured(fn: Callable[..., Any], examples: list[Any]) -> list[Callable[[], None]]:
    """The workload as CUDA-graph replays, in order: each distinct example shape compiled, warmed
    and captured once (on a side stream, as capture requires), then replayed for each example.
    Returns after the device has finished (a caller timing it times the capture)."""
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    with torch.no_grad():
        for ex in examples:
            key = describe_shapes(ex)
            if key in graphs:
                continue
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):  # compile, then warm
                    call_model(fn, ex)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call_model(fn, ex)
            graphs[key] = graph
    torch.cuda.synchronize()
    return [graphs[describe_shapes(ex)].replay for ex in examples]


def run_seconds(model: nn.Module, run: Callable[[nn.Module], Any]) -> float:
    """Wall seconds of one `run(model)` without gradients, the device's queue drained after it."""
    t0 = time.perf_counter()
    with torch.no_grad():
        run(model)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # the run may have queued GPU work
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure_examples(model: nn.Module, examples: list[Any], compile: bool = False, reps: int | None = None,
                     warmup: int = 2, max_seconds: float = 3.0) -> float:
    """Sum of end-to-end medians (us) over the examples (forward_timing)."""
    return forward_timing(model, examples, compile, reps, warmup, max_seconds)[0]


def forward_timing(model: nn.Module, examples: list[Any], compile: bool = False, reps: int | None = None,
                    warmup: int = 2, max_seconds: float = 3.0) -> tuple[float, float, float]:
    """(median, p20, p80) us of the workload: each summed over the examples' measurements;
    examples of the same shapes are timed once (a workload like "prefill 256 tokens, then 32
    decode steps" repeats one decode shape). compile: torch.compile the model for each shape,
    from a reset dynamo (static shapes; dynamo's recompile limit never reached however many plans
    are measured on one model object)."""
    seen: dict[str, Any] = {}
    for ex in examples:
        key = describe_shapes(ex)
        if key not in seen:
            if compile:
                torch._dynamo.reset()
            seen[key] = measure_model(model, ex, compile=compile, reps=reps, warmup=warmup, max_seconds=max_seconds)
    times = [seen[describe_shapes(ex)] for ex in examples]
    return (sum(t.median_us for t in times), sum(t.p20_us for t in times), sum(t.p80_us for t in times))


def describe_shapes(example: Any) -> str:
    """An example's tensor shapes and dtypes as text (examples with equal text time alike)."""
    if isinstance(example, torch.Tensor):
        return f"T{tuple(example.shape)}{example.dtype}"
    if isinstance(example, (tuple, list)):
        return "(" + ",".join(describe_shapes(e) for e in example) + ")"
    if isinstance(example, dict):
        return "{" + ",".join(f"{k}:{describe_shapes(v)}" for k, v in example.items()) + "}"
    return repr(example)


def _compiled_key(weights_key: str, work: Inputs) -> str:
    device = torch.cuda.get_device_name(work.device) if work.device.type == "cuda" else work.device.type
    return f"compiled-costs:{weights_key}:{device}:{torch.__version__}:{describe_shapes(work.examples)}"


def compiled_costs(cache: ResultCache, weights_key: str, work: Inputs, e2e_seconds: float) -> dict[str, float]:
    """What compiled measurements of this model and workload cost on this device in earlier runs:
    {"cold_seconds": the longest first measurement (this one included), "final_seconds": the last
    final comparison (absent before one ran)}; stores the first."""
    key = _compiled_key(weights_key, work)
    seen = dict(cache.get(key) or {})
    seen["cold_seconds"] = max(seen.get("cold_seconds", 0.0), e2e_seconds)
    cache.put(key, seen)
    return seen


def record_final(cache: ResultCache, base: Baselines, work: Inputs, seconds: float, rounds: int) -> None:
    """Remember what this run's compiled final comparison took, for the next run's reserve; an
    unchanged model (0 rounds) measured nothing and leaves the last comparison's seconds as they were."""
    if base.compile and rounds:
        key = _compiled_key(base.weights_key, work)
        cache.put(key, {**(cache.get(key) or {}), "final_seconds": seconds})


def measure_seconds(base: Baselines, rounds: int) -> float:
    """What a verification's end-to-end measurement of `rounds` interleaved rounds costs. Compiled:
    the unchanged model's side replays the graphs the baselines captured (`replays`), the plan's
    is compiled and captured (bench.graph_rounds) with inductor's caches warm (the kernels outside
    the linear layers compiled for the unchanged model; autoao's kernels are not inductor's), so it
    costs what capturing the unchanged model again cost (`warm_seconds`), and no less than the last
    final comparison of this model here took; not captured, both sides at the first, cold
    measurement's seconds. On the CPU the plan's warm-up and the rounds, each run at most as long as
    the unchanged model's. With the user's workload, its warm-ups (the plan's as long as the first
    call was: it may compile) and as many rounds of it."""
    workload = max(base.workload_cold_s, base.workload_s) + (1 + 2 * rounds) * base.workload_s
    if base.compile:
        sides = base.warm_seconds if base.replays else base.e2e_seconds
        return max(sides, base.final_seen) + workload
    return (1 + 2 * rounds) * base.bf16_us / 1e6 + workload


def costs(base: Baselines, judges: Judges, measure_s: float) -> Costs:
    """What the time plan prices the run's repeated steps at (`measure_s`: a verification's
    measurement, measure_seconds)."""
    return Costs(judges.proxy_s, judges.check_s, measure_s, base.bf16_us / 1e6, judges.once_s, first_s=judges.first_s)


##### every candidate ###########################################################################

@dataclass(frozen=True)
class Measurements:
    """Everything the search and the final choice read about the candidates, measured once."""

    table: LatencyTable
    cost: CostModel
    choices: dict[str, list[str]]  # FQN -> candidate names the search may pick
    excluded: dict[str, dict[str, str]]  # FQN -> candidate -> why it may not
    sqnr: dict[str, dict[str, float]]  # tier 0: FQN -> candidate -> layer output SQNR (dB)
    health: TimingHealth


def probe_errors(model: nn.Module, work: Inputs, cands: list[Candidate], cache: ResultCache | None,
                 deadline: float | None) -> dict[str, float]:
    """Candidate name -> its layer error (tier 0, SQNR dB) on the workload's heaviest layer (calls x
    M x N x K): a prior on its accuracy for the order of the timing work, read before any cell is
    timed. Kept in `cache` under the layer-errors stage's keys, which reads it back."""
    calls = work.shape_calls()
    sampled = [lay for lay in work.prof.layers if lay.stats.sample is not None and lay.stats.sample.shape[0] > 0]
    if not sampled:
        return {}
    heaviest = max(sampled, key=lambda lay: workload_weight(lay.out_features, lay.in_features, work.tokens, calls))
    errors = layer_errors(model, replace(work.prof, layers=[heaviest]), cands, cache=cache, progress=False,
                          deadline=deadline)
    return errors.get(heaviest.fqn, {})


def time_candidates(work: Inputs, cands: list[Candidate], *, cache: TimingCache, ledger: RunLedger,
                    deadline: float | None, allow_emulated: bool = False, model: nn.Module | None = None,
                    results: ResultCache | None = None) -> tuple[LatencyTable, TimingHealth]:
    """Every pickable candidate on every layer shape at every token count, and the candidates that
    fuse on the sibling groups' shapes, in one work list by `deadline` (measure_latencies): every
    cell coarsely first, the heaviest in the workload first, then refined in that order while time
    is left; cells not reached stay NOT_TIMED (layer_choices excludes them, saying so). Emulated
    candidates are not timed unless allowed (their reference paths are the slowest to time;
    `autoao kernels` times them). First, a few cached cells are re-timed: a cache measured on a
    busy machine is found and measured again. With `model`, each candidate's layer error on the
    workload's heaviest layer (probe_errors, kept in `results`) orders the cells too."""
    pickable = [c for c in cands if allow_emulated or not c.emulated(work.device)]
    check = spot_check(work.shapes, work.tokens, device=work.device, dtype=work.dtype, cache=cache)
    if check.stale:
        ledger.say(check.message())
    table = measure_latencies(work.shapes, work.tokens, pickable, device=work.device, dtype=work.dtype, cache=cache,
                              progress=ledger.progress, calls=work.shape_calls(), deadline=deadline,
                              extra=(work.fused_shapes, [c for c in pickable if c.fusable]),
                              errors=probe_errors(model, work, pickable, results, deadline) if model is not None else None)
    timings = [r.timing for r in table.rows]
    health = TimingHealth(check.message() if check.stale else "", len(timings), sum(not t.reliable for t in timings),
                          sum(t.discarded for t in timings), sum(t.error == NOT_TIMED for t in timings))
    if health.not_timed:
        ledger.say(f"{health.not_timed} of {health.cells} cells not timed within the budget: those layers keep "
                   "fewer candidates")
    coarse = sum(t.coarse for t in timings)
    if coarse:
        ledger.say(f"{coarse} of {health.cells} cells timed coarsely only (a later run with time refines them)")
    return table, health


def estimated_cells(table: LatencyTable, work: Inputs, cands: list[Candidate],
                    weight_bytes: Callable[[Candidate | None, LayerSpec], int | None], pricing: FromBytes) -> LatencyTable:
    """`table` (the unchanged layers' cells, timed) with a cell for every other candidate on every
    layer shape, flagged as emulated with `pricing.reason` so that it is never reported as a measured speed-up.
    A one-token call reads each weight once: its cell is the unchanged cell scaled by the
    candidate's weight bytes over the unchanged layer's (weight_bytes(None, layer)). A call of more
    tokens is bound by compute, not bytes: its cell keeps the unchanged time, so no gain is claimed
    there (in llama.cpp a 256-token prefill of the demo took 437 ms in BF16, 415 ms in Q8_0 and
    834 ms in Q4_1 on a 2-core CPU). A candidate that does not run on the shape, or whose unchanged
    cell failed, gets a failed cell saying why."""
    specs = {(lay.in_features, lay.out_features): lay.spec for lay in work.prof.layers}
    rows = list(table.rows)
    for (k, n), spec in specs.items():
        base_bytes = weight_bytes(None, spec)
        for c in (c for c in cands if c.name != BASELINE):
            unsupported = c.supports(spec, work.device)
            for m in work.tokens:
                t = table.find(BASELINE, m, k, n)
                r = (weight_bytes(c, spec) or 0) / base_bytes if m == 1 and base_bytes else 1.0
                if unsupported or t is None or not t.ok:
                    cell = Timing.failed(unsupported or "the unchanged layer was not timed")
                else:
                    cell = replace(t, median_us=t.median_us * r, p20_us=t.p20_us * r, p80_us=t.p80_us * r,
                                   single_us=None if t.single_us is None else t.single_us * r, kernel=None,
                                   emulated=pricing.reason)
                rows.append(LatencyRow(c.name, m, k, n, cell, cached=False))
    return LatencyTable(table.device, table.dtype, table.mode, rows, table.measured, table.seconds,
                        table.kernel_timings, table.seconds_by_kernel)


def measure(model: nn.Module, work: Inputs, cands: list[Candidate], table: LatencyTable, base: Baselines,
            health: TimingHealth, *, cache: ResultCache, ledger: RunLedger, deadline: float | None,
            allow_emulated: bool = False, allowed: Allowed | None = None) -> Measurements:
    """The cost model (layer timings plus the rest of the unchanged model's time), what each layer
    may pick, and the layer errors (tier 0) of those candidates, by `deadline` (past it only cached
    errors are read: the search then starts from fewer greedy seeds). `allowed(candidate, layer)`:
    None, or why the plan's target cannot run the candidate on the layer."""
    cost = CostModel.build(work.prof, table).with_rest_from(base.bf16_us)
    choices, excluded = layer_choices(work.prof, cands, table, work.device, allow_emulated, allowed)
    used = [c for c in cands if any(c.name in ch for ch in choices.values())]
    ledger.say("measuring layer errors (tier 0)")
    sqnr = layer_errors(model, work.prof, used, cache=cache, progress=ledger.progress, deadline=deadline)
    return Measurements(table, cost, choices, excluded, sqnr, health)


def layer_choices(prof: ModelProfile, cands: list[Candidate], table: LatencyTable, device: torch.device,
                  allow_emulated: bool, allowed: Allowed | None = None
                  ) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """FQN -> candidate names the search may pick; and FQN -> candidate -> why it may not (it does
    not run here, the plan's target cannot run it there, or its timing failed)."""
    choices: dict[str, list[str]] = {}
    excluded: dict[str, dict[str, str]] = {}
    calls = layer_calls(prof)
    for lay in prof.layers:
        ok, why = [BASELINE], {}
        for c in cands:
            if c.name == BASELINE:
                continue
            reason = c.supports(lay.spec, device) or (allowed(c, lay.spec) if allowed is not None else None)
            if reason is None and c.emulated(device) and not allow_emulated:
                reason = f"emulated on {device.type}: {c.emulated(device)}"
            if reason is None:
                failed = [(m, t) for m in calls[lay.fqn]
                          if not (t := table.get(c.name, m, lay.in_features, lay.out_features)).ok]
                if failed:
                    reason = f"timing failed at M={failed[0][0]}: {failed[0][1].error}"
            if reason:
                why[c.name] = reason
            else:
                ok.append(c.name)
        choices[lay.fqn], excluded[lay.fqn] = ok, why
    return choices, excluded


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
