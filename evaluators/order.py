"""The order of timing work: which (N, K, candidate) cells a deadline reaches first. Ordering only:
every choice a search makes rests on the timings, whatever order they were taken in.

    work = work_order(cells, tokens, calls)                       # the baseline, then heaviest first
    for name in probe_order(work, first, tokens, calls, dtype, errors): ...   # the candidates' probes
    rest = by_probe(work, timed, base, first, calls)               # the cells left, fastest probes first

A cell is (out_features N, in_features K, candidate); `calls` is (N, K) -> {M: calls per forward},
the workload's weights (None: each M in `tokens` once); a candidate's probe is its heaviest cell.
Why this order: docs/measuring.md#the-order-of-timing-work.
"""

from __future__ import annotations

import math

import torch

from autoao.common import BASELINE
from autoao.evaluators.cache import Timing
from autoao.evaluators.latency import workload_us
from autoao.search_space import Candidate
from autoao.types import LayerSpec

Cell = tuple[int, int, Candidate]  # (N, K, candidate)
Calls = dict[tuple[int, int], dict[int, int]] | None
ByKernel = dict[str | None, dict[int, Timing]]  # one cell's timings: kernel -> {M: Timing}

# Tokens per call past which ordering treats a layer as bound by its products, not its weight reads
# (a rough middle: the GPU's ridge is a few hundred tokens, the CPU's tens).
RIDGE_TOKENS = 64
# A layer error below this SQNR (dB; its error above ~3% of the output's power) puts a candidate's
# probe after every other's: pruning 2:4 without retraining, not the 8-bit or grouped 4-bit formats
# (docs/measuring.md#the-order-of-timing-work).
PRIOR_FLOOR_DB = 15.0


def work_order(cells: list[Cell], tokens: list[int], calls: Calls) -> list[Cell]:
    """The cells in timing order: the baseline everywhere first (every prediction divides by it),
    then by the shape's weight in the workload (calls x M x N x K), largest first (the demo's
    1536x576 gate/up before its 192x576 k/v), so a deadline leaves the least important cells out;
    cells of one shape in the order given."""
    return sorted(cells, key=lambda w: (w[2].family != BASELINE, -workload_weight(w[0], w[1], tokens, calls)))


def workload_weight(n: int, k: int, tokens: list[int], calls: Calls) -> float:
    """The (N, K) shape's weight in the workload: calls x M x N x K, summed (each M in `tokens`
    once where `calls` has none for the shape)."""
    return sum(c * m for m, c in ((calls or {}).get((n, k)) or {m: 1 for m in tokens}).items()) * n * k


def probe_order(work: list[Cell], first: dict[str, int], tokens: list[int], calls: Calls, dtype: torch.dtype,
                errors: dict[str, float]) -> list[str]:
    """The candidates but the baseline (first: name -> index of its probe in `work`): those whose
    layer error (`errors`, SQNR dB) is below PRIOR_FLOOR_DB last; within each part the formats
    predicted fastest on the workload first, from what each stores and computes alone: on its
    probe's (N, K) shape a call of M tokens costs max(stored bits / the layer's bits, M /
    RIDGE_TOKENS / product_rate) of the layer's own, summed over the workload's calls; ties in
    `work`'s order. A machine-free roofline: it only decides which candidates a short deadline
    times first."""
    def predicted(name: str) -> float:
        n, k, cand = work[first[name]]
        bits = cand.stored_bits(LayerSpec("", k, n, False, dtype)) / (8 * dtype.itemsize)
        per_m = (calls or {}).get((n, k)) or {m: 1 for m in tokens}
        return sum(c * max(bits, m / RIDGE_TOKENS / cand.product_rate) for m, c in per_m.items())

    names = [name for name, i in first.items() if work[i][2].family != BASELINE]
    return sorted(names, key=lambda name: (errors.get(name, math.inf) < PRIOR_FLOOR_DB, predicted(name), first[name]))


def probe_gain(work: list[Cell], timed: dict[int, ByKernel], base: dict[tuple[int, int], int], probe: int,
               calls: Calls) -> float:
    """How many times faster than the baseline's cell of its shape (base: (N, K) -> that cell's
    index) the probe cell `probe` ran over the workload's calls (its fastest kernel; timed: index ->
    the cells timed so far); 0 where it failed, was not timed or has no baseline."""
    n, k, _ = work[probe]
    if base.get((n, k)) not in timed or probe not in timed:
        return 0.0
    ref = timed[base[(n, k)]]
    best = min(workload_us(times, (calls or {}).get((n, k))) for times in timed[probe].values())
    return workload_us(next(iter(ref.values())), (calls or {}).get((n, k))) / best if best > 0 else 0.0


def by_probe(work: list[Cell], timed: dict[int, ByKernel], base: dict[tuple[int, int], int], first: dict[str, int],
             calls: Calls) -> list[int]:
    """The indices of `work`'s cells not in `timed`, the candidates whose probe (first[name]) ran
    fastest against the baseline's cell of its shape first (failed, unsupported or untimed probes
    last), each candidate's cells in `work`'s order (heaviest first)."""
    gain = {name: probe_gain(work, timed, base, i, calls) for name, i in first.items()}
    rest = [i for i in range(len(work)) if i not in timed]
    return sorted(rest, key=lambda i: (-gain.get(work[i][2].name, 0.0), i))
