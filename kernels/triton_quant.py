"""Fused per-token dynamic quantization in one Triton kernel: absmax, scale and cast in one launch.

Unfused, `quantize_int8_per_token` is ~6 element-wise/reduction kernels over x [M, K] (abs, amax,
div, round, clamp, cast), each a launch and a full read (+ write) of x. This kernel reads each row
once (the second sweep of a row hits L1/L2) and writes q [M, K] and scale [M, 1]: bytes = M*K*2
read + M*K written + 4*M. It is registered as the custom op `autoao::per_token_quant` so that
torch.compile and CUDA graphs treat it as one opaque, shape-known call.

It computes exactly `kernels.quant.quantize_int8_per_token` / `quantize_fp8(x, "row")`: the same
scale (amax / qmax, clamped at EPS) and round-half-to-even (the 1.5 * 2**23 trick is exact for
|y| <= 2**22, and |y| <= 127 here). Runs on CPU under TRITON_INTERPRET=1 for tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoao.kernels.quant import EPS, FP8_DTYPE, FP8_MAX, INT8_MAX

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
    block_k = min(triton.next_power_of_2(k), 4096)
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


@per_token_quant.register_fake
def _(x: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.shape[0]
    return x.new_empty(x.shape, dtype=qdtype), x.new_empty((m, 1), dtype=torch.float32)
