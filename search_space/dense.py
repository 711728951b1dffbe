"""`bf16`: the baseline, every layer as it came (the name is the common case: a bf16 model; an
fp32 or fp16 layer stays fp32 or fp16, so the cost model's baseline cells time what the unchanged
model runs). `bf16_compute`: an fp32/fp16 layer's weights cast to bf16 and multiplied in bf16.
`fp32_compute`: a bf16/fp16 layer's own weights, multiplied in fp32 where that is faster (CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from autoao.calibration import LayerStats
from autoao.kernels import Bf16Linear, Fp32ComputeLinear
from autoao.search_space._base import Candidate, LayerSpec
from autoao.search_space._registry import register
from autoao.search_space.schemes import Refused, register_scheme


@register
@dataclass(frozen=True)
class Bf16(Candidate):
    family: ClassVar[str] = "bf16"
    module_cls: ClassVar = None  # the model's own nn.Linear
    summary: ClassVar[str] = "the layer as it came (the baseline)"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "cuBLAS", "cpu": "torch's CPU matmul (oneDNN / MKL: bf16 {bf16_mm}, fp32 {fp32_mm})"}
    sqnr_bound_db: ClassVar[float] = 40

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        return None

    def build(self, linear: nn.Linear, stats: LayerStats | None = None, fqn: str = "") -> nn.Module:
        return linear  # the baseline: no copy, no change (and no module class: never fused)

    def empty(self, layer: LayerSpec, device: torch.device | str) -> nn.Module:
        return nn.Linear(layer.in_features, layer.out_features, layer.bias, device=device, dtype=layer.dtype)


@register
@dataclass(frozen=True)
class Bf16Compute(Candidate):
    family: ClassVar[str] = "bf16_compute"
    module_cls: ClassVar = Bf16Linear
    summary: ClassVar[str] = "an fp32 / fp16 layer's weights cast to bf16, multiplied in bf16"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "cuBLAS", "cpu": "torch's bf16 matmul ({bf16_mm})"}
    sqnr_bound_db: ClassVar[float] = 40

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        if layer.dtype == torch.bfloat16:
            return "the layer already computes in bf16"
        return None


@register
@dataclass(frozen=True)
class Fp32Compute(Candidate):
    family: ClassVar[str] = "fp32_compute"
    module_cls: ClassVar = Fp32ComputeLinear
    summary: ClassVar[str] = "the layer's own weights, multiplied in fp32 where that is faster"
    kernel_summary: ClassVar[dict[str, str]] = {
        "cpu": "fp32 matmul on an fp32 copy of the weight ({fp32_mm}) or the layer's own ({bf16_mm}); "
               "timing picks per layer and token count"}
    sqnr_bound_db: ClassVar[float] = 40

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        if layer.dtype == torch.float32:
            return "the layer already computes in float32"
        if device.type != "cpu":
            return "on a GPU bf16/fp16 tensor cores beat fp32; a CPU-only candidate"
        return None


register_scheme(Bf16, None)  # left as it came: listed in `ignore`, stored in the model's dtype
_DTYPE_REFUSAL = ("changes one layer's compute dtype; a checkpoint stores unquantized layers in the model's one "
                  "dtype, so an engine would not compute it as planned")
register_scheme(Bf16Compute, Refused(f"bf16_compute {_DTYPE_REFUSAL}"))
register_scheme(Fp32Compute, Refused(f"fp32_compute {_DTYPE_REFUSAL}"))
