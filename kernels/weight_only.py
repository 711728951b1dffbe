"""The runtime layout and forward of the per-channel weight-only formats (int8_wo, fp8_wo): w_q
[N, K] in the module's `qdtype` and w_scale [N] in its scale dtype, laid out by pack_weight_only.

On the host they are buffers, w_q aliasing the canonical weight (no second copy of it in host
memory). On an accelerator they are views of one uint8 tensor, `w_packed` (PACKED): the N*K weight
bytes, then the scales from the next 16-byte boundary (Triton specializes a kernel on its
pointers' 16-byte divisibility), both contiguous. Eager calls read the views, kept as plain
attributes (`runtime_views`), paying no view op per call; traced code reads `w_packed` and makes
the views inside the graph (a CUDA graph replays them for free): packed_forward.

Why: a compiled caller evaluates guards on everything a module's forward reads, on every call, and
a compiled decode step of a small model is bound by the host. On a 64-layer compiled stack a
second tensor cost ~97 ns of the ~173 ns of checks int8_wo added a layer over nn.Linear
(docs/kernels.md#guards-on-a-compiled-caller). `w_packed` is a parameter (requires_grad=False, as bitsandbytes' packed
weights are, and left out of state_dict: the canonical tensors are the state) because dynamo
checks a parameter as it checks nn.Linear's weight, while a buffer of a module that is not torch's
own costs a dict check and an aliasing check more. With both, SmolLM2's
fp8_wo plan's guards on a datacenter GPU's host went 524 -> 214 us a compiled step, the model as it
came taking 72-77 (docs/kernels.md#guards-on-a-compiled-caller).
Functions, not a base class: each class in a module's MRO adds a check to every compiled call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from autoao.kernels import cuda_rows
from autoao.kernels.ops import call_op, cdiv
from autoao.kernels.routes import Route, route_kernel
from autoao.kernels.tensors import add_bias, flatten_tokens, needs_grad, same_storage, unflatten_tokens

if TYPE_CHECKING:
    from autoao.kernels._base import PerChannelWeights, QuantizedLinear

# Rows (tokens) up to which the weight-only "triton" kernels run autoao's GEMV (triton_gemv.py;
# int4's tensor-core kernel takes up to 16 where it fits: triton_gemv.int4_max_rows); beyond it they
# fall back to a dequantized weight in one bf16 GEMM.
GEMV_MAX_ROWS = 8
# The views eager calls read (a module's `runtime_views`), and the packed parameter's name.
WEIGHT_ONLY_VIEWS = ("w_q", "w_scale")
PACKED = "w_packed"
# What packed_forward takes beside the module: (qdtype, scale dtype, route, GEMV loaded), each
# distinct tuple once under a small int, which a packed module keeps (`_traced`). A compiled
# caller then checks one int a module and each tuple once a graph; a tuple attribute costs a type,
# a length and an equality check a module. Holds the distinct layouts a process packs: a handful.
# A dict, not a list: dynamo checks a list's length, so a layout packed later would recompile.
PackedCall = tuple[torch.dtype, torch.dtype, Route, bool]
PACKED_CALLS: dict[int, PackedCall] = {}
_PACKED_KEYS: dict[PackedCall, int] = {}


def packed_call_key(call: PackedCall) -> int:
    """The key of `call` in PACKED_CALLS (added on first use)."""
    key = _PACKED_KEYS.setdefault(call, len(_PACKED_KEYS))
    PACKED_CALLS[key] = call
    return key


def pack_weight_only(m: PerChannelWeights, device: torch.device, scale_dtype: torch.dtype) -> None:
    """Lay out a weight-only module's w_q and w_scale (its canonical scales cast to scale_dtype) on
    `device` (the module docstring). Canonical tensors on `device` (canonical_on_device) keep one copy
    of the weight there: the canonical qweight becomes the packed weight bytes, and a re-pack
    finding it there (a fused member wrote its rows through) rewrites only the scales."""
    q, s = m._canon["qweight"], m._canon["scale"].to(dtype=scale_dtype)
    held = m._parameters.get(PACKED)
    m.drop_runtime()
    if device.type == "cpu":
        m.register_buffer("w_q", q.to(device), persistent=False)  # [N, K]
        m.register_buffer("w_scale", s.to(device), persistent=False)  # [N]
        return
    in_place = held is not None and held.device == device and same_storage(held, q) and q.storage_offset() == 0
    buf = packed_buffer(q, s, device, into=held if in_place else None)
    if m._gemv:  # the kernel of eager calls on a prompt's rows, built once a device
        cuda_rows.prepare(device)
    m.register_parameter(PACKED, nn.Parameter(buf, requires_grad=False))
    m.w_q, m.w_scale = packed_views(buf, m.out_features, m.in_features, q.dtype, scale_dtype)
    if q.device == device:
        m._canon["qweight"] = m.w_q
    if "act_scale" not in m._canon:  # an input-scaled module divides first: its _forward does
        m._packed_call = (q.dtype, scale_dtype, m._route, m._gemv)
        m._traced = packed_call_key(m._packed_call)


def packed_buffer(q: torch.Tensor, s: torch.Tensor, device: torch.device | str,
                  into: torch.Tensor | None = None) -> torch.Tensor:
    """q [N, K] (1-byte dtype) and s [N] packed into one uint8 buffer on `device` (the module
    docstring); `into`: a packed buffer whose weight bytes q already is, where only s is written."""
    at = _scales_offset(*q.shape, s.element_size())
    buf = into
    if buf is None:
        buf = torch.empty(at + s.numel() * s.element_size(), dtype=torch.uint8, device=device)
        buf[:q.numel()].copy_(q.reshape(-1).view(torch.uint8))  # from wherever the canonical tensors are
    buf[at:].copy_(s.contiguous().view(torch.uint8))
    return buf


def _scales_offset(n: int, k: int, scale_bytes: int) -> int:
    """Where the scales start in a packed buffer: the first 16-byte boundary after the N*K weight
    bytes (the scale's own where K + scale_bytes < 16, a toy's layer), so that the padding is under
    K + scale_bytes and the buffer's length // (K + scale_bytes) is N."""
    align = 16 if k + scale_bytes >= 16 else scale_bytes
    return cdiv(n * k, align) * align


