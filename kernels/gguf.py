"""GGUF block types as llama.cpp computes them, emulated in plain torch.

A GGUF tensor is a row-major [N, K] matrix stored as blocks of 32 consecutive inputs of one row:

    Q8_0  34 bytes: fp16 d, int8 q[32]                   w = d * q
    Q4_0  18 bytes: fp16 d, 16 bytes of nibbles          w = d * (q - 8),   q in [0, 15]
    Q4_1  20 bytes: fp16 d, fp16 m, 16 bytes of nibbles  w = d * q + m,     q in [0, 15]
    Q6_K  210 bytes per super-block of 256 inputs (kernels/gguf_k.py), for K a multiple of 256

(nibbles: byte j holds element j in its low and element j + 16 in its high nibble). The canonical
tensor of a `GgufLinear` is exactly those bytes, [N, K / 32 * bytes per block] uint8, so an export
writes what the module computed with, bit for bit.

Weights are quantized as ggml's reference functions do (`quantize_row_*_ref` in ggml-quants.c,
what `llama-quantize` runs without an importance matrix): float32 arithmetic, the block's scale
computed in float32 and stored as fp16, codes from the float32 scale, `roundf` (half away from
zero) for Q8_0 and truncation of `x * id + 8.5` / `(x - min) * id + 0.5` for Q4_0 / Q4_1.

A llama.cpp matmul never multiplies float activations by these weights: it first quantizes each
activation row to blocks of 32 (`from_float` of the weight type's `vec_dot_type`: Q8_0 for Q8_0
and Q4_0, Q8_1 for Q4_1, Q8_K (blocks of 256) for Q6_K; on x86 with AVX2, id = 127 / amax and round-half-to-even), then sums
per block d_w * d_x * sum(q_w * q_x) (+ m_w * s_x for Q4_1, s_x = fp16(d_x * sum(q_x))).
`GgufLinear.forward` computes those terms from the same codes and scales (block_matmul: one float64
matmul of the scaled codes, so only rounding differs from llama.cpp's SIMD loops). autoao has no
fast kernel for these types on any device: the module is emulated everywhere, and its speed is
never reported (llama.cpp's is, where it is installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autoao.kernels._base import CanonicalSpec, QuantizedLinear
from autoao.kernels.gguf_k import quantize_q6_k, quantize_q8_k, unpack_q6_k
from autoao.kernels.layouts import GgufBlocks
from autoao.kernels.tensors import add_bias, flatten_tokens, unflatten_tokens

BLOCK = 32  # inputs per block, every type here


@dataclass(frozen=True)
class GgufType:
    """One GGUF block type: its name in llama.cpp, ggml's type id, bytes per block of 32."""

    name: str  # "Q8_0"
    ggml_type: int  # gguf.GGMLQuantizationType value
    block_bytes: int
    bits: int  # bits per weight code
    activation: str  # the vec_dot_type llama.cpp quantizes activations to
    block: int = BLOCK  # inputs per block: 32, or 256 for the K-quants' super-blocks

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / self.block


TYPES: dict[str, GgufType] = {t.name.lower(): t for t in (
    GgufType("Q8_0", 8, 34, 8, "Q8_0"),
    GgufType("Q4_0", 2, 18, 4, "Q8_0"),
    GgufType("Q4_1", 3, 20, 4, "Q8_1"),
    GgufType("Q6_K", 14, 210, 6, "Q8_K", block=256),  # kernels/gguf_k.py
)}


##### weights: ggml's reference quantization ####################################################

def _fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """[N, B] float32 -> [N, B, 2] uint8: the fp16 value's little-endian bytes (round to nearest even)."""
    return v.to(torch.float16).contiguous().view(torch.uint8).reshape(*v.shape, 2)


