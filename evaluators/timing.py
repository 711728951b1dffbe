"""Latency of one candidate on one layer shape, measured the way the model will run it.

CUDA (after triton.testing.do_bench's method): warm up (Triton compiles, cuBLAS picks its
algorithm), capture the call in a CUDA graph so launch gaps do not count, then for each repeat
read a 256 MB buffer (flushes the 50-60 MB L2 with clean lines, so weights come from HBM as they
would in a real model that streams through its layers), rewrite the layer's input (it is in L2 in
the real model: the previous op just wrote it), record an event, replay, record an event. Report
the median and the 20th/80th percentiles. CPU: wall clocks, a fixed thread count, and the layer
timed as a stream of copies whose weights exceed twice the last-level cache (streaming_copies).

A candidate that raises, runs out of memory or returns NaN/Inf gets `inf` and the error string;
the caller goes on. Emulated candidates are timed and flagged; they are never a speed-up.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from autoao import search_space
from autoao.clock import L2_FLUSH_BYTES, fastest, time_cpu, time_cuda, tuning_us  # noqa: F401  (re-exported)
from autoao.common import BASELINE, __version__, call_model, triton_version
from autoao.evaluators.cache import Timing, TimingCache, TimingKey
from autoao.kernels import KernelInfo
from autoao.kernels._base import canonical_on_device
from autoao.kernels.ops import cdiv
from autoao.kernels.routes import parse_route, route_from_timings, route_kernel
from autoao.search_space import Candidate, LayerSpec

# Part of every cache key: bump it when the measurement method or a kernel changes, so old timings
# are not reused. 5: CPU samples during which the process lost the CPU are dropped and re-taken.
HARNESS_VERSION = 12  # 12: int8_wo and fp8_wo run eager calls of 1-64 rows on one CUDA kernel (cuda_rows)
# CPU sampling per cell: about CELL_SECONDS of samples, less (down to MIN_CELL_SECONDS) when a
# deadline leaves less per cell; a candidate over SLOW_CUT x the baseline's time at a cell ends at
# one clean sample (int8_dyn on a 49152x576 LM head at M=256 takes 2.6 s a call on a 2-core EPYC
# without VNNI: 5 samples of it were a third of a 90 s budget, to learn that it loses 3x).
CELL_SECONDS = 0.5
MIN_CELL_SECONDS = 0.05
SLOW_CUT = 2.0
# A cached cell re-timed at start (spot_check) agrees when within this factor of its cached time:
# a poisoned cache sat 200x off; a healthy one re-timed on a loaded 2-core machine read 116 us
# cached against 57 us now, so 2x cleared good caches.
SPOT_CHECK_TOLERANCE = 3.0
NOT_TIMED = "not timed: the time budget for timing was spent"


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (bytes), from sysfs; 32 MiB when it cannot be read."""
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            best = max(best, int(text.rstrip("KMG")) * {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1))
        except (OSError, ValueError):
            continue
    return best or 32 * 1024**2


def _module_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def streaming_copies(module: nn.Module, max_copies: int = 64) -> list[nn.Module]:
    """The module plus enough deep copies that their weights together exceed twice the last-level
    cache: timing them back to back streams weights from DRAM, as a model running through its layers
    does. (Timing one layer over and over measures its weights hot in cache: measured on a 2-core
    EPYC, that predicted a SmolLM2 decode step at ~9 ms when it ran at ~36 ms; flushing the cache
    before each call instead overshot 2x, since it also evicts the TLB and idles the threads.)"""
    import copy

    n = max(1, min(max_copies, cdiv(2 * last_level_cache_bytes(), max(_module_bytes(module), 1))))
    return [module] + [copy.deepcopy(module) for _ in range(n - 1)]


