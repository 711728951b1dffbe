"""`int8_dyn(algorithm)` (int8 weights x int8 per-token activations; rtn | smoothquant) and
`int8_wo(algorithm)` (int8 weight-only; rtn | gptq)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from autoao.kernels import Int8DynLinear, Int8WeightOnlyLinear
from autoao.kernels.cpu_int8 import engine_missing
from autoao.search_space._base import Candidate, LayerSpec, algorithm_field, multiple_reason
from autoao.search_space._registry import register
from autoao.search_space.schemes import W8A8_INT8, W8A16, CtScheme, Refused, register_scheme


def int_mm_reason(layer: LayerSpec, device: torch.device) -> str | None:
    """torch._int_mm on CUDA (cuBLASLt int8) needs K and N multiples of 8."""
    if device.type != "cuda":
        return None
    return (multiple_reason("K", layer.in_features, 8, "cuBLASLt int8 needs it")
            or multiple_reason("N", layer.out_features, 8, "cuBLASLt int8 needs it"))


@register
@dataclass(frozen=True)
class Int8Dyn(Candidate):
    family: ClassVar[str] = "int8_dyn"
    module_cls: ClassVar = Int8DynLinear
    summary: ClassVar[str] = "int8 per-channel weights x int8 dynamic activations (per token; act=tensor: one scale per call)"
    kernel_summary: ClassVar[dict[str, str]] = {
        "cuda": "torch._int_mm + fused Triton quantization",
        "cpu": "per token: torch._int_mm (oneDNN, {onednn_int8}) or the int8 values in one bf16 matmul "
               "({bf16_mm}); act=tensor: torch's prepacked "
               "dynamic linear, fbgemm ({fbgemm}) or oneDNN ({onednn_int8}), timing picks per layer"}
    sqnr_bound_db: ClassVar[float] = 35
    product_rate: ClassVar[float] = 2.0
    variants: ClassVar[tuple[dict, ...]] = ({}, {"act": "tensor"})

    # activation scales: "token" (one per row) or "tensor" (one per call, CPU only); the per-token
    # default is left out of the name ("int8_dyn"), as plans and caches know it
    act: str = dataclasses.field(default="token", metadata={"omit_default": True})
    algorithm: str = algorithm_field()  # rtn | smoothquant

    def __post_init__(self) -> None:
        if self.act not in Int8DynLinear.ACTS:
            raise ValueError(f"int8_dyn: act must be one of {', '.join(Int8DynLinear.ACTS)}, got {self.act!r}")
        self._check_algorithm()

    def _module_params(self) -> dict:
        return {**self.params(), "act": self.act}

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        if self.act == "tensor":
            if device.type != "cpu":
                return "per-tensor activations run on torch's CPU kernels (fbgemm / oneDNN) only"
            return engine_missing("fbgemm") and engine_missing("onednn")
        return int_mm_reason(layer, device)


@register
@dataclass(frozen=True)
class Int8WO(Candidate):
    family: ClassVar[str] = "int8_wo"
    module_cls: ClassVar = Int8WeightOnlyLinear
    summary: ClassVar[str] = "int8 per-channel weights, activations in model dtype"
    kernel_summary: ClassVar[dict[str, str]] = {
        "cuda": "compiled: Triton GEMV (M <= 8); eagerly one CUDA kernel (M <= 64); else dequantize + matmul",
        "cpu": "torch._weight_int8pack_mm ({aten}) or the weight cast to bf16 for one matmul ({bf16_mm}); "
               "timing picks per layer and token count"}
    sqnr_bound_db: ClassVar[float] = 38

    algorithm: str = algorithm_field()  # rtn | gptq

    def __post_init__(self) -> None:
        self._check_algorithm()

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        if device.type == "cpu" and layer.dtype == torch.bfloat16:
            # torch._weight_int8pack_mm segfaults for bf16 inputs with K % 16 != 0 (torch 2.13, measured)
            return multiple_reason("K", layer.in_features, 16, "the CPU int8 weight-only kernel needs it for bf16")
        return None


def _int8_dyn_scheme(c: Int8Dyn) -> CtScheme | Refused:
    if c.act != "token":
        return Refused("int8_dyn(act=tensor) quantizes activations asymmetrically (uint8) with one scale per call; "
                       "compressed-tensors engines quantize int8 activations symmetrically per token")
    if c.algorithm == "smoothquant":
        return Refused("SmoothQuant divides the layer's input by a per-channel scale [K] that compressed-tensors "
                       "has no tensor for")
    return W8A8_INT8


register_scheme(Int8Dyn, _int8_dyn_scheme)
register_scheme(Int8WO, W8A16)  # rtn and gptq: per-channel scales, no input scale