def _fp16_from(b: torch.Tensor) -> torch.Tensor:
    """[N, B, 2] uint8 -> [N, B] float32."""
    return b.contiguous().view(torch.float16).reshape(b.shape[:-1]).float()


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero), exact for every float32: floor(|x|) plus 1 where the
    fraction is >= 0.5 (|x| + 0.5 would round up 0.49999997)."""
    a = x.abs()
    f = a.floor()
    return torch.sign(x) * (f + (2 * (a - f)).floor().clamp(max=1))


def _over(num: float, d: torch.Tensor) -> torch.Tensor:
    """d ? num / d : 0.0f, elementwise in float32, correctly rounded. (A Python scalar divided by a
    tensor is computed by torch as num * (1 / d), two roundings: 127 / 7.5 came out 16.933334
    where C's float division gives 16.933332.)"""
    safe = torch.where(d == 0, torch.ones_like(d), d)
    return torch.where(d == 0, torch.zeros_like(d), torch.div(torch.full_like(d, num), safe))


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, B, 32] codes in [0, 15] -> [N, B, 16] uint8: byte j = q[j] | q[j + 16] << 4."""
    q = q.to(torch.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def _unpack_nibbles(b: torch.Tensor) -> torch.Tensor:
    """[N, B, 16] uint8 -> [N, B, 32] uint8 codes in [0, 15]."""
    return torch.cat([b & 15, b >> 4], dim=-1)


def quantize(weight: torch.Tensor, type_name: str) -> torch.Tensor:
    """weight [N, K] float -> GGUF blocks [N, K / block * block_bytes] uint8, as ggml's
    quantize_row_<type>_ref computes them."""
    t = TYPES[type_name]
    n, k = weight.shape
    if k % t.block:
        raise ValueError(f"GGUF {t.name}: in_features={k} is not a multiple of {t.block}")
    if t.name == "Q6_K":
        return quantize_q6_k(weight.detach().float())
    x = weight.detach().float().reshape(n, k // BLOCK, BLOCK)  # [N, B, 32]
    if t.name == "Q8_0":
        d = x.abs().amax(-1) / 127  # [N, B]
        q = _roundf(x * _over(1.0, d)[..., None]).to(torch.int8).view(torch.uint8)
        parts = [_fp16_bytes(d), q]
    elif t.name == "Q4_0":
        # the signed value of largest magnitude (the first one on ties), mapped to code 0
        peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))[..., 0]  # [N, B]
        d = peak / -8
        q = torch.trunc(x * _over(1.0, d)[..., None] + 8.5).clamp(max=15)
        parts = [_fp16_bytes(d), _pack_nibbles(q)]
    else:  # Q4_1
        lo, hi = x.amin(-1), x.amax(-1)  # [N, B]
        d = (hi - lo) / 15
        q = torch.trunc((x - lo[..., None]) * _over(1.0, d)[..., None] + 0.5).clamp(max=15)
        parts = [_fp16_bytes(d), _fp16_bytes(lo), _pack_nibbles(q)]
    return torch.cat(parts, dim=-1).reshape(n, -1)


def unpack(blocks: torch.Tensor, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GGUF blocks [N, K / block * block_bytes] uint8 -> (q [N, B, block] float32 codes as the dot
    product uses them: int8 for Q8_0, nibble - 8 for Q4_0, nibble for Q4_1, 6-bit code - 32 times
    its sub-block's int8 scale for Q6_K; d [N, B] float32; m [N, B] float32 for Q4_1, else None)."""
    t = TYPES[type_name]
    n = blocks.shape[0]
    if t.name == "Q6_K":
        return (*unpack_q6_k(blocks), None)
    b = blocks.reshape(n, -1, t.block_bytes)  # [N, B, bytes]
    d = _fp16_from(b[..., 0:2])
    if t.name == "Q8_0":
        return b[..., 2:].contiguous().view(torch.int8).float(), d, None
    if t.name == "Q4_0":
        return _unpack_nibbles(b[..., 2:]).float() - 8, d, None
    return _unpack_nibbles(b[..., 4:]).float(), d, _fp16_from(b[..., 2:4])