def packed_views(buf: torch.Tensor, n: int, k: int, qdtype: torch.dtype, scale_dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q [N, K] qdtype, w_scale [N] scale_dtype): views of a packed uint8 buffer."""
    at = _scales_offset(n, k, scale_dtype.itemsize)
    return buf[:n * k].view(qdtype).view(n, k), buf[at:].view(scale_dtype)


def per_channel_weight_only(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, gemv: bool) -> torch.Tensor:
    """x [..., K] @ (w_q * w_scale[:, None])^T in x.dtype for int8 or fp8 weights w_q [N, K] and
    scales w_scale [N]: autoao's Triton GEMV (torch.ops.autoao.per_channel_gemv; x at most
    GEMV_MAX_ROWS rows) when `gemv`, else the weight dequantized inside one F.linear, then scaled."""
    if gemv:
        return unflatten_tokens(call_op("per_channel_gemv", flatten_tokens(x), w_q, w_scale), x)
    y = torch.nn.functional.linear(x, w_q.to(x.dtype))  # x's leading dims as they are: no reshapes
    if y.is_cuda:
        # One launch, not two: the scales read as stored (fp32), one rounding. The CPU's mixed-dtype
        # multiply is ~20x slower than a cast and a bf16 one (y [256, 49152]: 31 against 1.5 ms).
        return y.mul_(w_scale)
    return y * w_scale.to(x.dtype)


def packed_forward(m: QuantizedLinear, x: torch.Tensor, qdtype: torch.dtype, scale_dtype: torch.dtype,
                   route: Route, gemv: bool) -> torch.Tensor:
    """A packed weight-only module's forward (x [..., K] -> [..., N]) traced off the host: reads its
    `w_packed` and bias only, the rest are arguments (PACKED_CALLS). N from the buffer's length, K
    from x: shapes dynamo checks already (out_features and in_features would be two checks more)."""
    buf, k = m.w_packed, x.shape[-1]
    n = buf.numel() // (k + scale_dtype.itemsize)
    return weight_only_forward(x, *packed_views(buf, n, k, qdtype, scale_dtype), m.bias, route, gemv)


def weight_only_forward(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                        route: Route, gemv: bool) -> torch.Tensor:
    """x [..., K] -> [..., N], bias added. Where `gemv` and the route's kernel for x's rows is
    "triton": eagerly cuda_rows' kernel up to its MAX_ROWS where it runs, else (and traced) the
    Triton GEMV up to GEMV_MAX_ROWS rows; else, and where autograd records x (needs_grad: they have
    no backward), the weight dequantized, whose F.linear carries x's gradient."""
    rows = x.numel() // x.shape[-1]
    triton = gemv and not needs_grad(x) and route_kernel(route, rows) == "triton"
    if triton and not torch.compiler.is_compiling() and rows <= cuda_rows.MAX_ROWS:
        y = cuda_rows.rows_linear(x, w_q, w_scale)
        if y is not None:
            return add_bias(y, bias)
    return add_bias(per_channel_weight_only(x, w_q, w_scale, triton and rows <= GEMV_MAX_ROWS), bias)
