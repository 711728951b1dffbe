"""Calibration statistics: what the profiler saw at each linear layer's input, as one object.

    prof = autoao.profile.profile(model, inputs)
    prof.calibration["layers.0.mlp.down_proj"].act_norm     # [K] float32
    autoao.apply(model, plan, calibration=prof.calibration)  # 2:4 pruning by Wanda, not magnitude

A quantized module declares which statistics it uses (`QuantizedLinear.calibration_uses`, shown
as `Candidate.calibration_uses`); `quantize(weight, stats)` reads only those, and falls back to
its calibration-free rule when one is absent (2:4 without `act_norm` prunes by magnitude). A new
statistic is a new field here and in the profiler's recorder. Imports nothing from autoao.

GPTQ's input Hessian X^T X is not stored: `LayerStats.hessian()` computes it from the bounded
sample when a layer is quantized, one layer at a time, so at most a few [K, K] float32 matrices
exist at once (GPTQ holds the Hessian and its Cholesky factor: 2 * 4 * K^2 bytes, 1.6 GB for a
14336-wide input; the stored statistics stay O(K) per layer plus the sample).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

STATISTICS = ("act_norm", "act_absmax", "act_mean", "sample")


@dataclass
class LayerStats:
    """One layer's input statistics over every row the calibration forwards fed it."""

    act_norm: torch.Tensor | None = None  # [K] float32: per-input-channel L2 norm (Wanda)
    act_absmax: torch.Tensor | None = None  # [K] float32: per-input-channel max |x|
    sample: torch.Tensor | None = None  # [S, K] layer dtype: a bounded sample of real input rows
    act_mean: torch.Tensor | None = None  # [K] float32: per-input-channel mean |x| (AWQ)
    # Fitted canonical tensors of calibrated quantizers (GPTQ, AWQ, ...) on these statistics, keyed
    # by the quantizer and the weight's identity, so a trial and the shipped plan fit a layer once
    # (kernels/algorithms.py); it lives as long as these statistics do.
    fits: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("act_norm", "act_absmax", "act_mean"):
            t = getattr(self, name)
            if t is not None and t.dim() != 1:
                raise ValueError(f"{name} must be a [K] vector, got shape {tuple(t.shape)}")

    def present(self) -> frozenset[str]:
        """The statistics this record holds."""
        return frozenset(name for name in STATISTICS if getattr(self, name) is not None)

    def hessian(self, device: torch.device | str | None = None) -> torch.Tensor | None:
        """[K, K] float32 X^T X / S of the sample (GPTQ's input Hessian, up to its factor 2), on
        `device` (default: the sample's); None without a sample. Computed on each call, never kept."""
        if self.sample is None or self.sample.shape[0] == 0:
            return None
        x = self.sample.to(device if device is not None else self.sample.device).float()  # [S, K]
        return x.t() @ x / x.shape[0]

    def subset(self, rows: slice) -> LayerStats:
        """These statistics recomputed from the sample's `rows` alone (to fit on some rows and
        measure on the others); without a sample, the same statistics."""
        if self.sample is None:
            return LayerStats(self.act_norm, self.act_absmax, None, self.act_mean)
        x = self.sample[rows]
        f = x.float()
        return LayerStats(f.square().sum(0).sqrt(), f.abs().amax(0) if len(f) else torch.zeros(f.shape[1]),
                          x, f.abs().mean(0) if len(f) else torch.zeros(f.shape[1]))


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