def dequantize(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """GGUF blocks -> [N, K] float32, as ggml's dequantize_row_<type> computes it."""
    q, d, m = unpack(blocks, type_name)
    w = q * d[..., None] if m is None else q * d[..., None] + m[..., None]
    return w.reshape(q.shape[0], -1)


##### activations: what llama.cpp's matmul quantizes them to #####################################

def quantize_activations(x: torch.Tensor, with_sum: bool, kind: str = "Q8_0"
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [M, K] float -> (q [M, B, 32] float32 integer codes in [-127, 127], d [M, B] float32
    holding fp16 values, s [M, B] float32 holding fp16 values or None): llama.cpp's Q8_0
    (with_sum False) or Q8_1 (with_sum True, s = d * sum(q)) from_float on x86 with AVX2 (the
    codes from id = 127 / amax, rounded half to even; d = amax / 127 stored as fp16). kind "Q8_K":
    the K-quants' activations instead, blocks of 256 with a float32 d (kernels/gguf_k.py)."""
    if kind == "Q8_K":
        return (*quantize_q8_k(x), None)
    m, k = x.shape
    xb = x.float().reshape(m, k // BLOCK, BLOCK)  # [M, B, 32]
    amax = xb.abs().amax(-1)  # [M, B]
    q = torch.round(xb * _over(127.0, amax)[..., None])
    d = amax / 127  # float32; stored as fp16, and s is computed from the float32 value
    s = (d * q.sum(-1)).to(torch.float16).float() if with_sum else None
    return q, d.to(torch.float16).float(), s


def scaled(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Codes q [R, B, block] times their block scales d [R, B] -> [R, B * block] float32 (for Q4_1
    without its minimum, which llama.cpp's dot product adds as m * s)."""
    return (q * d[..., None]).reshape(q.shape[0], -1)


def block_matmul(qx: torch.Tensor, dx: torch.Tensor, sx: torch.Tensor | None,
                 wd: torch.Tensor, mw: torch.Tensor | None) -> torch.Tensor:
    """llama.cpp's quantized dot products for every (row, output): activation codes qx [M, B, block]
    with scales dx, sums sx [M, B]; weights wd = scaled(qw, dw) [N, K], minimums mw [N, B] ->
    y [M, N] float32 = sum_b (dw * dx) * (qw . qx) (+ mw * sx).

    One float64 matmul of the scaled codes. Each scaled weight is exact in float32 (a code of at
    most 13 bits times an fp16 scale), each scaled activation and each product of two exact in
    float64, so the sum is the exact one up to float64 rounding: where ggml rounds each block's
    term to float32, this rounds once, at the end. Over six prompts of SmolLM2 with GGUF on every layer, llama.cpp's
    greedy tokens followed this route as long as or longer than the route that rounds each block's
    term as ggml does (`block_sums`), which ran the model's 256-token forward about 3x slower than
    this one (docs/kernels.md#gguf-emulation)."""
    y = scaled(qx.double(), dx.double()) @ wd.double().t()
    if mw is not None:
        y = y + sx.double() @ mw.double().t()  # type: ignore[union-attr]
    return y.float()


def block_sums(qx: torch.Tensor, dx: torch.Tensor, sx: torch.Tensor | None,
               qw: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor | None) -> torch.Tensor:
    """block_matmul's numbers in ggml's order: qw [N, B, block], dw, mw [N, B]; each block's integer
    dot products summed exactly, scaled by fp32 d_w * d_x, and the blocks' terms summed in float32.
    Rows go in chunks so that the [B, rows, N] partial sums stay within 64 MiB."""
    m, nb, size = qx.shape
    n = qw.shape[0]
    # Q6_K's super-block sums reach 256 * 127 * 32 * 127 > 2^24: exact only in float64
    exact = torch.float32 if size == BLOCK else torch.float64
    wt = qw.permute(1, 2, 0).to(exact)  # [B, block, N]
    chunk = max(1, (1 << 24) // max(1, n * nb))
    out = []
    for lo in range(0, m, chunk):
        sums = torch.bmm(qx[lo:lo + chunk].transpose(0, 1).to(exact), wt)  # [B, rows, N]: exact integers
        scale = dx[lo:lo + chunk].t()[:, :, None] * dw.t()[:, None, :]  # [B, rows, N]: fp32 d_w * d_x
        y = (scale * sums).sum(0).float()  # [rows, N]
        if mw is not None:
            y = y + sx[lo:lo + chunk] @ mw.t()  # type: ignore[index]
        out.append(y)
    return torch.cat(out)


class GgufLinear(QuantizedLinear):
    """One GGUF block type (`type`: "q8_0", "q4_0", "q4_1", "q6_k"), computed as llama.cpp does.

    Canonical: blocks [N, K / block * block_bytes] uint8 (the GGUF tensor's bytes). Emulated on
    every device (see the module docstring)."""

    layout_type = GgufBlocks

    emulated_on = frozenset({"cpu", "cuda"})

    def __init__(self, in_features, out_features, bias, dtype, device=None, type: str = "q8_0"):
        super().__init__(in_features, out_features, bias, dtype, device)
        if type not in TYPES:
            raise ValueError(f"GGUF type must be one of {', '.join(TYPES)}, got {type!r}")
        if in_features % TYPES[type].block:
            raise ValueError(f"in_features={in_features} is not a multiple of the GGUF {TYPES[type].name} block "
                             f"({TYPES[type].block})")
        self.type = type
        self._init_canonical()

    @property
    def gguf_type(self) -> GgufType:
        return TYPES[self.type]

    def params(self):
        return {"type": self.type}

    def canonical_spec(self) -> CanonicalSpec:
        row_bytes = self.in_features // self.gguf_type.block * self.gguf_type.block_bytes
        return {"blocks": ((self.out_features, row_bytes), torch.uint8)}

    def quantize(self, weight, stats=None):
        return {"blocks": quantize(weight, self.type)}

    def _pack(self, device):
        # the codes times their block scales [N, K] fp32, and Q4_1's minimums m [N, B] fp32
        q, d, m = unpack(self._canon["blocks"], self.type)
        self.register_buffer("w_scaled", scaled(q, d).to(device), persistent=False)  # [N, K] float32
        self.register_buffer("w_m", None if m is None else m.to(device), persistent=False)

    def _forward(self, x):
        x2 = flatten_tokens(x)
        qx, dx, sx = quantize_activations(x2, with_sum=self.w_m is not None, kind=self.gguf_type.activation)
        y = block_matmul(qx, dx, sx, self.w_scaled, self.w_m)  # [M, N] float32
        return unflatten_tokens(add_bias(y, self.bias).to(x.dtype), x)

    def reference(self, x):
        """The same numbers in ggml's order (block_sums): differs from forward by rounding alone."""
        qx, dx, sx = quantize_activations(flatten_tokens(x), with_sum=self.w_m is not None,
                                          kind=self.gguf_type.activation)
        q, d, m = unpack(self._canon["blocks"], self.type)
        dev = x.device
        y = block_sums(qx, dx, sx, q.to(dev), d.to(dev), None if m is None else m.to(dev))
        return unflatten_tokens(add_bias(y, self.bias).to(x.dtype), x)
