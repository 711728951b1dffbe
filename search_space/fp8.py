"""`fp8_dyn(granularity)`: fp8 e4m3 weights x fp8 dynamic activations (torch._scaled_mm)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from autoao.kernels import Fp8DynLinear, Fp8WeightOnlyLinear
from autoao.kernels.fp8 import GRANULARITIES
from autoao.search_space._base import Candidate, LayerSpec, capability_reason, multiple_reason
from autoao.search_space._registry import register
from autoao.search_space.schemes import FP8_DYNAMIC, FP8_DYNAMIC_TENSOR, FP8_W8A16, register_scheme


def fp8_reason(layer: LayerSpec, device: torch.device, min_capability: tuple[int, int]) -> str | None:
    if device.type != "cuda":
        return None
    return (capability_reason(device, min_capability, "fp8")
            or multiple_reason("K", layer.in_features, 16, "fp8 matmul needs it")
            or multiple_reason("N", layer.out_features, 16, "fp8 matmul needs it"))


FP8_CPU_EMULATION = "no fp8 matrix unit on CPU: torch._scaled_mm upconverts (emulated)"


@register
@dataclass(frozen=True)
class Fp8Dyn(Candidate):
    family: ClassVar[str] = "fp8_dyn"
    module_cls: ClassVar = Fp8DynLinear
    summary: ClassVar[str] = "fp8 e4m3 weights x fp8 dynamic activations"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "torch._scaled_mm", "cpu": "emulated product in fp32"}
    sqnr_bound_db: ClassVar[float] = 25
    product_rate: ClassVar[float] = 2.0
    variants: ClassVar[tuple[dict, ...]] = tuple({"granularity": g} for g in GRANULARITIES)

    granularity: str = "row"  # "row": per-channel weights and per-token activations; "tensor": one scale each

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"fp8_dyn: granularity must be one of {list(GRANULARITIES)}, got {self.granularity!r}")

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        # Rowwise scaling in torch._scaled_mm is an sm90 kernel; tensorwise runs from sm89.
        return fp8_reason(layer, device, (9, 0) if self.granularity == "row" else (8, 9))

    def _emulation_reason(self, device: torch.device) -> str:
        return FP8_CPU_EMULATION


@register
@dataclass(frozen=True)
class Fp8WO(Candidate):
    family: ClassVar[str] = "fp8_wo"
    module_cls: ClassVar = Fp8WeightOnlyLinear
    summary: ClassVar[str] = "fp8 e4m3 per-channel weights, activations in model dtype"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "compiled: Triton GEMV (M <= 8); eagerly one CUDA kernel (M <= 64); else dequantize + matmul", "cpu": "dequantize + matmul (emulated)"}
    sqnr_bound_db: ClassVar[float] = 25

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        return capability_reason(device, (8, 9), "e4m3 conversion")

    def _emulation_reason(self, device: torch.device) -> str:
        return "no fp8 weight-only kernel on CPU: the weight is dequantized for every call (emulated)"


register_scheme(Fp8Dyn, lambda c: FP8_DYNAMIC if c.granularity == "row" else FP8_DYNAMIC_TENSOR)
register_scheme(Fp8WO, FP8_W8A16)
