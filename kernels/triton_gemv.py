"""Weight-only GEMV / skinny GEMM (M <= 8 rows) in Triton: int4 group-wise, int8 and fp8 per-channel.

Why: at decode (M = 1) a linear layer's only job is to stream its weights once; torch's kernels
do not: tinygemm reaches ~45% of a datacenter GPU's bandwidth roofline at M=1, and int8 weight-only through
`F.linear(x, w.to(bf16))` reads 5 bytes per weight instead of 1
(docs/kernels.md#int8_wo-and-fp8_wo-the-triton-weight-only-gemvs).

Two numbers per layer N x K at M rows: bytes = N*K*b (b = 1/2 int4, 1 int8/fp8) + scales (+ zeros)
+ 2*M*(K + N); FLOPs = 2*M*N*K. Memory-bound by ~100x at M = 1.

Design (what the datacenter-GPU measurements in docs/kernels.md kept): plain tiles. Each program
loads a [BLOCK_N, BLOCK_K] weight tile straight from the canonical layout (int4: [N, K/2] uint8 read
as [BLOCK_N, groups, G/2] bytes; int8/fp8: [N, K]), converts in registers, multiplies by the
activation (shared by all rows) and reduces along K. int4 applies scales and zeros once per group
and row: sum_k w x = s * sum (q - 8) x + z * sum x. Integers become floats by a bit trick, not by
int->float conversions (quarter rate on Hopper; they capped the plain int8 kernel at 85% of the
roofline): `0x4B000000 | q` are the bits of the fp32 2**23 + q. (A first version applied the trick
to whole int32 words with 3-D/4-D register shapes; the shuffles made it 2-6x slower.)
A third int4 kernel (`_int4_mma_kernel`, Marlin's idea) multiplies on tensor cores instead: per
group one tl.dot of the nibbles as bf16 128 + q (made 2 at a time by inline PTX) with x padded to
16 rows: the ALUs only convert (0.12-0.15 warp-instructions per weight byte against the byte
kernel's 0.45, counted in its SASS), and M = 8 costs what M = 1 does.
Without split-K the kernel writes the output in the activation dtype (one launch per layer); with
it, SPLIT_K programs per column block write fp32 partials [SPLIT_K, M, N], summed and cast by a
second small kernel, for layers whose N / BLOCK_N programs alone cannot fill 132 SMs. (Summing them
inside the kernel, the last program of a block reducing, measured slower end to end on a
datacenter GPU: docs/kernels.md#int8_wo-and-fp8_wo-the-triton-weight-only-gemvs.)

Each (N, K, M, kernel) gets its launch configuration from a timed sweep on first use (`_tune`),
or `DEFAULT` under the interpreter / CUDA-graph capture. The ops are registered as custom ops
(`autoao::int4_gemv`, `autoao::per_channel_gemv` for int8 and fp8) so torch.compile and CUDA graphs
treat each as one opaque, shape-known call. Tested on CPU with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
import torch
import triton
import triton.language as tl

from autoao.clock import fastest  # L2 flushed by a read, as the model meets the layer
from autoao.kernels.ops import EAGER, cdiv, next_pow2
from autoao.kernels.triton_configs import (
    DEFAULT,
    MAX_ROWS,
    Config,
    candidates,
    fits,
    int4_max_rows,
)

# The interpreter (CPU tests) runs the kernels as Python and cannot run inline PTX.
_INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _store_rows(y_ptr, out, pid_k, M, N, offs_n, BLOCK_M: tl.constexpr):
    # out [BLOCK_M, BN] fp32 -> y[pid_k] rows < M, columns offs_n < N (y: [M, N] or [SPLIT_K, M, N])
    rows = tl.arange(0, BLOCK_M)
    y = y_ptr + pid_k * M * N + rows[:, None] * N + offs_n[None, :]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (offs_n < N)[None, :])


@triton.jit
def _int4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_sn,
                 GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    # x [M, K]; q [N, K/2] uint8 (byte j: k=2j in the high nibble, k=2j+1 in the low one);
    # s, z [N, K/G] bf16; y: [M, N] in x's dtype (SPLIT_K = 1) or [SPLIT_K, M, N] fp32 partials.
    # A step is NG whole groups, loaded as a 3-D tile [BN, NG, G/2] so the per-group sums are a
    # reduction over the last axis.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    mask_n = offs_n < N
    n64 = offs_n.to(tl.int64)
    NG: tl.constexpr = BLOCK_K // GROUP
    HB: tl.constexpr = GROUP // 2  # bytes per group and row
    g_off = tl.arange(0, NG)
    b_off = tl.arange(0, HB)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        g = k0 // GROUP + g_off  # [NG] group index
        mask_g = g < K // GROUP
        byte = g[:, None] * HB + b_off[None, :]  # [NG, HB] byte index within a row
        p = tl.load(q_ptr + n64[:, None, None] * stride_qn + byte[None, :, :],
                    mask=mask_n[:, None, None] & mask_g[None, :, None], other=0)  # [BN, NG, HB] uint8
        # nibble -> fp32 q - 8 without int->float conversions (quarter rate on Hopper, and 2 per
        # byte here): the bits 0x4B000000 | q are the fp32 2**23 + q, exactly
        pi = p.to(tl.int32)
        hi = ((pi >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0  # k even: q - 8
        lo = ((pi & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0  # k odd
        sz = n64[:, None] * stride_sn + g[None, :]
        mask_sz = mask_n[:, None] & mask_g[None, :]
        s = tl.load(s_ptr + sz, mask=mask_sz, other=0.0).to(tl.float32)  # [BN, NG]
        z = tl.load(z_ptr + sz, mask=mask_sz, other=0.0).to(tl.float32)
        k_even = 2 * byte  # [NG, HB]
        for m in tl.static_range(BLOCK_M):
            k_end = K * (M > m)  # rows past M (BLOCK_M is a power of 2) read nothing
            xe = tl.load(x_ptr + m * stride_xm + k_even, mask=k_even < k_end, other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + m * stride_xm + k_even + 1, mask=k_even < k_end, other=0.0).to(tl.float32)
            t = tl.sum(hi * xe[None, :, :] + lo * xo[None, :, :], axis=2)  # [BN, NG]: sum (q-8) x per group
            xs = tl.sum(xe + xo, axis=1)  # [NG]
            part = tl.sum(s * t + z * xs[None, :], axis=1)  # [BN]
            acc = tl.where(rows[:, None] == m, acc + part[None, :], acc)
    _store_rows(y_ptr, acc, pid_k, M, N, offs_n, BLOCK_M)


@triton.jit
def _int4_words_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_sn,
                       GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    # Same contract as _int4_kernel except: q is the same bytes viewed as int32 [N, K/8] (stride_qn
    # in words), and K must be a multiple of BLOCK_K (no masks along K, so loads are 16 bytes wide).
    # Fewer instructions per byte (counted in the SASS): 8 nibbles per word (k = 8w + j; nibble
    # j at bit 8*(j//2) + 4*(1 - j%2), j >= 4 in the upper half, brought down by `p >> 16`) become
    # fp32 by one LOP3 and one FADD each, with a magic number whose exponent makes the nibble's bit
    # position count units (the bits of 2**(23 - s) | (q << s) are the fp32 2**(23 - s) + q); the
    # activations are loaded as [W, 8] and split in registers; scales and zeros apply per group and
    # the group sums stay per program until the end.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    mask_n = offs_n < N
    n64 = offs_n.to(tl.int64)
    W: tl.constexpr = BLOCK_K // 8
    offs_w = tl.arange(0, W)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K // GROUP], dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        # K is a multiple of BLOCK_K here (fits): no mask along K, so the loads are 16 bytes wide
        kw = k0 + 8 * offs_w  # [W] first k of each word
        mask = mask_n[:, None] & (offs_w < W)[None, :]
        w0 = tl.multiple_of(k0 // 8, W)
        p = tl.load(q_ptr + n64[:, None] * stride_qn + (w0 + offs_w)[None, :], mask=mask, other=0)  # [BN, W]
        ph = p >> 16
        NG: tl.constexpr = BLOCK_K // GROUP
        g = n64[:, None] * stride_sn + (k0 // GROUP + tl.arange(0, NG))[None, :]  # [BN, NG]
        s = tl.load(s_ptr + g, mask=mask_n[:, None], other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g, mask=mask_n[:, None], other=0.0).to(tl.float32)
        # nibble j of each word as q - 8; in a 16-bit half the nibbles sit at bits 4, 0, 12, 8
        q0 = ((p & 0xf0) | 0x49000000).to(tl.float32, bitcast=True) - 524296.0
        q1 = ((p & 0xf) | 0x4b000000).to(tl.float32, bitcast=True) - 8388616.0
        q2 = ((p & 0xf000) | 0x45000000).to(tl.float32, bitcast=True) - 2056.0
        q3 = ((p & 0xf00) | 0x47000000).to(tl.float32, bitcast=True) - 32776.0
        q4 = ((ph & 0xf0) | 0x49000000).to(tl.float32, bitcast=True) - 524296.0
        q5 = ((ph & 0xf) | 0x4b000000).to(tl.float32, bitcast=True) - 8388616.0
        q6 = ((ph & 0xf000) | 0x45000000).to(tl.float32, bitcast=True) - 2056.0
        q7 = ((ph & 0xf00) | 0x47000000).to(tl.float32, bitcast=True) - 32776.0
        for m in tl.static_range(BLOCK_M):
            xk = kw[:, None] + tl.arange(0, 8)[None, :]  # [W, 8], contiguous in k
            x = tl.load(x_ptr + m * stride_xm + xk, mask=(xk < K * (M > m)), other=0.0).to(tl.float32)
            xa, xb = tl.split(tl.reshape(x, [W, 4, 2]))  # j even / odd: [W, 4]
            x0, x2 = tl.split(tl.reshape(xa, [W, 2, 2]))  # j = 0, 4 / 2, 6
            x1, x3 = tl.split(tl.reshape(xb, [W, 2, 2]))  # j = 1, 5 / 3, 7
            x0, x4 = tl.split(x0)
            x2, x6 = tl.split(x2)
            x1, x5 = tl.split(x1)
            x3, x7 = tl.split(x3)
            t = (q0 * x0[None, :] + q1 * x1[None, :] + q2 * x2[None, :] + q3 * x3[None, :]
                 + q4 * x4[None, :] + q5 * x5[None, :] + q6 * x6[None, :] + q7 * x7[None, :])  # [BN, W]
            tg = tl.sum(tl.reshape(t, [BLOCK_N, NG, GROUP // 8]), axis=2)  # [BN, NG]
            xg = tl.sum(tl.reshape(x, [NG, GROUP]), axis=1)  # [NG]
            acc += tl.where(rows[:, None, None] == m, (s * tg + z * xg[None, :])[None, :, :], 0.0)
    _store_rows(y_ptr, tl.sum(acc, axis=2), pid_k, M, N, offs_n, BLOCK_M)


@triton.jit
def _bf16_nibbles(u):
    # u int16 [BN, W]: element i holds bytes 2i, 2i+1 of a row, i.e. k = 4i..4i+3 with nibbles at
    # bits 4 (k = 4i), 0 (4i + 1), 12 (4i + 2) and 8 (4i + 3). Returns four bf16 [BN, W] of 128 + q
    # for k = 4i + 1, 4i, 4i + 3, 4i + 2: the bits 0x4300 | q are the bf16 128 + q, exactly. On the
    # GPU each 32-bit register holds two elements (the dot operand's pairs), so all four come from
    # 3 shifts and 4 LOP3s per register (Triton's own 16-bit ops unpack the lanes with PRMTs: ~2x the
    # instructions); the interpreter cannot run PTX and computes the same per element.
    if _INTERPRET:
        return (((u & 15) | 0x4300).to(tl.bfloat16, bitcast=True),
                (((u >> 4) & 15) | 0x4300).to(tl.bfloat16, bitcast=True),
                (((u >> 8) & 15) | 0x4300).to(tl.bfloat16, bitcast=True),
                (((u >> 12) & 15) | 0x4300).to(tl.bfloat16, bitcast=True))
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 t;
            lop3.b32 $0, $4, 0x000f000f, 0x43004300, 0xea;
            shr.u32 t, $4, 4;
            lop3.b32 $1, t, 0x000f000f, 0x43004300, 0xea;
            shr.u32 t, $4, 8;
            lop3.b32 $2, t, 0x000f000f, 0x43004300, 0xea;
            shr.u32 t, $4, 12;
            lop3.b32 $3, t, 0x000f000f, 0x43004300, 0xea;
            }""", "=r,=r,=r,=r,r", [u], dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
            is_pure=True, pack=2)


