"""Calibration statistics: what the profiler saw at each linear layer's input, as one object.

    prof = autoao.profile.profile(model, inputs)
    prof.calibration["layers.0.mlp.down_proj"].act_norm     # [K] float32
    autoao.apply(model, plan, calibration=prof.calibration)  # 2:4 pruning by Wanda, not magnitude

A quantized module declares which statistics it uses (`QuantizedLinear.calibration_uses`, shown
as `Candidate.calibration_uses`); `quantize(weight, stats)` reads only those, and falls back to
its calibration-free rule when one is absent (2:4 without `act_norm` prunes by magnitude). A new
statistic is a new field here and in the profiler's recorder. Imports nothing from autoao.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

STATISTICS = ("act_norm", "act_absmax", "sample")


@dataclass
class LayerStats:
    """One layer's input statistics over every row the calibration forwards fed it."""

    act_norm: torch.Tensor | None = None  # [K] float32: per-input-channel L2 norm (Wanda)
    act_absmax: torch.Tensor | None = None  # [K] float32: per-input-channel max |x|
    sample: torch.Tensor | None = None  # [S, K] layer dtype: a bounded sample of real input rows

    def __post_init__(self) -> None:
        for name in ("act_norm", "act_absmax"):
            t = getattr(self, name)
            if t is not None and t.dim() != 1:
                raise ValueError(f"{name} must be a [K] vector, got shape {tuple(t.shape)}")

    def present(self) -> frozenset[str]:
        """The statistics this record holds."""
        return frozenset(f.name for f in fields(self) if getattr(self, f.name) is not None)


@dataclass
class Calibration:
    """FQN -> LayerStats. A layer it has nothing for gets an empty LayerStats (every module then
    uses its calibration-free rule)."""

    layers: dict[str, LayerStats] = field(default_factory=dict)

    def __getitem__(self, fqn: str) -> LayerStats:
        return self.layers.get(fqn) or LayerStats()

    def __contains__(self, fqn: str) -> bool:
        return fqn in self.layers

    @classmethod
    def of(cls, calibration: Calibration | dict[str, torch.Tensor] | None) -> Calibration:
        """A Calibration from itself, None (nothing), or a plain FQN -> [K] activation-norm dict."""
        if calibration is None:
            return cls()
        if isinstance(calibration, Calibration):
            return calibration
        return cls({fqn: LayerStats(act_norm=t) for fqn, t in calibration.items()})
