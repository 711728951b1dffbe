"""GGUF K-quants (super-blocks of 256 inputs): Q6_K weights and the Q8_K activations llama.cpp
multiplies them with, ported from ggml-quants.c's reference functions (kernels/gguf.py has the
32-wide types and the matmul).

    Q6_K  210 bytes per 256 inputs: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16]
          (one per 16 inputs), fp16 d;  w = d * scale[j // 16] * (L[j] - 32), L in [0, 63]
    Q8_K  float32 d, int8 q[256] (and the 16-wide sums ggml keeps for offsets);  x = d * q

`quantize_q6_k` follows quantize_row_q6_K_ref step by step: each 16-input sub-block's scale by
make_qx_quants(16, 32, rmse_type 1) (a least-squares scale over 19 candidate grids, its sums taken
in float32 in input order), the 16 scales quantized to int8 against the largest, then every code
recomputed from its quantized scale. Rounding is ggml's nearest_int (half to even).
"""

from __future__ import annotations

import torch

QK_K = 256
_EPS = 1e-15  # GROUP_MAX_EPS: a (sub-)block with a smaller largest value is all zeros


def _div(num: float, d: torch.Tensor) -> torch.Tensor:
    """num / d in float32, correctly rounded (torch's scalar / tensor multiplies by 1 / d)."""
    return torch.div(torch.full_like(d, num), d)


def _signed_peak(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] -> (the value of largest magnitude, first on ties; that magnitude), each [...]."""
    amax, at = x.abs().max(-1)
    return x.gather(-1, at[..., None])[..., 0], amax


def _sums(x: torch.Tensor, l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """make_qx_quants' float32 sums in input order, weights w = x * x: (sum w*x*l, sum w*l*l)."""
    sumlx = torch.zeros(x.shape[:-1])
    suml2 = torch.zeros(x.shape[:-1])
    w = x * x
    for i in range(x.shape[-1]):
        sumlx = sumlx + (w[..., i] * x[..., i]) * l[..., i]
        suml2 = suml2 + (w[..., i] * l[..., i]) * l[..., i]
    return sumlx, suml2


def make_qx_quants(x: torch.Tensor, nmax: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [S, 16] float32 sub-blocks -> (scale [S] float32, L [S, 16] codes in [0, 2 * nmax - 1]):
    ggml's make_qx_quants(16, nmax, x, L, rmse_type=1, NULL)."""
    peak, amax = _signed_peak(x)
    zero = amax < _EPS
    safe = torch.where(zero, torch.ones_like(peak), peak)

    def codes(iscale: torch.Tensor) -> torch.Tensor:
        return torch.round(iscale[:, None] * x).clamp(-nmax, nmax - 1)

    l = codes(_div(-float(nmax), safe))
    sumlx, suml2 = _sums(x, l)
    scale = torch.where(suml2 != 0, sumlx / torch.where(suml2 != 0, suml2, torch.ones_like(suml2)), 0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        grid = -(nmax + torch.tensor(0.1, dtype=torch.float32) * step)  # -(nmax + 0.1f * is), in float32
        cand = codes(torch.div(grid.expand_as(safe), safe))
        c_lx, c_l2 = _sums(x, cand)
        better = (c_l2 > 0) & (c_lx * c_lx > best * c_l2)
        l = torch.where(better[:, None], cand, l)
        scale = torch.where(better, c_lx / torch.where(c_l2 > 0, c_l2, torch.ones_like(c_l2)), scale)
        best = torch.where(better, scale * c_lx, best)
    return torch.where(zero, 0.0, scale), torch.where(zero[:, None], 0.0, l + nmax)


def quantize_q6_k(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] float32, K a multiple of 256 -> Q6_K blocks [N, K / 256 * 210] uint8."""
    n, k = w.shape
    x = w.reshape(-1, 16, 16)  # [S, 16 sub-blocks, 16]
    scales, codes = make_qx_quants(x.reshape(-1, 16))
    scales, codes = scales.reshape(-1, 16), codes.reshape(-1, 16, 16)
    peak, amax = _signed_peak(scales)  # [S]
    empty = amax < _EPS
    iscale = _div(-128.0, torch.where(empty, torch.ones_like(peak), peak))
    d = _div(1.0, iscale).to(torch.float16)  # [S]
    q_scales = torch.round(iscale[:, None] * scales).clamp(max=127)  # [S, 16] int8 values
    dj = d.float()[:, None] * q_scales  # [S, 16]
    redo = torch.round(x / torch.where(dj == 0, torch.ones_like(dj), dj)[..., None]).clamp(-32, 31) + 32
    codes = torch.where((dj != 0)[..., None], redo, codes)  # a zero scale keeps make_qx_quants' codes
    codes = torch.where(empty[:, None, None], 0.0, codes).to(torch.uint8).reshape(-1, 2, 4, 32)  # [S, half, quarter, l]
    ql = torch.cat([codes[:, :, 0] & 15 | (codes[:, :, 2] & 15) << 4,
                    codes[:, :, 1] & 15 | (codes[:, :, 3] & 15) << 4], dim=-1)  # [S, 2, 64]
    qh = (codes[:, :, 0] >> 4) | (codes[:, :, 1] >> 4) << 2 | (codes[:, :, 2] >> 4) << 4 | (codes[:, :, 3] >> 4) << 6
    q_scales = torch.where(empty[:, None], 0.0, q_scales).to(torch.int8).view(torch.uint8)
    d = torch.where(empty, torch.zeros_like(d), d).contiguous().view(torch.uint8).reshape(-1, 2)
    return torch.cat([ql.reshape(-1, 128), qh.reshape(-1, 64), q_scales, d], dim=-1).reshape(n, -1)


def unpack_q6_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks [N, K / 256 * 210] -> (q [N, B, 256] float32 = (L - 32) * its sub-block's int8
    scale, exact integers; d [N, B] float32), so that w = d * q as dequantize_row_q6_K computes."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, 210)
    ql = b[..., :128].reshape(n, -1, 2, 64)
    qh = b[..., 128:192].reshape(n, -1, 2, 32)
    low = torch.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], dim=-2)
    high = torch.stack([qh & 3, (qh >> 2) & 3, (qh >> 4) & 3, (qh >> 6) & 3], dim=-2)  # [N, B, 2, 4, 32]
    codes = (low | high << 4).float().reshape(n, -1, 16, 16) - 32
    scales = b[..., 192:208].contiguous().view(torch.int8).float()  # [N, B, 16]
    d = b[..., 208:210].contiguous().view(torch.float16).float()[..., 0]  # [N, B]
    return (codes * scales[..., None]).reshape(n, -1, QK_K), d


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (q [M, B, 256] float32 codes, d [M, B] float32): quantize_row_q8_K_ref
    (iscale = -127 / the signed peak, codes round half to even and capped at 127, d = 1 / iscale;
    an all-zero block has d = 0)."""
    m, k = x.shape
    xb = x.float().reshape(m, k // QK_K, QK_K)
    peak, amax = _signed_peak(xb)
    zero = amax == 0
    iscale = _div(-127.0, torch.where(zero, torch.ones_like(peak), peak))
    q = torch.round(iscale[..., None] * xb).clamp(max=127)
    return torch.where(zero[..., None], 0.0, q), torch.where(zero, 0.0, _div(1.0, iscale))
