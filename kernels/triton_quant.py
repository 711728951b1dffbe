"""Fused per-token dynamic quantization in one Triton kernel: absmax, scale and cast in one launch.

Unfused, `quantize_int8_per_token` is ~6 element-wise/reduction kernels over x [M, K] (abs, amax,
div, round, clamp, cast), each a launch and a full read (+ write) of x. This kernel reads each row
once (the second sweep of a row hits L1/L2) and writes q [M, K] and scale [M, 1]: bytes = M*K*2
read + M*K written + 4*M. It is registered as the custom op `autoao::per_token_quant` (capturable
in CUDA graphs). Modules call it when they run eagerly; under torch.compile they hand inductor the
plain-torch ops instead, which it fuses the same way and also into the neighbouring ops
(`kernels.quant.quantize_per_token`); the same holds for the epilogue below.

It computes exactly `kernels.quant.quantize_int8_per_token` / `quantize_fp8(x, "row")`: the same
scale (amax / qmax, clamped at EPS) and round-half-to-even (the 1.5 * 2**23 trick is exact for
|y| <= 2**22, and |y| <= 127 here). Runs on CPU under TRITON_INTERPRET=1 for tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoao.kernels.quant import EPS, FP8_DTYPE, FP8_MAX, INT8_MAX
from autoao.kernels.ops import EAGER, cdiv, next_pow2

_RNE_MAGIC = 12582912.0  # 1.5 * 2**23: (y + M) - M rounds fp32 y to nearest even integer


@triton.jit
def _per_token_quant_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
    QMAX: tl.constexpr, IS_INT8: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # One program per row (token). x row: [K] -> q row: [K], scale: [1].
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * stride_x + k0 + offs, mask=k0 + offs < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.maximum(tl.max(amax, axis=0), EPS_C) / QMAX
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + offs < K
        y = tl.load(x_ptr + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32) / scale
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
        if IS_INT8:
            y = (y + RNE_C) - RNE_C
            tl.store(q_ptr + row * stride_q + k0 + offs, y.to(tl.int8), mask=mask)
        else:
            tl.store(q_ptr + row * stride_q + k0 + offs, y.to(q_ptr.dtype.element_ty), mask=mask)


# Module-level constants read inside the jitted function must be tl.constexpr globals.
EPS_C = tl.constexpr(EPS)
RNE_C = tl.constexpr(_RNE_MAGIC)


def per_token_quant_triton(x: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (any float dtype, rows may be strided) -> (q [M, K] qdtype, scale [M, 1] float32).

    qdtype: torch.int8 or torch.float8_e4m3fn.
    """
    if qdtype not in (torch.int8, FP8_DTYPE):
        raise ValueError(f"qdtype must be torch.int8 or {FP8_DTYPE}, got {qdtype}")
    if x.dim() != 2 or x.stride(1) != 1:
        x = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=qdtype, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block_k = min(next_pow2(k), 4096)
    num_warps = 4 if block_k <= 1024 else 8
    is_int8 = qdtype == torch.int8
    _per_token_quant_kernel[(m,)](
        x, q, scale, k, x.stride(0), q.stride(0),
        QMAX=INT8_MAX if is_int8 else FP8_MAX, IS_INT8=is_int8, BLOCK_K=block_k,
        num_warps=num_warps,
    )
    return q, scale


@torch.library.custom_op("autoao::per_token_quant", mutates_args=())
def per_token_quant(x: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Custom op wrapper of per_token_quant_triton (opaque to torch.compile, capturable in graphs)."""
    return per_token_quant_triton(x, qdtype)


EAGER["per_token_quant"] = per_token_quant_triton


@per_token_quant.register_fake
def _(x: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.shape[0]
    return x.new_empty(x.shape, dtype=qdtype), x.new_empty((m, 1), dtype=torch.float32)


##### fused dequantization epilogue ##############################################################
# After an int8 / 2:4 matmul the output still needs  y = acc * s_x[m] (* s_w[n]) (+ bias[n]),
# cast to the activation dtype. Eagerly that is 3-4 passes over [M, N] (int32 -> fp32, two
# multiplies, cast, bias): at M=2048, N=14336 each pass moves ~200 MB, more than the matmul's own
# time. One kernel reads acc once and writes y once.

@triton.jit
def _scaled_epilogue_kernel(
    acc_ptr, xs_ptr, ws_ptr, bias_ptr, out_ptr, M, N,
    stride_am, stride_an, stride_om, stride_on,
    HAS_WS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    a = tl.load(acc_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :] * stride_an, mask=mask)
    y = a.to(tl.float32) * tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
    if HAS_WS:
        y = y * tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


def scaled_epilogue_triton(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor | None,
                           bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """acc [M, N] (int32 or float, any strides), x_scale [M, 1] fp32, w_scale [N] fp32 or None,
    bias [N] or None -> [M, N] out_dtype, contiguous: acc * x_scale * w_scale + bias."""
    m, n = acc.shape
    out = torch.empty((m, n), dtype=out_dtype, device=acc.device)
    # acc may be a transposed view (cuSPARSELt writes [N, M]); tile so both layouts stay coalesced
    block_m, block_n = (64, 64) if acc.stride(0) == 1 else (16, 128)
    grid = (cdiv(m, block_m), cdiv(n, block_n))
    _scaled_epilogue_kernel[grid](
        acc, x_scale, w_scale if w_scale is not None else x_scale, bias if bias is not None else x_scale,
        out, m, n, acc.stride(0), acc.stride(1), out.stride(0), out.stride(1),
        HAS_WS=w_scale is not None, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=4,
    )
    return out


@torch.library.custom_op("autoao::scaled_epilogue", mutates_args=())
def scaled_epilogue(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor | None,
                    bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Custom op wrapper of scaled_epilogue_triton."""
    return scaled_epilogue_triton(acc, x_scale, w_scale, bias, out_dtype)


EAGER["scaled_epilogue"] = scaled_epilogue_triton


@scaled_epilogue.register_fake
def _(acc, x_scale, w_scale, bias, out_dtype):
    return acc.new_empty(acc.shape, dtype=out_dtype)
