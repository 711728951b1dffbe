"""`int4_wo(group_size, algorithm)`: int4 group-wise asymmetric weight-only (tinygemm or autoao's
Triton GEMV on CUDA, timing picks; the CPU int4 kernel), its numbers by round-to-nearest, GPTQ,
AWQ or HQQ (kernels/algorithms.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from autoao.kernels import Int4WeightOnlyLinear
from autoao.kernels.int4 import GROUP_SIZES
from autoao.search_space._base import Candidate, LayerSpec, algorithm_field, capability_reason, multiple_reason
from autoao.search_space._registry import register
from autoao.search_space.schemes import Refused, register_scheme


@register
@dataclass(frozen=True)
class Int4WO(Candidate):
    family: ClassVar[str] = "int4_wo"
    module_cls: ClassVar = Int4WeightOnlyLinear
    summary: ClassVar[str] = "int4 group-wise asymmetric weights, bf16 activations"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "tinygemm, autoao's CUDA and Triton GEMVs (timing picks per layer)", "cpu": "_weight_int4pack_mm_for_cpu ({aten}) or dequantize + bf16 matmul ({bf16_mm}); timing picks per layer and token count"}
    sqnr_bound_db: ClassVar[float] = 18
    # Round-to-nearest by default; GPTQ, AWQ and HQQ are asked for by name (candidates=, --candidates):
    # a calibrated plan re-applies only with the same calibration statistics (apply's calibration=;
    # a saved model keeps the fitted numbers), and its fits take budget (0.3-0.6 s a layer on a
    # 2-core CPU, 0.7-3.4 s for Llama-3-8B's layers on a datacenter GPU: docs/candidates.md#calibrated-algorithms)
    variants: ClassVar[tuple[dict, ...]] = tuple({"group_size": g} for g in GROUP_SIZES)

    group_size: int = 128  # input channels sharing one scale and zero: 32, 64 or 128
    algorithm: str = algorithm_field()  # rtn | awq | gptq | hqq

    def __post_init__(self) -> None:
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"int4_wo: group_size must be one of {list(GROUP_SIZES)}, got {self.group_size!r}")
        self._check_algorithm()

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        if layer.in_features % self.group_size:
            return f"K={layer.in_features} not a multiple of group size {self.group_size}"
        if device.type == "cpu":
            return multiple_reason("N", layer.out_features, 16, "the CPU int4 packing needs it")
        return (capability_reason(device, (8, 0), "tinygemm")
                or multiple_reason("N", layer.out_features, 8, "tinygemm needs it"))


# int4_sym, symmetric, is the int4 the compressed-tensors targets search
register_scheme(Int4WO, Refused(
    "int4_wo stores float zero points (w = (q - 8) * scale + zero, tinygemm's convention); compressed-tensors "
    "stores integer zero points, so its codes cannot be written exactly (int4_sym, symmetric, can)"))