@triton.jit
def _dot_bf16(a, b):
    # tl.dot for bf16 a, b. The interpreter's dot multiplies bf16 operands as their raw 16-bit
    # patterns (Triton 3.9), so it gets them as fp32 there (exact; products and sums in fp32 anyway).
    if _INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _int4_mma_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_sn,
                     GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    # Same contract as _int4_kernel except: q is the same bytes viewed as int16 [N, K/4] (stride_qn
    # in int16 elements), K % BLOCK_K == 0 and GROUP >= 64 (fits), and x is rounded to bf16 (the
    # module passes bf16). The multiply-accumulate runs on tensor cores (Marlin's idea), one dot per
    # group: y^T [BN, MP] += s * (W' @ x^T - 136 * xs) + z * xs, with W' = 128 + q [BN, G] from
    # _bf16_nibbles, xs the sum of x over the group, MP = max(16, BLOCK_M) columns (tl.dot's
    # minimum; rows of x past M are zeros).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    # weight rows past N are clamped onto the last one, not masked: they only reach outputs that are
    # never stored, and the loads need no predicates
    n64 = tl.minimum(offs_n, N - 1).to(tl.int64)
    MP: tl.constexpr = 16 if BLOCK_M < 16 else BLOCK_M
    W: tl.constexpr = GROUP // 4
    NG: tl.constexpr = BLOCK_K // GROUP
    rows = tl.arange(0, MP)
    acc = tl.zeros([BLOCK_N, MP], dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        for j in tl.static_range(NG):  # one group at a time: its scales multiply a whole dot
            g = k0 // GROUP + j
            u = tl.load(q_ptr + n64[:, None] * stride_qn + (g * W + tl.arange(0, W))[None, :])  # [BN, W]
            kx = g * GROUP + tl.arange(0, GROUP)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + kx[None, :], mask=(rows < M)[:, None],
                        other=0.0).to(tl.bfloat16)  # [MP, G]
            # The four nibble tiles side by side along K, x in the same order: the dot's K index is
            # (k % 4) * W + k // 4 on both sides. The permute and reshape cost nothing: each thread
            # already holds its A-operand registers (the four tiles are four runs of the operand's
            # K), while x is reordered in registers on its way to shared memory.
            w1, w0, w3, w2 = _bf16_nibbles(u)
            wk = tl.join(tl.join(w0, w2), tl.join(w1, w3))  # [BN, W, 2, 2]: (n, i, a, b) is k = 4i + 2a + b
            wk = tl.reshape(tl.permute(wk, (0, 2, 3, 1)), [BLOCK_N, GROUP])
            xk = tl.reshape(tl.permute(tl.reshape(x, [MP, W, 2, 2]), (0, 2, 3, 1)), [MP, GROUP])
            d = _dot_bf16(wk, tl.trans(xk))  # [BN, MP] fp32: sum (128 + q) x over the group
            xs = tl.sum(x.to(tl.float32), axis=1)  # [MP]
            s = tl.load(s_ptr + n64 * stride_sn + g).to(tl.float32)  # [BN]
            z = tl.load(z_ptr + n64 * stride_sn + g).to(tl.float32)
            acc += s[:, None] * d
            acc += (z - 136.0 * s)[:, None] * xs[None, :]
    _store_rows(y_ptr, tl.trans(acc), pid_k, M, N, offs_n, MP)


