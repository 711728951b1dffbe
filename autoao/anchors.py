"""Stage 4a: anchoring the cost model on uniform plans measured end to end (the CPU).

On the CPU the cells' sum misjudges how much a plan saves inside the model: SmolLM2 on a 2-core
EPYC, uniform int4 g64 predicted 1.21x from its cells (benchmarks/results/2026-12-02-epyc/
search-screen/, trial 5), measured 1.58x end to end; in the model its layers ran 0.91x their cells,
bf16's 1.11x, and the rest of the workload shrank from 666 to 611 ms
(benchmarks/results/2026-12-02-epyc/inmodel-vs-cells/). Before the search, the uniform plan of each
candidate (fastest predicted first, until the stage's deadline) is measured end to end in
alternation with the unchanged model, and the candidate's cells are scaled so that its uniform
plan's predicted speed-up is the measured one; mixed plans add up the scaled cells. Factors are
clamped to ANCHOR_FACTORS: a wider one says the measurement, not the cells, was off.
Two rounds whose paired ratios differ by more than ANCHOR_AGREE say one of them was disturbed (one
plan's per-round ratios spread from 1.11x to 2.06x on a quiet 2-core Xeon): ANCHOR_ROUNDS more are
taken and the median ratio kept, so one disturbed round cannot set a candidate's factor.

Compiled measurements (CUDA) are not anchored: there each plan compiles the model once, and the
cells, CUDA-graph replays of the compiled layers, predict the Llama-shaped stacks within a few
percent (benchmarks/NOTES.md).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from autoao import search_space
from autoao.bench import ModelBench, interleaved
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.ledger import RunLedger
from autoao.plan import Plan
from autoao.records import AnchorRecord
from autoao.search import plan_from_params

ANCHOR_ROUNDS = 2
ANCHOR_AGREE = 1.25
ANCHOR_FACTORS = (0.25, 4.0)


@dataclass(frozen=True)
class Anchored:
    """The cost model the search uses (scaled where anchors were measured) and the anchors."""

    cost: CostModel
    records: tuple[AnchorRecord, ...]


def anchor_cost(bench: ModelBench, bf16_us: float, ledger: RunLedger, deadline: float | None) -> Anchored:
    """The bench's cost model with each candidate's cells scaled to its uniform plan's measured
    speed-up (module docstring); its variants that run the same kernels (Candidate.timing_name)
    take the same factor. Unchanged where measurements compile (CUDA) or the cost model is an
    estimate for another engine (bench.estimate). A plan that fails to apply is left out. The model
    is restored afterwards."""
    cost = bench.cost
    if bench.compile or bench.estimate:
        return Anchored(cost, ())
    names = list(dict.fromkeys(c for g in bench.groups for c in g.choices if c != BASELINE))
    timing_of = {n: search_space.get(n).timing_name for n in names}
    uniform = []
    for name in names:
        if timing_of[name] == name:  # a variant timed as another candidate takes that one's factor
            params = {g.name: name if name in g.choices else BASELINE for g in bench.groups}
            plan = plan_from_params(bench.groups, params, cost.fusion_pays)
            if plan.layers:
                uniform.append((cost.predict(plan), name, params, plan))
    measured, bf16_runs = _measure(bench, sorted(uniform, key=lambda u: u[0]), bf16_us, ledger, deadline)
    if not measured:
        return Anchored(cost, ())
    # the unchanged model's every run, not the first alone, sets the rest: a VM's speed drifts (the
    # demo's bf16 workload measured 1.6 to 2.7 s at the starts of searches on one EPYC)
    cost = cost.with_rest_from(statistics.median(bf16_runs))
    whole = cost.predict(Plan())
    records = []
    low, high = ANCHOR_FACTORS
    for name, (speedup, plan, rounds) in measured.items():
        changed, unchanged = cost.split(plan)
        factor = min(high, max(low, (whole / speedup - unchanged) / changed)) if changed > 0 else 1.0
        records.append(AnchorRecord(name, len(plan.layers), rounds, speedup, whole / cost.predict(plan), factor))
    factors = {n: r.factor for r in records for n in names if timing_of[n] == r.candidate}
    ledger.say("the cost model anchored on uniform plans measured end to end: " + "; ".join(
        f"{r.candidate} {r.measured:.2f}x (cells {r.predicted:.2f}x, scaled {r.factor:.2f})" for r in records))
    return Anchored(cost.scaled(factors), tuple(records))


def _measure(bench: ModelBench, uniform: list[tuple[float, str, dict[str, str], Plan]], bf16_us: float,
             ledger: RunLedger, deadline: float | None) -> tuple[dict[str, tuple[float, Plan, int]], list[float]]:
    """name -> (measured speed-up, plan, rounds) of each uniform plan that fit before `deadline`,
    and every run of the unchanged model."""
    run = bf16_us / 1e6  # one workload run; an anchor takes a warm-up and two a round

    def fits(rounds: int) -> bool:
        return deadline is None or time.perf_counter() + (2 * rounds + 2) * run <= deadline

    measured: dict[str, tuple[float, Plan, int]] = {}
    bf16_runs = [bf16_us]
    for _, name, params, plan in uniform:
        if not fits(ANCHOR_ROUNDS):
            break
        try:
            with bench.applied(bench.shipped(params)):
                applied = bench.modules(plan)
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
    return measured, bf16_runs
