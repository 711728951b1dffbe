"""`bf16`: the baseline. A bf16 layer is left untouched; an fp32/fp16 layer is computed in bf16."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from autoao.calibration import LayerStats
from autoao.kernels import Bf16Linear
from autoao.search_space._base import Candidate, LayerSpec
from autoao.search_space._registry import register


@register
@dataclass(frozen=True)
class Bf16(Candidate):
    family: ClassVar[str] = "bf16"
    module_cls: ClassVar = Bf16Linear
    summary: ClassVar[str] = "the layer as it came (the baseline)"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "cuBLAS", "cpu": "torch's CPU matmul (oneDNN / MKL)"}
    sqnr_bound_db: ClassVar[float] = 40

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        return None

    @property
    def fusable(self) -> bool:
        return False  # the baseline keeps the model's own layers (a bf16 model's are not replaced)

    def build(self, linear: nn.Linear, stats: LayerStats | None = None, fqn: str = "") -> nn.Module:
        if linear.weight.dtype == torch.bfloat16:
            return linear  # already the baseline: no copy, no change
        return super().build(linear, stats, fqn)

    def empty(self, layer: LayerSpec, device: torch.device | str) -> nn.Module:
        if layer.dtype == torch.bfloat16:
            return nn.Linear(layer.in_features, layer.out_features, layer.bias, device=device, dtype=layer.dtype)
        return super().empty(layer, device)
