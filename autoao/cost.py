"""The latency cost model: a plan's predicted time from cached per-layer timings.

    predicted(plan) = rest + sum over layers of sum over the layer's calls of time(candidate, M_call)

where `rest` (attention, norms, embeddings, ... everything that is not a linear layer) is the
measured end-to-end bf16 time minus the bf16 layer times. It is additive by construction; the
report puts the prediction next to the measured end-to-end time of the final plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoao.evaluators.timing import LatencyTable
from autoao.plan import Plan
from autoao.profile import ModelProfile

BASELINE = "bf16"


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

    @classmethod
    def build(cls, profile: ModelProfile, table: LatencyTable, rest_us: float = 0.0) -> CostModel:
        """From a profile and a LatencyTable that holds every (layer shape, M) of the profile."""
        layer_us: dict[str, dict[str, float]] = {}
        emulated: dict[str, set[str]] = {}
        calls = layer_calls(profile)
        names = list(dict.fromkeys(r.candidate for r in table.rows))
        for layer in profile.layers:
            k, n = layer.in_features, layer.out_features
            per = {}
            for name in names:
                total = 0.0
                for m, count in calls[layer.fqn].items():
                    t = table.get(name, m, k, n)
                    total += count * t.median_us
                    if t.emulated:
                        emulated.setdefault(layer.fqn, set()).add(name)
                per[name] = total
            layer_us[layer.fqn] = per
        return cls(layer_us, emulated, rest_us)

    def baseline_us(self) -> float:
        """Sum of the bf16 layer times (the linear part of the bf16 model)."""
        return sum(per[BASELINE] for per in self.layer_us.values())

    def with_rest_from(self, measured_bf16_us: float) -> CostModel:
        """Set `rest` from the measured end-to-end bf16 time."""
        return CostModel(self.layer_us, self.emulated, max(measured_bf16_us - self.baseline_us(), 0.0))

    def predict(self, plan: Plan) -> float:
        """Predicted us of one forward with `plan` (layers not in the plan count as bf16)."""
        total = self.rest_us
        for fqn, per in self.layer_us.items():
            cand = plan.layers.get(fqn)
            total += per[cand.name if cand is not None else BASELINE]
        return total
