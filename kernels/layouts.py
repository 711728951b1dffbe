"""A quantized layer's canonical tensors as typed records: what a writer (autoao.export) reads
without knowing the module's class. Each QuantizedLinear class names its record (`layout_type`);
`module.layout()` builds it from the canonical tensors (the same tensors, not copies).

    Dense         weight [N, K] in the layer's dtype (bf16, fp32 compute, 2:4 pruned)
    PerChannel    qweight [N, K] int8 / fp8 codes, scale [N] (or [] per tensor) float32
    GroupedInt4   qweight [N, K/2] uint8 (two 4-bit codes a byte: kernels/int4.py), scales, zeros [N, K/g] bf16
    GgufBlocks    blocks [N, row bytes] uint8: GGUF's own block encoding

An input-scaled algorithm's `act_scale` [K] is no part of a layout: a writer refuses such layers
by their scheme (search_space/schemes.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Dense:
    weight: torch.Tensor


@dataclass(frozen=True)
class PerChannel:
    qweight: torch.Tensor
    scale: torch.Tensor


@dataclass(frozen=True)
class GroupedInt4:
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor


@dataclass(frozen=True)
class GgufBlocks:
    blocks: torch.Tensor


Layout = Dense | PerChannel | GroupedInt4 | GgufBlocks


def layout_of(kind: type[Layout], canonical: dict[str, torch.Tensor]) -> Layout:
    """The record `kind` over a module's canonical tensors (its fields, by name)."""
    return kind(**{f.name: canonical[f.name] for f in fields(kind)})
