"""Anchoring the cost model on a uniform plan measured end to end (the CPU).

    cost, record = anchor(cost, "int8_wo", plan, measured_speedup, rounds)

On the CPU the cells' sum misjudges how much a plan saves inside the model: SmolLM2 on a 2-core
EPYC, uniform int4 g64 predicted 1.21x from its cells, measured 1.58x end to end; in the model its
layers ran 0.91x their cells, bf16's 1.11x (docs/python-api.md, "Measure"). When
the anytime run measures a uniform plan (one candidate wherever it applies), the candidate's cells
are scaled so that the plan's predicted speed-up is the measured one; mixed plans add up the scaled
cells. Factors are clamped to ANCHOR_FACTORS: a wider one says the measurement, not the cells,
was off. Compiled measurements (CUDA) are not anchored: there the cells, CUDA-graph replays of the
compiled layers, predict the Llama-shaped stacks within a few percent.
"""

from __future__ import annotations

from autoao import search_space
from autoao.cost import CostModel
from autoao.plan import Plan
from autoao.records import AnchorRecord

ANCHOR_FACTORS = (0.25, 4.0)


def anchor(cost: CostModel, name: str, plan: Plan, speedup: float, rounds: int) -> tuple[CostModel, AnchorRecord]:
    """`cost` with candidate `name`'s cells, and those of its variants that run the same kernels
    (Candidate.timing_name), scaled so that `plan` (uniform `name`) predicts `speedup`, measured in
    `rounds` interleaved rounds; and the record of it."""
    whole = cost.predict(Plan())
    changed, unchanged = cost.split(plan)
    low, high = ANCHOR_FACTORS
    factor = min(high, max(low, (whole / speedup - unchanged) / changed)) if changed > 0 else 1.0
    timing = search_space.get(name).timing_name
    names = {n for per in cost.layer_us.values() for n in per if search_space.get(n).timing_name == timing}
    record = AnchorRecord(name, len(plan.layers), rounds, speedup, whole / cost.predict(plan), factor)
    return cost.scaled({n: factor for n in names}), record