def build_layer(cand: Candidate, k: int, n: int, dtype: torch.dtype, device: torch.device,
                bias: bool = False, seed: int = 0) -> nn.Module:
    """A random nn.Linear(k, n) on `device` turned into `cand`'s module (weights ~ N(0, 1/k))."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen, device=device, dtype=torch.float32).mul_(k ** -0.5))
    return cand.build(lin, fqn=f"{n}x{k}")


def time_module(module: nn.Module, m: int, k: int, dtype: torch.dtype, device: torch.device, *,
                compile: bool = False, graph: bool = True, reps: int | None = None,
                threads: int | None = None, max_seconds: float = CELL_SECONDS,
                stop_above_us: float | None = None) -> Timing:
    """Time module(x) for x [m, k]; inf with the reason on failure or non-finite output.
    graph: on CUDA, replay a captured CUDA graph (False: time eager launches).
    max_seconds, stop_above_us: on the CPU, about how long to sample, and a time past which one
    clean sample ends the timing (see autoao.clock.time_cpu)."""
    device = torch.device(device)
    try:
        x_src = torch.randn(m, k, device=device, dtype=dtype)
        x = x_src.clone()  # [m, k]: the graph reads this buffer; priming rewrites it (into L2)
        fn = torch.compile(module, fullgraph=True, dynamic=False) if compile else module
        with torch.no_grad():
            t0 = time.perf_counter()
            y = fn(x)
            first_s = time.perf_counter() - t0
            if not torch.isfinite(y).all():
                return Timing.failed("output has NaN/Inf")
            if device.type == "cuda":
                med, p20, p80, n = time_cuda(lambda: fn(x), reps=reps or 50, graph=graph,
                                             prime=lambda: x.copy_(x_src))
                return Timing(med, p20, p80, n)
            copies = streaming_copies(fn) if not compile else [fn]
            calls = [lambda c=c: c(x) for c in copies]
            n_threads = threads or torch.get_num_threads()
            s = time_cpu(calls, reps=reps or 20, threads=threads, max_seconds=max_seconds,
                         stop_above_us=stop_above_us, first_s=first_s)
            if s.cut and n_threads > 1:
                # Cut early (far behind the baseline), so a sample or two decide the cell. A thread
                # stalled at a barrier for a descheduled peer is not this process's lost CPU time,
                # so a clean-looking multi-threaded sample can be a stall (next to busy loops,
                # int8_dyn 192x576 was cut at 271 us, 84 us quiet: tests/test_load.py). One thread
                # cannot stall so, and this slow a kernel is no faster on one thread than on
                # several: the cell is the lesser of the two, and unreliable (re-timed by the next
                # run) when one thread gave no clean sample either.
                one = time_cpu(calls, reps=1, threads=1, max_seconds=max_seconds / 2, warmup=1, min_samples=1)
                if not one.reliable:
                    return Timing(s.median, s.p20, s.p80, s.reps, discarded=s.discarded + one.discarded,
                                  reliable=False, threads=n_threads)
                if one.median < s.median:
                    return Timing(one.median, one.median, one.median, 1, discarded=s.discarded + one.discarded,
                                  threads=n_threads)
            single = None
            if not s.reliable and n_threads > 1:
                # a busy neighbour stalls every thread at each barrier; one thread runs undisturbed
                one = time_cpu(calls, reps=reps or 20, threads=1, max_seconds=max_seconds / 2, warmup=1)
                single = one.median if one.reliable else None
            return Timing(s.median, s.p20, s.p80, s.reps, discarded=s.discarded, reliable=s.reliable,
                          single_us=single, threads=n_threads)
    except torch.cuda.OutOfMemoryError as e:
        return Timing.failed(f"out of memory: {str(e).splitlines()[0]}")
    except Exception as e:  # noqa: BLE001 - a failing kernel is data, not a crash
        return Timing.failed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


##### many (shape, candidate, M) at once, through the on-disk cache ##############################

@dataclass(frozen=True)
class LatencyRow:
    candidate: str  # Candidate.name
    m: int
    k: int
    n: int
    timing: Timing
    cached: bool  # True when read from the cache instead of measured now


@dataclass
class LatencyTable:
    """The result of measure_latencies. `measured` counts kernel timings actually run (cache misses)."""

    device: str
    dtype: str
    mode: str
    rows: list[LatencyRow]
    measured: int
    seconds: float
    # (candidate, K, N) -> kernel -> M -> Timing, for candidates with several kernels on the device: every
    # kernel's timings (rows hold the chosen kernel's), for reports and benchmarks
    kernel_timings: dict[tuple[str, int, int], dict[str, dict[int, Timing]]] = dataclasses.field(default_factory=dict)
    # "candidate" or "candidate@kernel" -> wall seconds spent building, compiling and timing it
    # (cache misses only): where a search's timing stage went
    seconds_by_kernel: dict[str, float] = dataclasses.field(default_factory=dict)
    _index: dict[tuple[str, int, int, int], Timing] = dataclasses.field(default_factory=dict, repr=False)

    def get(self, candidate: str, m: int, k: int, n: int) -> Timing:
        if len(self._index) != len(self.rows):  # built on first use (the cost model asks ~N*C*M times)
            self._index = {(r.candidate, r.m, r.k, r.n): r.timing for r in self.rows}
        try:
            return self._index[(candidate, m, k, n)]
        except KeyError:
            raise KeyError(f"no timing for {candidate} at M={m}, K={k}, N={n}") from None

    def find(self, candidate: str, m: int, k: int, n: int) -> Timing | None:
        """`get`, or None where the cell was not timed."""
        try:
            return self.get(candidate, m, k, n)
        except KeyError:
            return None

    def merged(self, other: LatencyTable) -> LatencyTable:
        """This table and `other` (more shapes or candidates, same device, dtype and mode) as one."""
        if (other.device, other.dtype, other.mode) != (self.device, self.dtype, self.mode):
            raise ValueError(f"cannot merge timings of {other.device}/{other.dtype}/{other.mode} into "
                             f"{self.device}/{self.dtype}/{self.mode}")
        seconds = dict(self.seconds_by_kernel)
        for label, sec in other.seconds_by_kernel.items():
            seconds[label] = seconds.get(label, 0.0) + sec
        return LatencyTable(self.device, self.dtype, self.mode, self.rows + other.rows, self.measured + other.measured,
                            self.seconds + other.seconds, {**self.kernel_timings, **other.kernel_timings}, seconds)

    def kernel_for(self, candidate: str, k: int, n: int) -> str | None:
        """The kernel chosen for `candidate` on the (N, K) shape (None: the candidate has one; the
        same kernel serves every M, see pick_kernel)."""
        m = next((r.m for r in self.rows), None)
        try:
            return self.get(candidate, m, k, n).kernel if m is not None else None
        except KeyError:
            return None


def kernel_names(cand: Candidate, device: torch.device) -> tuple[str | None, ...]:
    """The kernels to time for `cand` on `device`: its kernels there (Candidate.kernels) when it
    has several, else (None,) (one implementation)."""
    kernels = cand.kernels(device)
    return tuple(k.name for k in kernels) if len(kernels) > 1 else (None,)


def _kernel_info(cand: Candidate, device: torch.device, kernel: str | None) -> KernelInfo:
    """The record of `kernel`, a kernel_names entry (None: the candidate's only kernel), among
    `cand`'s kernels on `device`."""
    kernels = cand.kernels(device)
    return kernels[0] if kernel is None else next(k for k in kernels if k.name == kernel)


def workload_us(times: dict[int, Timing], calls: dict[int, int] | None = None) -> float:
    """Sum over M of calls[M] x median time (calls default to once each; a failure counts inf)."""
    return sum((calls or {}).get(m, 1) * (t.median_us if t.ok else math.inf) for m, t in times.items())


KERNEL_MARGIN = 0.02  # a kernel listed later must be this much faster to be chosen (noise, memory)


def pick_kernel(by_kernel: dict[str | None, dict[int, Timing]], calls: dict[int, int] | None = None) -> str | None:
    """The kernel with the least total time over the workload: sum over M of calls[M] x median
    (calls: how often the layer runs with M rows; default once each): pick_route's choice where the
    kernels fastest at each M cannot share one module (their runtime layouts differ). The first-listed kernel within
    KERNEL_MARGIN of the fastest wins, so timing noise does not flip plans and the default (and
    leaner) kernels are kept on near ties. Failed timings count as inf."""
    totals = {kern: workload_us(times, calls) for kern, times in by_kernel.items()}
    best = min(totals.values())
    return next(kern for kern, total in totals.items() if total <= best * (1 + KERNEL_MARGIN))


def pick_route(by_kernel: dict[str | None, dict[int, Timing]], calls: dict[int, int] | None = None,
               layouts: Mapping[str, str] | None = None) -> str | None:
    """The kernel, or route of kernels (kernels.parse_route), that serves the workload fastest:
    at each timed M the kernel fastest there (the first-listed within KERNEL_MARGIN of it), cut
    between two timed M at their geometric mean (route_from_timings). Where those winners read
    different runtime layouts (layouts: kernel -> KernelInfo.layout), one module cannot hold them
    all, and the one kernel pick_kernel chooses serves every M. None: the candidate has one
    implementation."""
    if None in by_kernel:
        return None
    winners: dict[int, str] = {}
    for m in sorted(next(iter(by_kernel.values()))):
        at = {kern: (t[m].median_us if t[m].ok else math.inf) for kern, t in by_kernel.items()}
        best = min(at.values())
        if best == math.inf:  # nothing ran at this M: no per-M choice to make
            return pick_kernel(by_kernel, calls)
        winners[m] = next(kern for kern, us in at.items() if us <= best * (1 + KERNEL_MARGIN))  # type: ignore[misc]
    if len(set(winners.values())) > 1 and layouts is not None \
            and len({layouts[kern] for kern in winners.values()}) > 1:
        return pick_kernel(by_kernel, calls)
    return route_from_timings(winners)


def route_timing(by_kernel: dict[str | None, dict[int, Timing]], route: str | None, m: int) -> Timing:
    """The timing at M of `route` (pick_route's answer): its kernel for M rows, labelled with the route."""
    if route is None:
        return by_kernel[None][m]
    return dataclasses.replace(by_kernel[route_kernel(parse_route(route), m)][m], kernel=route)


def device_name(device: torch.device) -> str:
    """What a timing depends on: the GPU model, or the CPU model and the thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    n = torch.get_num_threads()
    return f"{cpu} ({n} thread{'s' if n > 1 else ''})"


def default_mode(device: torch.device) -> str:
    """CUDA: "compile" (torch.compile(fullgraph=True), replayed in a CUDA graph): how a plan runs,
    and the ranking depends on it (inductor fuses the dequantizing casts of the weight-only paths).
    CPU: "eager"."""
    return "compile" if device.type == "cuda" else "eager"


def measure_latencies(
    shapes: list[tuple[int, int]],
    tokens: list[int],
    candidates: list[Candidate] | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    mode: str | None = None,
    cache: TimingCache | None = None,
    progress: bool = True,
    calls: dict[tuple[int, int], dict[int, int]] | None = None,
    deadline: float | None = None,
) -> LatencyTable:
    """Time every candidate on every (N, K) shape at every M in `tokens`, reusing cached timings.

    shapes: (out_features N, in_features K) pairs (weight shapes), e.g. [(14336, 4096)].
    mode: "eager", "graph" (CUDA only: eager modules replayed in a CUDA graph) or "compile"
    (torch.compile(fullgraph=True), on CUDA replayed in a CUDA graph; resets torch._dynamo between
    layers, since it compiles one module per shape and candidate; on CUDA a cell whose forward is
    one opaque op, KernelInfo.single_op, is replayed uncompiled: single_op_tokens).
    Default: default_mode(device).
    Candidates with several kernels on the device (Candidate.kernels) have each timed;
    the rows hold the kernel or route that pick_route chooses for the shape (Timing.kernel: the
    route's text, its kernel's time at each M), kernel_timings every kernel's.
    cache: a TimingCache (default: the one in cache_dir()); pass TimingCache(path) to isolate.
    calls: (N, K) -> {M: calls per forward}, the workload's weights for choosing a kernel (default:
    each M once).
    deadline: a time.perf_counter() after which cells not in the cache are not timed (a failed
    Timing, NOT_TIMED); the baseline is always timed. Cells are timed baseline first, then by their
    weight in the workload, largest first.
    Unsupported candidates get a failed Timing with the reason; nothing raises per kernel.
    """
    device = torch.device(device)
    mode = _checked_mode(mode or default_mode(device), device)
    run = _Run(cache if cache is not None else TimingCache(), key_base(device, dtype, mode), dtype, device, mode,
               deadline)
    work = _work_order(shapes, tokens, candidates if candidates is not None else search_space.all_candidates(), calls)
    rows: list[LatencyRow] = []
    kernel_timings: dict[tuple[str, int, int], dict[str, dict[int, Timing]]] = {}
    t0 = time.perf_counter()
    bar = _progress(len(work) * len(tokens), progress, f"timing on {run.base['device']}")
    for i, (n, k, cand) in enumerate(work):
        sampling = _sampling(deadline, (len(work) - i) * len(tokens))
        by_kernel, timed_now = _time_kernels(run, cand, n, k, tokens, sampling)
        layouts = {kern.name: kern.layout for kern in cand.kernels(device)}
        chosen = pick_route(by_kernel, (calls or {}).get((n, k)), layouts)
        if chosen is not None:
            kernel_timings[(cand.name, k, n)] = by_kernel  # type: ignore[assignment]
        for m in tokens:
            timed = route_timing(by_kernel, chosen, m)
            rows.append(LatencyRow(cand.name, m, k, n, timed, cached=m not in timed_now))
            if cand.family == BASELINE and timed.ok:
                run.base_us[(n, k, m)] = timed.high_us  # a busy machine's samples, capped
            bar.update(1)
    bar.close()
    return LatencyTable(run.base["device"], run.base["dtype"], mode, rows, run.measured, time.perf_counter() - t0,
                        kernel_timings, run.seconds_by_kernel)


def _checked_mode(mode: str, device: torch.device) -> str:
    """`mode`, or ValueError saying which modes `device` takes."""
    if mode not in ("eager", "graph", "compile"):
        raise ValueError(f"mode must be 'eager', 'graph' or 'compile', got {mode!r}")
    if mode == "graph" and device.type != "cuda":
        raise ValueError("mode 'graph' (CUDA graphs) needs a CUDA device; use 'eager' or 'compile' on CPU")
    return mode


def _work_order(shapes: list[tuple[int, int]], tokens: list[int], candidates: list[Candidate],
                calls: dict[tuple[int, int], dict[int, int]] | None) -> list[tuple[int, int, Candidate]]:
    """(N, K, candidate) cells: the baseline everywhere first (every prediction divides by it), then
    the shapes that weigh most in the workload (calls x M x N x K), so a deadline leaves the least
    important cells out."""
    def weight(n: int, k: int) -> float:
        return sum(c * m for m, c in ((calls or {}).get((n, k)) or {m: 1 for m in tokens}).items()) * n * k

    return sorted(((n, k, c) for n, k in shapes for c in candidates),
                  key=lambda w: (w[2].family != BASELINE, -weight(w[0], w[1])))


def _sampling(deadline: float | None, cells_left: int) -> float:
    """Seconds of CPU samples per cell: CELL_SECONDS, or a deadline's share of what is left of it
    among the cells left (a cell costs about twice its sampling: building, copies, warm-up)."""
    if deadline is None:
        return CELL_SECONDS
    return min(CELL_SECONDS, max(MIN_CELL_SECONDS, (deadline - time.perf_counter()) / (2 * cells_left)))


@dataclass
class _Run:
    """What the cells of one measure_latencies call share, and what they add up."""

    cache: TimingCache
    base: dict[str, str]  # key_base: the TimingKey fields of the machine and the software
    dtype: torch.dtype
    device: torch.device
    mode: str
    deadline: float | None  # time.perf_counter() after which cells not in the cache are not timed
    measured: int = 0  # kernel timings run (cache misses)
    seconds_by_kernel: dict[str, float] = dataclasses.field(default_factory=dict)
    base_us: dict[tuple[int, int, int], float] = dataclasses.field(default_factory=dict)  # (N, K, M) -> bf16's


def _time_kernels(run: _Run, cand: Candidate, n: int, k: int, tokens: list[int], sampling: float
                  ) -> tuple[dict[str | None, dict[int, Timing]], set[int]]:
    """Each kernel of `cand` (kernel_names) on the (N, K) shape at each M, in the listed order, but
    for a kernel outrun at every M by one that ran (KernelInfo.outrun_by): never chosen, not timed.
    Returns kernel -> M -> Timing (labelled with the kernel) and the M not read from the cache."""
    cut = None if cand.family == BASELINE else {m: SLOW_CUT * run.base_us[(n, k, m)] for m in tokens
                                                 if (n, k, m) in run.base_us}
    by_kernel: dict[str | None, dict[int, Timing]] = {}
    uncached: set[int] = set()
    for kern in kernel_names(cand, run.device):
        info = _kernel_info(cand, run.device, kern)
        if kern is not None and _outrun(info, n, k, tokens, by_kernel):
            continue
        found, missing = _time_kernel(run, cand, kern, info, n, k, tokens, by_kernel, sampling, cut)
        uncached.update(missing)
        by_kernel[kern] = {m: dataclasses.replace(t, kernel=kern) for m, t in found.items()}  # type: ignore[misc]
    return by_kernel, uncached


def _time_kernel(run: _Run, cand: Candidate, kern: str | None, info: KernelInfo, n: int, k: int, tokens: list[int],
                 done: dict[str | None, dict[int, Timing]], sampling: float, cut: dict[int, float] | None
                 ) -> tuple[dict[int, Timing], list[int]]:
    """One kernel's timing at each M: the cache's, a kernel's in `done` that runs the same code
    (KernelInfo.same_code), NOT_TIMED past the deadline (but for the baseline), or measured now and
    cached. Returns M -> Timing and the M the cache did not have."""
    # GPTQ / HQQ run round-to-nearest's kernels: one cached cell serves both (timing_name)
    label = cand.timing_name if kern is None else f"{cand.timing_name}@{kern}"
    keys = {m: TimingKey(candidate=label, m=m, k=k, n=n, options=info.options, **run.base) for m in tokens}
    found = {m: run.cache.get(key) for m, key in keys.items()}
    uncached = [m for m, t in found.items() if t is None]
    twins = {m: info.same_code(m, n, k) for m in uncached}  # the same code as a kernel timed before: its numbers
    found.update({m: done[twin][m] for m, twin in twins.items() if twin in done})
    missing = [m for m, twin in twins.items() if twin not in done]
    if missing and run.deadline is not None and time.perf_counter() > run.deadline and cand.family != BASELINE:
        found.update({m: Timing.failed(NOT_TIMED) for m in missing})
    elif missing:
        t0 = time.perf_counter()
        fresh = _time_missing(cand, kern, n, k, missing, run.dtype, run.device, run.mode, sampling, cut)
        run.seconds_by_kernel[label] = run.seconds_by_kernel.get(label, 0.0) + time.perf_counter() - t0
        run.measured += len(missing)
        for m, t in fresh.items():
            if t.error != NOT_TIMED:
                run.cache.put(keys[m], t)
            found[m] = t
    return found, uncached  # type: ignore[return-value]


def key_base(device: torch.device, dtype: torch.dtype, mode: str) -> dict[str, str]:
    """The TimingKey fields that belong to the machine and the software, not to the cell."""
    return dict(device=device_name(device), torch=torch.__version__, triton=triton_version() or "none",
                autoao=f"{__version__}/harness-{HARNESS_VERSION}", dtype=str(dtype).removeprefix("torch."), mode=mode)


@dataclass
class SpotCheck:
    """Cached cells re-timed at start: (label, cached us, now us) each, and what was done."""

    cells: list[tuple[str, float, float]]
    stale: bool  # some cell disagreed beyond SPOT_CHECK_TOLERANCE
    cleared: int  # cached cells of this device forgotten because of it (measured again)

    def message(self) -> str:
        worst = max(self.cells, key=lambda c: max(c[1] / c[2], c[2] / c[1]))
        return (f"cached timings disagree with this machine now ({worst[0]}: {worst[1]:.1f} us cached, "
                f"{worst[2]:.1f} us now, over {SPOT_CHECK_TOLERANCE:g}x apart): the cache was probably "
                f"measured while the machine was busy; {self.cleared} cached cells of this device are "
                "measured again")


def spot_check(shapes: list[tuple[int, int]], tokens: list[int], *, device: torch.device | str,
               dtype: torch.dtype, mode: str | None = None, cache: TimingCache, n_cells: int = 3) -> SpotCheck:
    """Re-time the `n_cells` cheapest cached bf16 cells of these shapes and token counts; if any is
    more than SPOT_CHECK_TOLERANCE x off its cached time, forget every cached cell of this device
    (machine and software), so this run measures them again."""
    device = torch.device(device)
    mode = mode or default_mode(device)
    base = key_base(device, dtype, mode)
    bf16 = search_space.get(BASELINE)
    cached = []
    for n, k in shapes:
        for m in tokens:
            key = TimingKey(candidate=bf16.name, m=m, k=k, n=n, **base)
            t = cache.get(key)
            if t is not None and t.ok:
                cached.append((t.median_us, m, n, k))
    cells = []
    stale = False
    for us, m, n, k in sorted(cached)[:n_cells]:
        now = _time_missing(bf16, None, n, k, [m], dtype, device, mode)[m]
        if now.ok and now.reliable:
            cells.append((f"bf16 {n}x{k} at M={m}", us, now.median_us))
            stale |= not 1 / SPOT_CHECK_TOLERANCE <= us / now.median_us <= SPOT_CHECK_TOLERANCE
        elif now.ok and now.bounded:
            # a busy machine now: the one-thread time still caps the cell, so a cached time far
            # above that cap was measured while the machine was busy
            cells.append((f"bf16 {n}x{k} at M={m}", us, now.high_us))
            stale |= us > SPOT_CHECK_TOLERANCE * now.high_us
    cleared = cache.clear_matching(base) if stale else 0
    return SpotCheck(cells, stale, cleared)


def _outrun(info: KernelInfo, n: int, k: int, tokens: list[int], timed: dict[str | None, dict[int, Timing]]) -> bool:
    """True when at every M in `tokens` a kernel timed before `info`'s (in `timed`, without error)
    is known to be faster than it (KernelInfo.outrun_by)."""
    for m in tokens:
        other = info.outrun_by(m, n, k)
        if other not in timed or not timed[other][m].ok:
            return False
    return True


def _time_missing(cand: Candidate, kernel: str | None, n: int, k: int, tokens: list[int], dtype: torch.dtype,
                  device: torch.device, mode: str, max_seconds: float = CELL_SECONDS,
                  stop_above_us: dict[int, float] | None = None) -> dict[int, Timing]:
    """Build `cand` (with `kernel`) on a random (N, K) layer and time it at each M in `tokens`
    (max_seconds, stop_above_us[M]: see time_module); failures become failed Timings with the
    reason."""
    reason = cand.supports(LayerSpec("", k, n, False, dtype), device)
    if reason:
        return {m: Timing.failed(f"unsupported: {reason}") for m in tokens}
    module = fn = None
    eager = single_op_tokens(cand, kernel, n, k, tokens, device, mode)
    try:
        with canonical_on_device():  # a module built to be timed: no host copy of its weights
            module = build_layer(cand, k, n, dtype, device)
            if kernel is not None:
                module.set_kernel(kernel)
        fn = module
        if mode == "compile" and len(eager) < len(tokens):
            torch._dynamo.reset()  # one compiled module at a time: dynamo's caches stay small
            fn = torch.compile(module, fullgraph=True)  # compiles on its first call, per M it sees
        # compiled modules are captured in CUDA graphs too: that is how the model will run
        fresh = {m: time_module(module if m in eager else fn, m, k, dtype, device,
                                graph=device.type == "cuda" and mode != "eager", max_seconds=max_seconds,
                                stop_above_us=(stop_above_us or {}).get(m))
                 for m in tokens}
    except Exception as e:  # noqa: BLE001
        fresh = {m: Timing.failed(f"build failed: {type(e).__name__}: {e}") for m in tokens}
    del module, fn
    return {m: t.flagged(cand.emulated(device)) for m, t in fresh.items()}


def single_op_tokens(cand: Candidate, kernel: str | None, n: int, k: int, tokens: list[int],
                     device: torch.device, mode: str) -> set[int]:
    """The M in `tokens` at which a "compile"-mode timing on CUDA runs `cand`'s module with `kernel`
    (None: its only one) eagerly in a CUDA graph, not compiled: where its forward is one opaque op
    (KernelInfo.single_op), which torch.compile would only wrap. Each M a compiled module sees
    costs a compile (dynamo/inductor: 86 s of the 181 s timing stage of a cold llama8 2048+1 search
    on the H200)."""
    if mode != "compile" or device.type != "cuda":
        return set()
    info = _kernel_info(cand, device, kernel)
    return {m for m in tokens if info.single_op(m, n, k)}


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="kernel", leave=False)


##### whole model ###############################################################################

def measure_model(model: nn.Module, example_input, *, compile: bool = False, graph: bool | None = None,
                  reps: int | None = None, warmup: int = 2, max_seconds: float = 3.0) -> Timing:
    """End-to-end latency of one forward of `model` on `example_input` (one input, by
    `autoao.profile`'s convention: tensor, tuple of args, or dict of kwargs): the ground truth that
    predicted plan latencies are compared with.

    compile: torch.compile(model) first (as the model will run). graph: on CUDA, capture the
    forward in a CUDA graph and time replays (default True; set False for models that cannot be
    captured). L2 is flushed before each repeat, as for layer timings. Failures score inf.
    max_seconds: on the CPU, about how long to sample (autoao.clock.time_cpu); with reps=1 and
    max_seconds=0, exactly one sample, disturbed or not.
    """
    params = list(model.parameters()) + list(model.buffers())
    device = params[0].device if params else torch.device("cpu")
    fn = torch.compile(model) if compile else model
    try:
        with torch.no_grad():
            if device.type == "cuda":
                call_model(fn, example_input)  # compiles
                med, p20, p80, n = time_cuda(lambda: call_model(fn, example_input), reps=reps or 30,
                                             graph=True if graph is None else graph, max_seconds=1.0)
                return Timing(med, p20, p80, n)
            first_s = None
            if warmup:  # the first call is one warm-up (time_cpu: a slow one is the whole warm-up)
                t0 = time.perf_counter()
                call_model(fn, example_input)
                first_s = time.perf_counter() - t0
            # warmup=0 from the caller: it alternates warm models, one clean sample each (see time_cpu)
            s = time_cpu(lambda: call_model(fn, example_input), reps=reps or 10, max_seconds=max_seconds,
                         warmup=max(warmup - 1, 0), min_samples=reps or 5, first_s=first_s)
    except Exception as e:  # noqa: BLE001
        return Timing.failed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return Timing(s.median, s.p20, s.p80, s.reps, discarded=s.discarded, reliable=s.reliable)
