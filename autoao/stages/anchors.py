"""Anchoring the cost model on a uniform plan measured end to end (the CPU).

    record = anchor(cells, "int8_wo", plan, measured_speedup, rounds)   # -> AnchorRecord (its factor)
    cost = anchored(cells, [record, ...])                              # the cells, every candidate scaled

On the CPU the cells' sum misjudges how much a plan saves inside the model: SmolLM2 on a 2-core
CPU without AMX, uniform int4 g64 predicted 1.21x from its cells, measured 1.58x end to end; in the model its
layers ran 0.91x their cells, bf16's 1.11x (docs/python-api.md, "Measure"). When
the anytime run measures a uniform plan (one candidate wherever it applies), the candidate's cells
are scaled so that the plan's predicted speed-up is the measured one (`anchor`); candidates not
measured take the median of the measured factors (`anchored`); mixed plans add up the scaled cells. Factors are clamped to ANCHOR_FACTORS: a wider one says the measurement, not the cells,
was off. Compiled measurements (CUDA) are not anchored: there the cells, CUDA-graph replays of the
compiled layers, predict the Llama-shaped stacks within a few percent.
"""

from __future__ import annotations

import statistics

from autoao import search_space
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.plan import Plan
from autoao.records import AnchorRecord

ANCHOR_FACTORS = (0.25, 4.0)


def anchor(cost: CostModel, name: str, plan: Plan, speedup: float, rounds: int) -> AnchorRecord:
    """The factor that scales candidate `name`'s cells in `cost` (the cells as timed) so that `plan`
    (uniform `name`) predicts `speedup`, measured in `rounds` interleaved rounds, as a record."""
    whole = cost.predict(Plan())
    changed, unchanged = cost.split(plan)
    low, high = ANCHOR_FACTORS
    factor = min(high, max(low, (whole / speedup - unchanged) / changed)) if changed > 0 else 1.0
    return AnchorRecord(name, len(plan.layers), rounds, speedup, whole / cost.predict(plan), factor)


def anchored(cost: CostModel, records: list[AnchorRecord]) -> CostModel:
    """`cost` (the cells as timed) with each anchored candidate's cells scaled by its factor, and
    those of its variants that run the same kernels (Candidate.timing_name); every other candidate
    but the unchanged one takes the median factor of those measured: what the model does to a
    layer's time that its cell does not see (its weights streamed among the others', the threads
    already warm) is the machine's more than the kernel's, and an unmeasured candidate would
    otherwise be judged on cells its measured rivals no longer are."""
    if not records:
        return cost
    by_timing = {search_space.get(r.candidate).timing_name: r.factor for r in records}
    rest = statistics.median(r.factor for r in records)
    names = {n for per in cost.layer_us.values() for n in per if n != BASELINE}
    return cost.scaled({n: by_timing.get(search_space.get(n).timing_name, rest) for n in names})
