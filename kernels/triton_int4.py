"""int4 weight-only GEMV for decode (M = 1) in Triton, reading autoao's canonical int4 layout.

Why: tinygemm (`torch._weight_int4pack_mm`) reaches ~44% of the weight-bandwidth roofline at M=1 on
the H200 (benchmarks/NOTES.md: 145 us for a 128256x4096 g128 layer whose 271 MB take 64 us at
4.25 TB/s). A GEMV has one job: stream the weights once. Two numbers for N x K, group g:
bytes = N*K/2 (nibbles) + 4*N*K/g (bf16 scale + zero) + 2*K + 2*N; FLOPs = 2*N*K (+ 2 per weight to
dequantize), i.e. ~4 FLOP per byte: memory-bound by far.

Layout read (the canonical one, so no second packed copy is needed): qweight [N, K/2] uint8, even k
in the high nibble; scales, zeros [N, K/g] bf16; w = (q - 8) * scale + zero. Each program owns
BLOCK_N output rows and walks K in BLOCK_K steps, dequantizing in registers and reducing in fp32.
Status (measured on the H200, benchmarks/results/2026-11-29-h200/int4_gemv/): correct (rel. error
1.7e-3) but 0.20-0.37x tinygemm's speed, 2-11% of the roofline, so it is NOT wired into any
candidate. The next version needs more bytes in flight per SM (split-K for the K=14336 layers,
wider loads); see benchmarks/NOTES.md for v1/v2 and what each taught.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, N, K, stride_qn, stride_sn,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] output rows
    mask_n = offs_n < N
    offs_b = tl.arange(0, BLOCK_K // 2)  # [BK/2] byte offsets within the step (2 weights a byte)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_even = k0 + 2 * offs_b  # [BK/2] the k of each byte's high nibble
        mask_k = k_even < K
        mask = mask_n[:, None] & mask_k[None, :]
        p = tl.load(q_ptr + offs_n[:, None].to(tl.int64) * stride_qn + (k_even // 2)[None, :], mask=mask, other=0)
        g = k_even // GROUP  # [BK/2] group of each byte (both nibbles share it: GROUP is even)
        sz = offs_n[:, None].to(tl.int64) * stride_sn + g[None, :]
        s = tl.load(s_ptr + sz, mask=mask, other=0.0).to(tl.float32)  # [BN, BK/2], repeats hit L1
        z = tl.load(z_ptr + sz, mask=mask, other=0.0).to(tl.float32)
        xe = tl.load(x_ptr + k_even, mask=mask_k, other=0.0).to(tl.float32)  # [BK/2]
        xo = tl.load(x_ptr + k_even + 1, mask=mask_k, other=0.0).to(tl.float32)
        w_hi = ((p >> 4).to(tl.float32) - 8.0) * s + z
        w_lo = ((p & 15).to(tl.float32) - 8.0) * s + z
        acc += tl.sum(w_hi * xe[None, :] + w_lo * xo[None, :], axis=1)
    tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask_n)


CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w)
           for bn, bk, w in [(8, 256, 2), (16, 256, 4), (16, 512, 4), (32, 256, 4), (32, 512, 8), (64, 256, 8)]]
# On a GPU, autotune per (N, K, group); under TRITON_INTERPRET=1 (CPU tests) there is nothing to time.
_KERNEL = (_int4_gemv_kernel if os.environ.get("TRITON_INTERPRET") == "1"
           else triton.autotune(configs=CONFIGS, key=["N", "K", "GROUP"])(_int4_gemv_kernel))


def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int) -> torch.Tensor:
    """x [K] or [1, K] -> y [1, N] in x.dtype; qweight [N, K/2] uint8, scales/zeros [N, K/g]."""
    x = x.reshape(-1).contiguous()
    n, k = qweight.shape[0], x.numel()
    if qweight.shape[1] * 2 != k or scales.shape != (n, k // group_size) or zeros.shape != scales.shape:
        raise ValueError(f"int4_gemv: x has K={k}, qweight {tuple(qweight.shape)}, scales {tuple(scales.shape)}, "
                         f"group_size {group_size}: shapes do not match")
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    extra = {"BLOCK_N": 16, "BLOCK_K": 256} if _KERNEL is _int4_gemv_kernel else {}
    _KERNEL[grid](x, qweight, scales, zeros, y, n, k, qweight.stride(0), scales.stride(0), GROUP=group_size, **extra)
    return y
