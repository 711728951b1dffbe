"""2:4 sparsity families: `sparse24`, `sparse24_int8_dyn(algorithm)` (rtn | smoothquant),
`sparse24_fp8` (cuSPARSELt on CUDA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from autoao.kernels import Sparse24Fp8DynLinear, Sparse24Int8DynLinear, Sparse24Linear
from autoao.search_space._base import Candidate, LayerSpec, algorithm_field, capability_reason, multiple_reason
from autoao.search_space._registry import register
from autoao.search_space.fp8 import fp8_reason
from autoao.search_space.int8 import int_mm_reason
from autoao.search_space.schemes import Refused, register_scheme

SPARSE_CPU_EMULATION = "2:4 has no CPU kernel: emulated with the dense pruned weight"


def sparse24_reason(layer: LayerSpec, device: torch.device) -> str | None:
    """Pruning needs K % 4; cuSPARSELt needs sm80+, and we keep K % 64 and N % 32 (its tile
    constraints for every dtype it takes, int8 and fp8 included)."""
    reason = multiple_reason("K", layer.in_features, 4, "2:4 groups run along K")
    if reason or device.type != "cuda":
        return reason
    if not torch.backends.cusparselt.is_available():
        return "this torch build has no cuSPARSELt"
    return (capability_reason(device, (8, 0), "2:4 (sparse tensor cores)")
            or multiple_reason("K", layer.in_features, 64, "cuSPARSELt tiles")
            or multiple_reason("N", layer.out_features, 32, "cuSPARSELt tiles"))


class _Sparse(Candidate):
    product_rate: ClassVar[float] = 2.0  # 2:4-sparse operands; their 8-bit families set 4

    def stored_bits(self, layer: LayerSpec) -> float:
        """Half the dense format's values and a 2-bit position per kept value (cuSPARSELt's layout;
        the module built on the meta device holds the dense weight)."""
        return super().stored_bits(layer) / 2 + 1.0

    def _emulation_reason(self, device: torch.device) -> str:
        return SPARSE_CPU_EMULATION


@register
@dataclass(frozen=True)
class Sparse24(_Sparse):
    family: ClassVar[str] = "sparse24"
    module_cls: ClassVar = Sparse24Linear
    summary: ClassVar[str] = "2:4-pruned weights (Wanda/magnitude), model-dtype activations"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "cuSPARSELt", "cpu": "dense matmul on the pruned weight (emulated)"}
    sqnr_bound_db: ClassVar[float] = 40

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        return sparse24_reason(layer, device)


@register
@dataclass(frozen=True)
class Sparse24Int8Dyn(_Sparse):
    family: ClassVar[str] = "sparse24_int8_dyn"
    module_cls: ClassVar = Sparse24Int8DynLinear
    summary: ClassVar[str] = "2:4-pruned int8 weights x int8 per-token activations"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "cuSPARSELt int8", "cpu": "torch._int_mm on the pruned weight (emulated)"}
    sqnr_bound_db: ClassVar[float] = 35
    product_rate: ClassVar[float] = 4.0

    algorithm: str = algorithm_field()  # rtn | smoothquant

    def __post_init__(self) -> None:
        self._check_algorithm()

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        return sparse24_reason(layer, device) or int_mm_reason(layer, device)


@register
@dataclass(frozen=True)
class Sparse24Fp8(_Sparse):
    family: ClassVar[str] = "sparse24_fp8"
    module_cls: ClassVar = Sparse24Fp8DynLinear
    summary: ClassVar[str] = "2:4-pruned fp8 rowwise weights x fp8 per-token activations"
    kernel_summary: ClassVar[dict[str, str]] = {"cuda": "cuSPARSELt fp8 (sm90)", "cpu": "emulated product in fp32 on the pruned weight"}
    sqnr_bound_db: ClassVar[float] = 25
    product_rate: ClassVar[float] = 4.0

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        reason = sparse24_reason(layer, device) or fp8_reason(layer, device, (9, 0))
        if reason or device.type != "cuda":
            return reason
        version = torch.backends.cusparselt.version() or 0
        if version < 602:  # fp8 e4m3 arrived in cuSPARSELt 0.6.2
            return f"cuSPARSELt {version} has no fp8 kernels (needs >= 0.6.2)"
        return None


_SERVED_BY_NONE = Refused(
    "2:4 sparsity: no serving engine loads sparse compressed-tensors checkpoints (vLLM removed 2:4 support, "
    "compressed-tensors and transformers dropped sparse compression); it runs only in autoao's own runtime "
    "(autoao.save / autoao.load)")
for _family in (Sparse24, Sparse24Int8Dyn, Sparse24Fp8):
    register_scheme(_family, _SERVED_BY_NONE)
