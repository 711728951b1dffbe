"""Quantization primitives: plain-torch functions that turn float tensors into quantized ones.

Every quantized-linear module in this package is built from these, and every module's `reference()`
dequantizes with them, so the kernels and the references agree on one definition of each format:

- int8 symmetric, per output channel (weights) or per token (activations): q = round(x / s), s = amax / 127
- int4 asymmetric, group-wise along K (tinygemm's convention): w ~ (q - 8) * scale + zero, q in [0, 15]
- fp8 e4m3, per row or per tensor: q = fp8(x / s), s = amax / 448
- 2:4 pruning along K: in every group of 4 input channels keep the 2 with the largest score
  (Wanda: |W| * ||X_k||_2 when activation norms are given, else |W|)

Rounding is round-half-to-even everywhere (torch.round), which the Triton kernels reproduce exactly.
"""

from __future__ import annotations

import torch

from autoao.kernels.ops import call_op

# Smallest scale we allow; keeps all-zero rows/groups finite (they quantize to all zeros).
EPS = 1e-12
INT8_MAX = 127.0
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0


##### int8 ######################################################################################

def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] float -> (q: [N, K] int8, scale: [N] float32) with w ~ q * scale[:, None]."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=EPS) / INT8_MAX  # [N]
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] float -> (q: [M, K] int8, scale: [M, 1] float32), dynamic symmetric per row."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=EPS) / INT8_MAX  # [M, 1]
    q = torch.round(xf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


##### fp8 #######################################################################################

def quantize_fp8(x: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [R, K] float -> (q: [R, K] float8_e4m3fn, scale) with x ~ q * scale.

    granularity "row": scale [R, 1] float32 (one per row: per output channel for weights, per token
    for activations); "tensor": scale [] float32.
    """
    xf = x.float()
    if granularity == "row":
        amax = xf.abs().amax(dim=1, keepdim=True)  # [R, 1]
    elif granularity == "tensor":
        amax = xf.abs().amax()  # []
    else:
        raise ValueError(f"granularity must be 'row' or 'tensor', got {granularity!r}")
    scale = amax.clamp(min=EPS) / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


##### int4 ######################################################################################

def quantize_int4_groupwise(
    w: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w: [N, K] float -> (q: [N, K] uint8 in [0, 15], scales: [N, K/g] bf16, zeros: [N, K/g] bf16).

    Asymmetric min/max per group of `group_size` consecutive input channels, in tinygemm's
    convention w ~ (q - 8) * scale + zero. Scales and zeros are rounded to bf16 *before* q is
    computed, so dequantizing with the stored bf16 values is the function the kernels compute.
    """
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features={k} is not a multiple of group_size={group_size}")
    g = w.float().reshape(n, k // group_size, group_size)  # [N, K/g, g]
    wmin, wmax = g.amin(dim=2), g.amax(dim=2)  # [N, K/g]
    scales = ((wmax - wmin).clamp(min=1e-6) / 15.0).to(torch.bfloat16)
    zeros = (wmin + 8.0 * scales.float()).to(torch.bfloat16)
    s, z = scales.float()[..., None], zeros.float()[..., None]
    q = torch.round((g - z) / s + 8.0).clamp(0, 15).to(torch.uint8).reshape(n, k)
    return q, scales, zeros


def dequantize_int4_groupwise(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
) -> torch.Tensor:
    """Inverse of quantize_int4_groupwise: q [N, K] uint8, scales/zeros [N, K/g] -> [N, K] float32."""
    n, k = q.shape
    group_size = k // scales.shape[1]
    g = q.float().reshape(n, -1, group_size)
    return ((g - 8.0) * scales.float()[..., None] + zeros.float()[..., None]).reshape(n, k)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] uint8 values in [0, 15] -> [N, K/2] uint8, even k in the high nibble (tinygemm's input)."""
    return (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8 -> [N, K] uint8; inverse of pack_int4."""
    return torch.stack([packed >> 4, packed & 15], dim=-1).reshape(packed.shape[0], -1)


##### 2:4 sparsity ##############################################################################

def prune_24_mask(w: torch.Tensor, act_norm: torch.Tensor | None = None) -> torch.Tensor:
    """w: [N, K] -> bool mask [N, K] keeping the 2 highest-scoring of every 4 consecutive inputs.

    act_norm: [K] per-input-channel L2 norm of the layer's activations (Wanda, Sun et al. 2023:
    score = |W_nk| * ||X_k||); None scores by magnitude |W_nk|.
    """
    n, k = w.shape
    if k % 4:
        raise ValueError(f"2:4 sparsity needs in_features divisible by 4, got {k}")
    score = w.float().abs()
    if act_norm is not None:
        if act_norm.shape != (k,):
            raise ValueError(f"act_norm must have shape ({k},), got {tuple(act_norm.shape)}")
        score = score * act_norm.float().to(score.device)[None, :]
    groups = score.reshape(n, k // 4, 4)
    keep = groups.topk(2, dim=2).indices  # [N, K/4, 2]
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, keep, True)
    return mask.reshape(n, k)


def is_24_sparse(w: torch.Tensor) -> bool:
    """True when every group of 4 consecutive inputs of every row has at most 2 non-zeros."""
    n, k = w.shape
    return bool(((w.reshape(n, k // 4, 4) != 0).sum(dim=2) <= 2).all())


##### dynamic activation quantization: one entry point, fused on CUDA ############################

_TRITON_OPS: bool | None = None  # None: not tried yet


def load_triton_ops() -> bool:
    """Import (once) the Triton custom ops; False where Triton is missing or unusable.

    Registers torch.ops.autoao.{per_token_quant, scaled_epilogue} (triton_quant) and
    {int4_gemv, per_channel_gemv} (triton_gemv). Called when a module is packed for CUDA, so
    forward never imports anything (torch.compile-safe).
    """
    global _TRITON_OPS
    if _TRITON_OPS is None:
        try:
            import autoao.kernels.triton_gemv  # noqa: F401  (lazy: triton is heavy and optional)
            import autoao.kernels.triton_quant  # noqa: F401  (lazy: triton)
            _TRITON_OPS = True
        except ImportError as e:  # no triton wheel for this platform
            import warnings

            warnings.warn(f"Triton unavailable ({e}); dynamic activation quantization runs as "
                          "separate torch kernels and the Triton GEMV kernels are off, which is slower "
                          "on CUDA.", stacklevel=2)
            _TRITON_OPS = False
    return _TRITON_OPS


def dequantize_output(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor | None,
                      bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """acc [M, N] (int32 or float) -> acc * x_scale [M, 1] (* w_scale [N]) (+ bias [N]) in out_dtype.

    On CUDA with Triton, run eagerly: one fused pass (autoao::scaled_epilogue, bias added in fp32
    before the cast). Elsewhere, and while torch.compile traces: plain torch (fp32 math, cast, then
    bias in out_dtype), which inductor fuses into the ops that consume the output (an activation,
    a residual add), saving a write and a read of [M, N]."""
    if acc.is_cuda and _TRITON_OPS and not torch.compiler.is_compiling():
        return call_op("scaled_epilogue", acc, x_scale, w_scale, bias, out_dtype)
    y = acc.float() * x_scale
    if w_scale is not None:
        y = y * w_scale
    y = y.to(out_dtype)
    return y if bias is None else y + bias.to(out_dtype)


def quantize_per_token(x: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (q [M, K] qdtype, scale [M, 1] float32); qdtype int8 or float8_e4m3fn.

    On CUDA with Triton, run eagerly: one fused kernel (autoao::per_token_quant). Elsewhere, and
    while torch.compile traces: the plain-torch functions above, which inductor fuses into one
    kernel together with the op that produced x (e.g. the RMSNorm before a projection). Both
    compute the same numbers.
    """
    if x.is_cuda and _TRITON_OPS and not torch.compiler.is_compiling():
        return call_op("per_token_quant", x, qdtype)
    if qdtype == torch.int8:
        return quantize_int8_per_token(x)
    return quantize_fp8(x, "row")
