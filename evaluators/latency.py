"""The latency table and the kernel its timings choose: what measure_latencies (evaluators/timing.py)
fills, and the rules that read it. Data and pure functions over Timings; nothing here measures.

    table.get("int8_wo", 1, 576, 1536)       -> Timing (the chosen kernel's or route's)
    pick_route(by_kernel, calls, layouts)    -> "int8pack<=16,dequant"
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

import torch

from autoao.evaluators.cache import Timing
from autoao.kernels import KernelInfo
from autoao.kernels.routes import parse_route, route_from_timings, route_kernel
from autoao.search_space import Candidate

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
    """The result of measure_latencies. `measured` counts kernel timings actually run (cache misses
    and refinements)."""

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


def kernel_info(cand: Candidate, device: torch.device, kernel: str | None) -> KernelInfo:
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