@triton.jit
def _sum_splits_kernel(p_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    # p [SPLIT_K, M*N] fp32 partials -> y [M*N] in y's dtype: the sum and the cast in one launch
    # (torch's `p.sum(0).to(bf16)` takes two, ~3.7 + 0.9 us a call on a datacenter GPU: docs/kernels.md)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(SPLIT_K):
        acc += tl.load(p_ptr + i * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _per_channel_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT_K: tl.constexpr, IS_INT8: tl.constexpr):
    # x [M, K]; w [N, K] int8 or float8_e4m3fn (e4m3 pairs are converted by the hardware on
    # sm_90); s [N]; y: [M, N] in x's dtype (SPLIT_K = 1) or [SPLIT_K, M, N] fp32 partials.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    n64 = offs_n.to(tl.int64)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        k = k0 + offs_k
        w = tl.load(w_ptr + n64[:, None] * stride_wn + k[None, :], mask=mask_n[:, None] & (k < K)[None, :],
                    other=0.0)  # [BN, BK]
        if IS_INT8:  # q + 0x4B000080 are the bits of the fp32 2**23 + 128 + q: no int->float conversion
            w = (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
        else:  # e4m3: converted in pairs by the hardware (sm_89+)
            w = w.to(tl.float32)
        for m in tl.static_range(BLOCK_M):
            x = tl.load(x_ptr + m * stride_xm + k, mask=k < K * (M > m), other=0.0).to(tl.float32)
            t = tl.sum(w * x[None, :], axis=1)
            acc = tl.where(rows[:, None] == m, acc + t[None, :], acc)
    s = tl.load(s_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    _store_rows(y_ptr, acc * s[None, :], pid_k, M, N, offs_n, BLOCK_M)


##### launch configurations (data: triton_configs.py) and tuning ###############################

_TUNED: dict[tuple, Config] = {}


def _launch(kind: str, x: torch.Tensor, tensors: tuple, n: int, k: int, cfg: Config, group: int) -> torch.Tensor:
    """Run one kernel with cfg: the result [M, N] in x.dtype when cfg.split_k == 1 (the kernel
    writes it: no second launch), else fp32 partials [split_k, M, N] for _finish to sum."""
    m = x.shape[0]
    shape, dtype = ((m, n), x.dtype) if cfg.split_k == 1 else ((cfg.split_k, m, n), torch.float32)
    y = torch.empty(shape, dtype=dtype, device=x.device)
    grid = (cdiv(n, cfg.block_n), cfg.split_k)
    block_m = next_pow2(m)
    meta = dict(BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if kind == "int4":
        q, s, z = tensors
        if cfg.variant == "words":
            q32 = q.view(torch.int32)  # [N, K/8]: 8 nibbles a word
            _int4_words_kernel[grid](x, q32, s, z, y, m, n, k, x.stride(0), q32.stride(0), s.stride(0),
                                     GROUP=group, **meta)
        elif cfg.variant == "mma":
            q16 = q.view(torch.int16)  # [N, K/4]: 4 nibbles an element
            _int4_mma_kernel[grid](x, q16, s, z, y, m, n, k, x.stride(0), q16.stride(0), s.stride(0),
                                   GROUP=group, **meta)
        else:
            _int4_kernel[grid](x, q, s, z, y, m, n, k, x.stride(0), q.stride(0), s.stride(0), GROUP=group, **meta)
    else:  # int8, fp8: the same kernel, the element type comes with the pointer
        w, s = tensors
        _per_channel_kernel[grid](x, w, s, y, m, n, k, x.stride(0), w.stride(0), IS_INT8=kind == "int8", **meta)
    return y


def _tune(kind: str, x: torch.Tensor, tensors: tuple, n: int, k: int, group: int) -> Config:
    """The fastest config for (kind, N, K, M, group), timed once per process on a CUDA device."""
    m = x.shape[0]
    key = (kind, n, k, next_pow2(m), group, x.dtype, x.device.index)
    cfg = _TUNED.get(key)
    if cfg is not None:
        return cfg
    configs = candidates(kind, k, group, m)
    if os.environ.get("TRITON_INTERPRET") == "1" or not x.is_cuda or torch.cuda.is_current_stream_capturing():
        if m > MAX_ROWS:
            return configs[0]
        return DEFAULT if fits(DEFAULT, k, group) else Config(16, max(group, 128), 1, 4)

    # a config that does not compile (registers) is skipped
    best = fastest(configs, lambda cfg: lambda: _finish(_launch(kind, x, tensors, n, k, cfg, group), x.dtype),
                   skip=(Exception,))
    if best is None:
        raise RuntimeError(f"no {kind} GEMV configuration ran for N={n}, K={k}")
    _TUNED[key] = best
    return best


def _finish(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """_launch's result -> [M, N] in dtype: as is without split-K, else the partials summed in fp32
    and cast by one kernel."""
    if y.dim() == 2:
        return y
    split_k, m, n = y.shape
    out = torch.empty((m, n), dtype=dtype, device=y.device)
    block = 1024
    _sum_splits_kernel[(cdiv(m * n, block),)](y, out, m * n, SPLIT_K=split_k, BLOCK=block, num_warps=4)
    return out


def _check_rows(x: torch.Tensor, k: int, name: str, max_rows: int) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"{name}: x must be [M, {k}], got {tuple(x.shape)}")
    if x.shape[0] > max_rows:
        raise ValueError(f"{name}: handles at most {max_rows} rows here, got M={x.shape[0]}; use the GEMM kernel")
    return x if x.stride(1) == 1 else x.contiguous()


def int4_gemv_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int) -> torch.Tensor:
    """x [M, K] -> [M, N] in x.dtype for autoao's canonical int4 weights: qweight [N, K/2] uint8
    (even k in the high nibble), scales/zeros [N, K/g] with w = (q - 8) * scale + zero.
    M <= int4_max_rows(K, g) (16 where the tensor-core kernel fits, else 8)."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    x = _check_rows(x, k, "int4_gemv", int4_max_rows(k, group_size))
    if scales.shape != (n, k // group_size) or zeros.shape != scales.shape or group_size % 8:
        raise ValueError(f"int4_gemv: qweight {tuple(qweight.shape)}, scales {tuple(scales.shape)}, "
                         f"zeros {tuple(zeros.shape)}, group_size {group_size}: shapes do not match")
    tensors = (qweight.contiguous(), scales.contiguous(), zeros.contiguous())
    cfg = _tune("int4", x, tensors, n, k, group_size)
    return _finish(_launch("int4", x, tensors, n, k, cfg, group_size), x.dtype)


def per_channel_gemv_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M <= 8, K] -> [M, N] = x @ (weight * scale[:, None])^T in x.dtype; weight [N, K] int8 or
    float8_e4m3fn (per-output-channel symmetric), scale [N]."""
    kinds = {torch.int8: "int8", torch.float8_e4m3fn: "fp8"}
    if weight.dtype not in kinds:
        raise ValueError(f"per_channel_gemv: weight dtype {weight.dtype}, expected torch.int8 or torch.float8_e4m3fn")
    n, k = weight.shape
    x = _check_rows(x, k, "per_channel_gemv", MAX_ROWS)
    if scale.shape != (n,):
        raise ValueError(f"per_channel_gemv: scale {tuple(scale.shape)}, expected ({n},)")
    kind, tensors = kinds[weight.dtype], (weight.contiguous(), scale)
    cfg = _tune(kind, x, tensors, n, k, 0)
    return _finish(_launch(kind, x, tensors, n, k, cfg, 0), x.dtype)


##### custom ops (opaque to torch.compile, capturable in CUDA graphs) ###########################

@torch.library.custom_op("autoao::int4_gemv", mutates_args=())
def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int) -> torch.Tensor:
    """Custom-op wrapper of int4_gemv_triton."""
    return int4_gemv_triton(x, qweight, scales, zeros, group_size)


EAGER["int4_gemv"] = int4_gemv_triton


@int4_gemv.register_fake
def _(x, qweight, scales, zeros, group_size):
    return x.new_empty((x.shape[0], qweight.shape[0]))


@torch.library.custom_op("autoao::per_channel_gemv", mutates_args=())
def per_channel_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Custom-op wrapper of per_channel_gemv_triton (int8 and fp8 weights)."""
    return per_channel_gemv_triton(x, weight, scale)


EAGER["per_channel_gemv"] = per_channel_gemv_triton


@per_channel_gemv.register_fake
def _(x, weight, scale):
    return x.new_empty((x.shape[0], weight.shape[0]))
