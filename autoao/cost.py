"""The latency cost model: a plan's predicted time from cached per-layer timings.

    predicted(plan) = rest + sum over layers of sum over the layer's calls of time(candidate, M_call)

where a fused group of sibling layers (Plan.fusions) counts once, at the time of its fused shape
(N = the members' N summed), instead of its members' times, and `rest` (attention, norms,
embeddings, ... everything that is not a linear layer) is the measured end-to-end bf16 time minus
the bf16 layer times. It is additive by construction; the report puts the prediction next to the
measured end-to-end time of the final plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoao.common import BASELINE
from autoao.evaluators.timing import LatencyTable, Timing
from autoao.plan import Plan
from autoao.profile import ModelProfile



def conservative_us(t: Timing, base: Timing | None) -> float:
    """The time the cost model uses for one candidate cell, next to the baseline's cell of the same
    layer shape and M (`base`; None for the baseline itself, or where it was not timed). Disturbed
    samples only ever run long, so a cell without enough undisturbed samples may overstate either
    side. Where both cells are reliable, the candidate's median. Where both are unreliable but
    bounded by a clean single-thread time (Timing.bounded), the two single-thread times were measured
    alike: the candidate costs the baseline's estimate times their ratio. Otherwise a candidate is
    credited only the speed-up its bounds guarantee (its most below the baseline's least), and is
    never cheaper than the baseline's estimate without one: a disturbed timing never buys a plan a
    speed-up it may not have."""
    if base is None:
        return t.median_us if t.reliable else math.inf  # an unreliable fused-shape timing: never fused
    if t.reliable and base.reliable:
        return t.median_us
    base_us = baseline_us(base)
    if t.bounded and base.bounded:
        return base_us * t.single_us / base.single_us
    if t.high_us < base.low_us:
        return base_us - (base.low_us - t.high_us)
    return max(t.high_us, base_us)


def baseline_us(t: Timing) -> float:
    """The time the cost model uses for a baseline cell: its median, or for an unreliable cell the
    most its undisturbed time can be (Timing.high_us: the single-thread time caps a busy machine's
    inflated samples)."""
    return t.median_us if t.reliable else t.high_us


def layer_calls(profile: ModelProfile) -> dict[str, dict[int, int]]:
    """FQN -> {M: number of calls with M rows} from the profiled activation shapes."""
    out: dict[str, dict[int, int]] = {}
    for layer in profile.layers:
        calls: dict[int, int] = {}
        for shape, count in layer.shapes.items():
            m = 1
            for d in shape[:-1]:
                m *= d
            calls[m] = calls.get(m, 0) + count
        out[layer.fqn] = calls
    return out


def token_counts(profile: ModelProfile) -> list[int]:
    """Every distinct M (rows per call) any layer saw: what to time."""
    return sorted({m for calls in layer_calls(profile).values() for m in calls})


@dataclass
class CostModel:
    """Per-layer, per-candidate predicted time (us) for one forward over the profiled inputs."""

    layer_us: dict[str, dict[str, float]]  # FQN -> candidate name -> us (inf: unsupported/failed)
    emulated: dict[str, set[str]] = field(default_factory=dict)  # FQN -> emulated candidate names
    rest_us: float = 0.0  # everything that is not a linear layer, measured
    # sibling group (FQNs, call order) -> candidate name -> us of the group as one fused module
    fused_us: dict[tuple[str, ...], dict[str, float]] = field(default_factory=dict)

    @classmethod
    def build(cls, profile: ModelProfile, table: LatencyTable, rest_us: float = 0.0) -> CostModel:
        """From a profile and a LatencyTable that holds every (layer shape, M) of the profile, and
        for fused times each sibling group's fused shape (fused_shape); a candidate not timed on a
        group's fused shape is never fused there."""
        layer_us: dict[str, dict[str, float]] = {}
        emulated: dict[str, set[str]] = {}
        calls = layer_calls(profile)
        names = list(dict.fromkeys(r.candidate for r in table.rows))

        def total(name: str, k: int, n: int, fqn: str) -> float:
            out = 0.0
            for m, count in calls[fqn].items():
                t = table.get(name, m, k, n)
                if name == BASELINE:
                    out += count * baseline_us(t)
                else:
                    out += count * conservative_us(t, table.find(BASELINE, m, k, n))
                if t.emulated:
                    emulated.setdefault(fqn, set()).add(name)
            return out

        for layer in profile.layers:
            layer_us[layer.fqn] = {name: total(name, layer.in_features, layer.out_features, layer.fqn)
                                   for name in names}
        fused_us: dict[tuple[str, ...], dict[str, float]] = {}
        for group in profile.siblings:
            k, n = fused_shape(profile, group)
            per = {}
            for name in names:
                try:
                    per[name] = total(name, k, n, group[0])
                except KeyError:  # not timed (a candidate that does not fuse): never fused
                    continue
            if per:
                fused_us[group] = per
        return cls(layer_us, emulated, rest_us, fused_us)

    def scaled(self, factors: dict[str, float]) -> CostModel:
        """This model with each candidate's times (layers and fused groups) multiplied by its factor
        in `factors` (candidate name -> factor; others unchanged)."""
        def scale(per: dict[str, float]) -> dict[str, float]:
            return {name: us * factors.get(name, 1.0) for name, us in per.items()}
        return CostModel({f: scale(per) for f, per in self.layer_us.items()}, self.emulated, self.rest_us,
                         {g: scale(per) for g, per in self.fused_us.items()})

    def split(self, plan: Plan) -> tuple[float, float]:
        """(us of the plan's changed layers, us of everything else) in `predict(plan)`."""
        total = self.predict(plan)
        unchanged = self.predict(Plan()) - sum(self.layer_us[f][BASELINE] for f in plan.layers if f in self.layer_us)
        return total - unchanged, unchanged

    def fusion_pays(self, group: tuple[str, ...], name: str) -> bool:
        """True if the sibling group runs faster as one fused `name` module than layer by layer."""
        fused = self.fused_us.get(tuple(group), {}).get(name, math.inf)
        return fused < sum(self.layer_us[f][name] for f in group)

    def baseline_us(self) -> float:
        """Sum of the bf16 layer times (the linear part of the bf16 model)."""
        return sum(per[BASELINE] for per in self.layer_us.values())

    def with_rest_from(self, measured_bf16_us: float) -> CostModel:
        """Set `rest` from the measured end-to-end bf16 time."""
        return CostModel(self.layer_us, self.emulated, max(measured_bf16_us - self.baseline_us(), 0.0),
                         self.fused_us)

    def predict(self, plan: Plan) -> float:
        """Predicted us of one forward with `plan` (layers not in the plan count as bf16; a fusion
        the model has no fused time for counts as its members)."""
        total = self.rest_us
        counted: set[str] = set()
        for group in plan.fusions:
            fused = self.fused_us.get(tuple(group), {}).get(plan.layers[group[0]].name)
            if fused is not None:
                total += fused
                counted.update(group)
        for fqn, per in self.layer_us.items():
            if fqn not in counted:
                cand = plan.layers.get(fqn)
                total += per[cand.name if cand is not None else BASELINE]
        return total


def fused_shape(profile: ModelProfile, group: tuple[str, ...]) -> tuple[int, int]:
    """(K, N) of a sibling group run as one module: the shared K, the members' N summed."""
    by_fqn = profile.by_fqn()
    return by_fqn[group[0]].in_features, sum(by_fqn[f].out_features for f in group)
