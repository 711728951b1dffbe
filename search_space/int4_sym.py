"""`int4_sym(group_size, algorithm)`: symmetric int4 group-wise weight-only (w = (q - 8) * scale),
the int4 compressed-tensors checkpoints hold exactly (W4A16, pack-quantized), so vLLM, SGLang and
transformers compute its very numbers; it runs on int4_wo's kernels (kernels/int4_sym.py). A
candidate of the compressed-tensors targets (autoao.export.targets): the default search space holds
none (`variants` is empty); int4_wo, with a float zero per group, covers autoao's own runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autoao.kernels.int4_sym import Int4SymmetricLinear
from autoao.search_space._registry import register
from autoao.search_space.int4 import Int4WO
from autoao.search_space.schemes import register_scheme, w4a16


@register
@dataclass(frozen=True)
class Int4Symmetric(Int4WO):
    family: ClassVar[str] = "int4_sym"
    module_cls: ClassVar = Int4SymmetricLinear
    summary: ClassVar[str] = "int4 group-wise symmetric weights (compressed-tensors W4A16), bf16 activations"
    sqnr_bound_db: ClassVar[float] = 16  # one bit of range less than int4_wo's min/max grid
    variants: ClassVar[tuple[dict, ...]] = ()  # the compressed-tensors targets list them


register_scheme(Int4Symmetric, lambda c: w4a16(c.group_size))  # rtn and gptq alike: symmetric codes, bf16 scales
