"""Each candidate family's compressed-tensors scheme, registered next to the family's definition.

    register_scheme(Int8WO, W8A16)                              # every int8_wo holds as W8A16
    register_scheme(Int4WO, Refused("float zero points ..."))   # no int4_wo does
    register_scheme(Fp8Dyn, lambda c: FP8_DYNAMIC if c.granularity == "row" else FP8_DYNAMIC_TENSOR)
    scheme_of(candidate)      # CtScheme, Refused (why the format cannot hold it), or None (left as it came)

A scheme says what one layer is in a compressed-tensors checkpoint (what vLLM, SGLang and
transformers load): its format and quantization args, as compressed_tensors.QuantizationArgs
fields. A scheme holds autoao's canonical tensors unchanged, so a family registers one only where
the format can hold its numbers exactly; otherwise a `Refused` with the reason. A family that
registers nothing is refused with a generic reason. This module imports no compressed-tensors
(autoao.export.compressed_tensors writes the checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from autoao.search_space._base import Candidate


@dataclass(frozen=True)
class CtScheme:
    """What one layer is in a compressed-tensors checkpoint: its format and quantization args (as
    compressed_tensors.QuantizationArgs fields), plus the engines' usual name for it."""

    label: str  # e.g. "W8A16", "W8A8-INT8 dynamic", "FP8 dynamic"
    format: str  # "pack-quantized" | "int-quantized" | "float-quantized"
    weights: tuple[tuple[str, Any], ...]
    input_activations: tuple[tuple[str, Any], ...] | None = None

    def args(self) -> dict[str, Any]:
        """{"weights": {...}, "input_activations": {...} or None}: the QuantizationScheme fields."""
        return {"weights": dict(self.weights),
                "input_activations": None if self.input_activations is None else dict(self.input_activations)}

    @property
    def weight_only(self) -> bool:
        return self.input_activations is None


@dataclass(frozen=True)
class Refused:
    """A candidate the compressed-tensors format cannot hold exactly; `reason` says why, a sentence
    for the report and for errors."""

    reason: str


Scheme = CtScheme | Refused | None  # None: the layer is left as it came (listed in `ignore`)
Rule = CtScheme | Refused | None | Callable[[Any], "CtScheme | Refused | None"]

_RULES: dict[str, Rule] = {}


def register_scheme(cls: type[Candidate], rule: Rule) -> None:
    """Register the scheme of every candidate of family `cls`: a scheme, a refusal, None (left as
    it came), or a function of the candidate (its parameters) returning one of those."""
    if cls.family in _RULES:
        raise ValueError(f"candidate family {cls.family!r} registers its compressed-tensors scheme twice")
    _RULES[cls.family] = rule


def scheme_of(candidate: Candidate | None) -> Scheme:
    """The compressed-tensors scheme that holds `candidate`'s numbers exactly; None for a layer left
    as it came (no candidate, or one whose family registers None); a Refused saying why the format
    cannot hold it."""
    if candidate is None:
        return None
    rule = _RULES.get(candidate.family, Refused(f"no compressed-tensors scheme holds {candidate.name}"))
    return rule(candidate) if callable(rule) else rule


def args(num_bits: int, type_: str, strategy: str, *, dynamic: bool = False, symmetric: bool = True,
         group_size: int | None = None) -> tuple[tuple[str, Any], ...]:
    """QuantizationArgs fields, in a hashable form."""
    return (("num_bits", num_bits), ("type", type_), ("symmetric", symmetric), ("strategy", strategy),
            ("dynamic", dynamic), ("group_size", group_size))


def w4a16(group_size: int) -> CtScheme:
    """int4 group-wise symmetric weights (int4_sym)."""
    return CtScheme(f"W4A16 (int4 symmetric, group {group_size})", "pack-quantized",
                    args(4, "int", "group", group_size=group_size))


W8A16 = CtScheme("W8A16 (int8 weight-only, per channel)", "pack-quantized", args(8, "int", "channel"))
W8A8_INT8 = CtScheme("W8A8-INT8 (dynamic per-token activations)", "int-quantized", args(8, "int", "channel"),
                     args(8, "int", "token", dynamic=True))
FP8_DYNAMIC = CtScheme("FP8 dynamic (per-channel weights, per-token activations)", "float-quantized",
                       args(8, "float", "channel"), args(8, "float", "token", dynamic=True))
FP8_DYNAMIC_TENSOR = CtScheme("FP8 dynamic (per-tensor weights and activations)", "float-quantized",
                              args(8, "float", "tensor"), args(8, "float", "tensor", dynamic=True))
FP8_W8A16 = CtScheme("FP8 weight-only (per channel)", "float-quantized", args(8, "float", "channel"))
