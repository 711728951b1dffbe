"""`gguf(type)`: a GGUF block type (Q8_0, Q4_0, Q4_1; Q6_K where K is a multiple of 256) as
llama.cpp computes it, activations
quantized to 8 bits per block of 32 included (kernels/gguf.py). Emulated on every device: these
are the llama.cpp target's candidates (autoao.export.targets), so its search measures the accuracy
of what llama.cpp will compute; the default search space holds none of them (`variants` is empty).
Their speed is never timed: the llama.cpp target prices them from their weight bytes (an estimate,
said to be one everywhere), never from the emulation. llama.cpp itself is called only by the
export, to check that the written file loads where it is installed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from autoao.kernels.gguf import TYPES, GgufLinear
from autoao.search_space._base import Candidate, LayerSpec, multiple_reason
from autoao.search_space._registry import register
from autoao.search_space.schemes import Refused, register_scheme


@register
@dataclass(frozen=True)
class Gguf(Candidate):
    family: ClassVar[str] = "gguf"
    module_cls: ClassVar = GgufLinear
    summary: ClassVar[str] = ("a GGUF block type (blocks of 32 inputs, fp16 scales), activations quantized "
                              "per block to 8 bits in every matmul, as llama.cpp computes it")
    kernel_summary: ClassVar[dict[str, str]] = {"cpu": "emulated in torch (llama.cpp runs it natively)",
                                                "cuda": "emulated in torch (llama.cpp runs it natively)"}
    # measured by tests/test_gguf_candidates.py on nn.Linear-initialised weights and Gaussian
    # inputs: Q8_0 ~40 dB, Q4_1 ~20 dB, Q4_0 ~18 dB (activations at 8 bits included)
    sqnr_bound_db: ClassVar[float] = 15
    # none in the default search space: the llama.cpp target lists them (autoao.export.targets)
    variants: ClassVar[tuple[dict, ...]] = ()

    type: str = "q8_0"  # the GGUF type, lower case: q8_0 | q4_0 | q4_1 | q6_k

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"gguf: type must be one of {', '.join(TYPES)}, got {self.type!r}")

    @property
    def ggml_name(self) -> str:
        """The type's name in llama.cpp, e.g. "Q4_0"."""
        return TYPES[self.type].name

    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None:
        block = TYPES[self.type].block
        return multiple_reason("K", layer.in_features, block, f"GGUF {self.ggml_name} blocks hold {block} inputs of a row")

    def _emulation_reason(self, device: torch.device) -> str:
        return f"GGUF {self.ggml_name}: emulated in torch on {device.type} (llama.cpp runs it natively)"


register_scheme(Gguf, Refused("a GGUF block type: export it with --format gguf (llama.cpp)"))
