"""Tensor helpers the kernels share: tokens flattened to rows and back, bias, padding, storage."""

from __future__ import annotations

import torch

from autoao.kernels.ops import cdiv


def flatten_tokens(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [M, K] (a view when possible)."""
    return x.reshape(-1, x.shape[-1])


def unflatten_tokens(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y [M, N] -> [..., N] with x's leading dims."""
    return y.reshape(*x.shape[:-1], y.shape[-1])


def needs_grad(x: torch.Tensor) -> bool:
    """Whether autograd records what is computed from x here: x requires grad and grad mode is on
    (under no_grad or inference_mode it records nothing, and the kernels without a backward serve)."""
    return x.requires_grad and torch.is_grad_enabled()


def add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y [..., N] + bias [N] in y's dtype; y when there is no bias."""
    return y if bias is None else y + bias.to(y.dtype)


def pad_rows(x: torch.Tensor, multiple: int, minimum: int = 0) -> torch.Tensor:
    """Zero-pad x [M, K] to at least `minimum` rows and a multiple of `multiple` rows.

    Some kernels (torch._int_mm on CUDA: M > 16; cuSPARSELt: M % 16 == 0) refuse small or odd M;
    decode has M = 1. The padded rows are sliced off the output by the caller.
    """
    m = x.shape[0]
    target = max(m, minimum)
    target = cdiv(target, multiple) * multiple
    return x if target == m else torch.nn.functional.pad(x, (0, 0, 0, target - m))


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b view one storage (also on "meta", where every data pointer is 0)."""
    return a.device == b.device and a.untyped_storage()._cdata == b.untyped_storage()._cdata
