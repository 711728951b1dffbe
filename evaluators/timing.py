"""Which cells to time, and when: every (shape, candidate, kernel, M) a search needs, through the
on-disk cache, by a deadline. How one cell is timed is evaluators.harness's.

    table = measure_latencies(shapes, tokens, candidates, device=..., cache=..., deadline=...)
    check = spot_check(shapes, tokens, device=..., dtype=..., cache=...)   # a cache measured while busy

Order of value: the baseline everywhere first (every prediction divides by it), then every
candidate on its heaviest shape, the formats predicted fastest first, a candidate faster there than
the baseline on all its other shapes at once; then the rest, the candidates whose probe ran fastest
first. Under a deadline every cell is timed coarsely before any is refined, so a short deadline
leaves the slowest candidates' lightest cells untimed, never the fastest one's, and coarse cells
rather than none. A failing kernel is an inf timing with its error: data, not a crash.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from autoao import search_space
from autoao.clock import L2_FLUSH_BYTES, fastest, time_cpu, time_cuda, tuning_us  # noqa: F401  (re-exported)
from autoao.common import BASELINE
from autoao.evaluators import harness, order
from autoao.evaluators.cache import Timing, TimingCache, TimingKey
from autoao.evaluators.harness import (CELL_SECONDS, COARSE_SECONDS, HARNESS_VERSION, SLOW_CUT,  # noqa: F401  (re-exported)
                                       build_layer, default_mode, device_name, key_base, single_op_tokens,
                                       streaming_copies, time_module)
from autoao.evaluators.latency import (KERNEL_MARGIN, LatencyRow, LatencyTable, kernel_info,  # noqa: F401  (re-exported)
                                       kernel_names, pick_kernel, pick_route, route_timing, workload_us)
from autoao.evaluators.model_timing import measure_model  # noqa: F401  (re-exported)
from autoao.kernels import KernelInfo
from autoao.search_space import Candidate

# A cached cell re-timed at start (spot_check) agrees when within this factor of its cached time:
# a poisoned cache sat 200x off; a healthy one re-timed on a loaded 2-core machine read 116 us
# cached against 57 us now, so 2x cleared good caches.
SPOT_CHECK_TOLERANCE = 3.0
NOT_TIMED = "not timed: the time budget for timing was spent"


##### many (shape, candidate, M) at once, through the on-disk cache ##############################

# With a deadline, refining the coarse cells takes at most this x the coarse pass's seconds, or half
# this of what the deadline leaves, whichever is more: the time after timing is worth more to the
# run's first verified plan than to finer cells (a later run with time to spare refines what is
# cached coarse).
REFINE_SHARE = 0.5


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
    extra: tuple[list[tuple[int, int]], list[Candidate]] | None = None,
    errors: dict[str, float] | None = None,
) -> LatencyTable:
    """Time every candidate on every (N, K) shape at every M in `tokens`, reusing cached timings.

    shapes: (out_features N, in_features K) pairs (weight shapes), e.g. [(14336, 4096)].
    mode: "eager", "graph" (CUDA only: eager modules replayed in a CUDA graph) or "compile"
    (torch.compile(fullgraph=True), on CUDA replayed in a CUDA graph; resets torch._dynamo between
    layers; on CUDA a one-op cell, KernelInfo.single_op, is replayed uncompiled: single_op_tokens);
    default: default_mode(device). Candidates with several kernels on the device have each timed;
    the rows hold the kernel or route that pick_route chooses for the shape (Timing.kernel: the
    route's text, its kernel's time at each M), kernel_timings every kernel's.
    cache: a TimingCache (default: the one in cache_dir()). calls: (N, K) -> {M: calls per
    forward}, the workload's weights for ordering cells and choosing kernels (default: each M once).
    extra: (shapes, candidates) timed in the same work list, each shape on those candidates only
    (the sibling groups' fused shapes, on the candidates that fuse).
    errors: candidate name -> its layer error (SQNR dB) on the workload's heaviest layer, a prior
    on its accuracy for the order of the cells (order.probe_order); None: speed alone orders them.
    deadline: a time.perf_counter() by which to finish. Without one, every cell is timed at
    CELL_SECONDS. With one, two passes over the cells in order.work_order's order: every cell coarsely
    (Timing.coarse: COARSE_SECONDS of samples per M) or from the cache, then, while the deadline
    (bounded by REFINE_SHARE) allows a cell's estimated cost (_refine_seconds), its coarse timings
    again at CELL_SECONDS (replacing them in the table and the cache). Cells the first pass reaches
    past the deadline are not timed (a failed Timing, NOT_TIMED), but for the baseline.
    Unsupported candidates get a failed Timing with the reason; nothing raises per kernel.
    """
    device = torch.device(device)
    mode = _checked_mode(mode or default_mode(device), device)
    run = _Run(cache if cache is not None else TimingCache(), key_base(device, dtype, mode), dtype, device, mode,
               deadline)
    cands = candidates if candidates is not None else search_space.all_candidates()
    more = [(n, k, c) for n, k in extra[0] for c in extra[1]] if extra is not None else []
    work = order.work_order([(n, k, c) for n, k in shapes for c in cands] + more, tokens, calls)
    t0 = time.perf_counter()
    cells = _first_pass(run, work, tokens, calls, progress, errors or {})
    run.deadline = _refine_deadline(deadline, t0)
    _refine_pass(run, work, cells, tokens, calls, progress)
    return _table(run, work, cells, tokens, calls, time.perf_counter() - t0)


def _refine_deadline(deadline: float | None, started: float) -> float | None:
    """When refining ends: refining buys precision, not candidates, so REFINE_SHARE x the coarse
    pass's seconds (it began at `started`) or half that share of what the deadline leaves."""
    if deadline is None:
        return None
    now = time.perf_counter()
    return min(deadline, now + max(REFINE_SHARE * (now - started), REFINE_SHARE / 2 * (deadline - now)))


def _checked_mode(mode: str, device: torch.device) -> str:
    """`mode`, or ValueError saying which modes `device` takes."""
    if mode not in ("eager", "graph", "compile"):
        raise ValueError(f"mode must be 'eager', 'graph' or 'compile', got {mode!r}")
    if mode == "graph" and device.type != "cuda":
        raise ValueError("mode 'graph' (CUDA graphs) needs a CUDA device; use 'eager' or 'compile' on CPU")
    return mode


@dataclass
class _Run:
    """What the cells of one measure_latencies call share, and what they add up."""

    cache: TimingCache
    base: dict[str, str]  # key_base: the TimingKey fields of the machine and the software
    dtype: torch.dtype
    device: torch.device
    mode: str
    deadline: float | None  # time.perf_counter() after which cells not in the cache are not timed
    measured: int = 0  # kernel timings run (cache misses and refinements)
    seconds_by_kernel: dict[str, float] = dataclasses.field(default_factory=dict)
    base_us: dict[tuple[int, int, int], float] = dataclasses.field(default_factory=dict)  # (N, K, M) -> bf16's


@dataclass
class _Cell:
    """One (N, K, candidate) cell: each kernel's timing at each M, the M timed by this call (not read
    from the cache), and the seconds spent timing it."""

    by_kernel: dict[str | None, dict[int, Timing]]
    fresh: set[int]
    seconds: float

    @property
    def coarse(self) -> int:
        """How many of its (kernel, M) timings are coarse."""
        return sum(t.coarse for times in self.by_kernel.values() for t in times.values())


def _first_pass(run: _Run, work: list[tuple[int, int, Candidate]], tokens: list[int],
                calls: dict[tuple[int, int], dict[int, int]] | None, progress: bool,
                errors: dict[str, float]) -> list[_Cell]:
    """Every cell of `work` from the cache, or timed now: coarsely (COARSE_SECONDS per M) when there
    is a deadline, else at CELL_SECONDS; NOT_TIMED past the deadline (but for the baseline). In the
    order of value: the baseline everywhere; then each candidate's probe (its heaviest cell), the
    formats predicted fastest on the workload first, those whose layer error (`errors`) is far off
    last (order.probe_order), and every other cell of a candidate whose probe ran faster than the
    baseline's right after that probe, so a short deadline leaves whole plans of the first fast
    candidates timed (one may still not hold: the prior only orders); then the rest, the candidates
    whose probe ran fastest first (order.by_probe)."""
    sampling = CELL_SECONDS if run.deadline is None else COARSE_SECONDS
    cells: dict[int, _Cell] = {}
    bar = _progress(len(work) * len(tokens), progress, f"timing on {run.base['device']}")
    first = {}  # candidate name -> index of its probe: its heaviest cell in `work` (sorted by weight)
    for i, (_, _, cand) in enumerate(work):
        first.setdefault(cand.name, i)

    def time_cells(indices: list[int]) -> None:
        for i in indices:
            n, k, cand = work[i]
            t0 = time.perf_counter()
            by_kernel, fresh = _time_kernels(run, cand, n, k, tokens, sampling)
            cells[i] = _Cell(by_kernel, fresh, time.perf_counter() - t0 if fresh else 0.0)
            _note_baseline(run, cand, n, k, by_kernel, calls)
            bar.update(len(tokens))

    def timed() -> dict[int, order.ByKernel]:
        return {i: cell.by_kernel for i, cell in cells.items()}

    base = {(n, k): i for i, (n, k, cand) in enumerate(work) if cand.family == BASELINE}  # shape -> its cell
    time_cells(list(base.values()))
    for name in order.probe_order(work, first, tokens, calls, run.dtype, errors):
        time_cells([first[name]])
        if order.probe_gain(work, timed(), base, first[name], calls) > 1.0:
            time_cells([i for i, (_, _, cand) in enumerate(work) if cand.name == name and i not in cells])
    time_cells(order.by_probe(work, timed(), base, first, calls))
    bar.close()
    return [cells[i] for i in range(len(work))]


def _refine_pass(run: _Run, work: list[tuple[int, int, Candidate]], cells: list[_Cell], tokens: list[int],
                 calls: dict[tuple[int, int], dict[int, int]] | None, progress: bool) -> None:
    """Re-time the coarse timings of `cells` at CELL_SECONDS, in the order of `work`, each cell whose
    estimated cost (_refine_seconds) fits before the deadline; the refined cells replace the coarse
    ones in `cells` and in the cache."""
    todo = [i for i, cell in enumerate(cells) if cell.coarse]
    bar = _progress(len(todo), progress and bool(todo), f"refining timings on {run.base['device']}")
    for i in todo:
        n, k, cand = work[i]
        if run.deadline is not None and time.perf_counter() + _refine_seconds(cells[i]) > run.deadline:
            continue  # a cheaper cell later may still fit
        t0 = time.perf_counter()
        by_kernel, fresh = _time_kernels(run, cand, n, k, tokens, CELL_SECONDS, have=cells[i].by_kernel)
        cells[i] = _Cell(by_kernel, cells[i].fresh | fresh, cells[i].seconds + time.perf_counter() - t0)
        _note_baseline(run, cand, n, k, by_kernel, calls)
        bar.update(1)
    bar.close()


def _table(run: _Run, work: list[tuple[int, int, Candidate]], cells: list[_Cell], tokens: list[int],
           calls: dict[tuple[int, int], dict[int, int]] | None, seconds: float) -> LatencyTable:
    """The cells as measure_latencies returns them: a row per cell and M, its chosen kernel's or route's."""
    rows: list[LatencyRow] = []
    kernel_timings: dict[tuple[str, int, int], dict[str, dict[int, Timing]]] = {}
    for (n, k, cand), cell in zip(work, cells):
        chosen = _chosen(run, cand, n, k, cell.by_kernel, calls)
        if chosen is not None:
            kernel_timings[(cand.name, k, n)] = cell.by_kernel  # type: ignore[assignment]
        rows += [LatencyRow(cand.name, m, k, n, route_timing(cell.by_kernel, chosen, m), cached=m not in cell.fresh)
                 for m in tokens]
    return LatencyTable(run.base["device"], run.base["dtype"], run.mode, rows, run.measured, seconds, kernel_timings,
                        run.seconds_by_kernel)


def _refine_seconds(cell: _Cell) -> float:
    """About what re-timing `cell`'s coarse timings costs: what its first timing cost here (building,
    copies; 0 when it came from the cache) and, per coarse (kernel, M), CELL_SECONDS of samples and a
    warm-up of a quarter of that (time_cpu)."""
    return cell.seconds + cell.coarse * CELL_SECONDS * 5 / 4


def _chosen(run: _Run, cand: Candidate, n: int, k: int, by_kernel: dict[str | None, dict[int, Timing]],
            calls: dict[tuple[int, int], dict[int, int]] | None) -> str | None:
    """The kernel or route pick_route chooses for `cand` on the (N, K) shape (None: one kernel)."""
    layouts = {kern.name: kern.layout for kern in cand.kernels(run.device)}
    return pick_route(by_kernel, (calls or {}).get((n, k)), layouts)


def _note_baseline(run: _Run, cand: Candidate, n: int, k: int, by_kernel: dict[str | None, dict[int, Timing]],
                   calls: dict[tuple[int, int], dict[int, int]] | None) -> None:
    """Keep the baseline's time at each M of the shape (the SLOW_CUT of later cells): a busy
    machine's samples, capped (Timing.high_us)."""
    if cand.family != BASELINE:
        return
    chosen = _chosen(run, cand, n, k, by_kernel, calls)
    for m in next(iter(by_kernel.values())):
        timed = route_timing(by_kernel, chosen, m)
        if timed.ok:
            run.base_us[(n, k, m)] = timed.high_us


@dataclass
class _Ask:
    """What each kernel of one cell is timed with: `cand` on the (N, K) shape at each M of `tokens`,
    about `sampling` seconds of samples per M, past cut[M] one clean sample ends it (SLOW_CUT), the
    layer built once for all its kernels."""

    cand: Candidate
    n: int
    k: int
    tokens: list[int]
    sampling: float
    cut: dict[int, float] | None
    layer: harness.Layer


def _time_kernels(run: _Run, cand: Candidate, n: int, k: int, tokens: list[int], sampling: float,
                  have: dict[str | None, dict[int, Timing]] | None = None
                  ) -> tuple[dict[str | None, dict[int, Timing]], set[int]]:
    """Each kernel of `cand` (kernel_names) on the (N, K) shape at each M, in the listed order, but
    for a kernel outrun at every M by one that ran (KernelInfo.outrun_by): never chosen, not timed.
    have: a first pass's timings of the cell, to refine: its kernels, their coarse M timed again.
    Returns kernel -> M -> Timing (labelled with the kernel) and the M timed now (not from the cache)."""
    cut = None if cand.family == BASELINE else {m: SLOW_CUT * run.base_us[(n, k, m)] for m in tokens
                                                 if (n, k, m) in run.base_us}
    ask = _Ask(cand, n, k, tokens, sampling, cut, harness.Layer(cand, n, k, run.dtype, run.device))
    by_kernel: dict[str | None, dict[int, Timing]] = {}
    fresh: set[int] = set()
    for kern in kernel_names(cand, run.device) if have is None else list(have):
        info = kernel_info(cand, run.device, kern)
        if have is None and kern is not None and _outrun(info, n, k, tokens, by_kernel):
            continue
        found, timed_now = _time_kernel(run, ask, kern, info, by_kernel, None if have is None else have[kern])
        fresh.update(timed_now)
        by_kernel[kern] = {m: dataclasses.replace(t, kernel=kern) for m, t in found.items()}  # type: ignore[misc]
    return by_kernel, fresh


def _time_kernel(run: _Run, ask: _Ask, kern: str | None, info: KernelInfo, done: dict[str | None, dict[int, Timing]],
                 have: dict[int, Timing] | None) -> tuple[dict[int, Timing], list[int]]:
    """One kernel's timing at each M: the cache's (or, refining, `have`'s where not coarse), a
    kernel's in `done` that runs the same code (KernelInfo.same_code), NOT_TIMED past the deadline
    in the first pass (but for the baseline), or measured now and cached. Returns M -> Timing and
    the M not read from the cache (or, refining, the coarse M)."""
    cand, n, k = ask.cand, ask.n, ask.k
    # GPTQ / HQQ run round-to-nearest's kernels: one cached cell serves both (timing_name)
    label = cand.timing_name if kern is None else f"{cand.timing_name}@{kern}"
    keys = {m: TimingKey(candidate=label, m=m, k=k, n=n, options=info.options, **run.base) for m in ask.tokens}
    found = {m: run.cache.get(key) for m, key in keys.items()} if have is None else \
        {m: None if t.coarse else t for m, t in have.items()}
    uncached = [m for m, t in found.items() if t is None]
    twins = {m: info.same_code(m, n, k) for m in uncached}  # the same code as a kernel timed before: its numbers
    found.update({m: done[twin][m] for m, twin in twins.items() if twin in done})
    missing = [m for m, twin in twins.items() if twin not in done]
    late = run.deadline is not None and time.perf_counter() > run.deadline
    if missing and have is None and late and cand.family != BASELINE:
        found.update({m: Timing.failed(NOT_TIMED) for m in missing})
    elif missing:
        t0 = time.perf_counter()
        fresh = harness.time_missing(cand, kern, n, k, missing, run.dtype, run.device, run.mode, ask.sampling, ask.cut,
                              ask.layer)
        run.seconds_by_kernel[label] = run.seconds_by_kernel.get(label, 0.0) + time.perf_counter() - t0
        run.measured += len(missing)
        for m, t in fresh.items():
            run.cache.put(keys[m], t)
            found[m] = t
    return found, uncached  # type: ignore[return-value]


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
        now = harness.time_missing(bf16, None, n, k, [m], dtype, device, mode)[m]
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


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="kernel", leave=False)
