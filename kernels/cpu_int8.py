"""torch's prepacked dynamic int8 linear on the CPU (what `torch.ao.quantization.quantize_dynamic`
runs), as a kernel autoao can time, compile and save.

y = dequant(quant_u8(x) @ q_w^T): the activation quantized per tensor, asymmetric, to uint8
(scale = (max(x, 0) - min(x, 0)) / 255, 127 with reduce_range; zero point round(-min / scale)),
the per-channel int8 weight prepacked once by the engine's `linear_prepack` (fbgemm: VNNI on
AVX-512 CPUs; oneDNN: AMX-INT8 where present), the product and its dequantization fused by
`linear_dynamic`. `reference_per_tensor` is the same arithmetic in plain float32 torch ops.

The packed weight is a TorchScript object, which dynamo cannot trace as a module attribute; the
custom op `autoao::dynamic_qlinear` takes an integer handle to it instead, so the module compiles
with fullgraph=True (the handle is a constant of the compiled graph, one per packed layer).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from typing import Any, Iterator

import torch

from autoao.kernels.ops import EAGER, call_op

ENGINES = ("fbgemm", "onednn")

_PACKED: dict[int, Any] = {}  # handle -> the engine's packed weight (LinearPackedParamsBase)
_HANDLES = itertools.count(1)


def engine_missing(engine: str) -> str | None:
    """None if this torch build has the quantized engine `engine`, else why not."""
    have = torch.backends.quantized.supported_engines
    return None if engine in have else f"this torch build has no {engine!r} quantized engine (has: {', '.join(have)})"


@contextlib.contextmanager
def quantized_engine(engine: str) -> Iterator[None]:
    """Within this block torch's quantized ops pack for `engine` (a process-wide setting, restored
    after)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def prepack(owner: object, qweight: torch.Tensor, scale: torch.Tensor, engine: str) -> int:
    """Pack qweight [N, K] int8 with per-channel scale [N] for `engine`'s linear_dynamic; returns the
    handle dynamic_qlinear takes, released when `owner` is garbage-collected."""
    problem = engine_missing(engine)
    if problem:
        raise RuntimeError(problem)
    n = qweight.shape[0]
    with warnings.catch_warnings():  # quantized tensors are deprecated, yet the only way into linear_prepack
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        qw = torch._make_per_channel_quantized_tensor(qweight.cpu(), scale.cpu().double(),
                                                      torch.zeros(n, dtype=torch.long), 0)
    with quantized_engine(engine):
        packed = torch.ops.quantized.linear_prepack(qw, None)
    handle = next(_HANDLES)
    _PACKED[handle] = packed
    weakref.finalize(owner, _PACKED.pop, handle, None)
    return handle


def release(handle: int | None) -> None:
    if handle is not None:
        _PACKED.pop(handle, None)


def _dynamic_qlinear(x: torch.Tensor, handle: int, out_features: int, reduce_range: bool) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, _PACKED[handle], reduce_range)


@torch.library.custom_op("autoao::dynamic_qlinear", mutates_args=())
def dynamic_qlinear(x: torch.Tensor, handle: int, out_features: int, reduce_range: bool) -> torch.Tensor:
    """x [..., K] float32 -> [..., N] float32 through the packed weight `handle` (prepack)."""
    return _dynamic_qlinear(x, handle, out_features, reduce_range)


@dynamic_qlinear.register_fake
def _(x, handle, out_features, reduce_range):
    return x.new_empty(*x.shape[:-1], out_features)


EAGER["dynamic_qlinear"] = _dynamic_qlinear


def linear_dynamic(x: torch.Tensor, handle: int, out_features: int, reduce_range: bool) -> torch.Tensor:
    """x [..., K] float32 -> [..., N] float32 through the packed weight `handle`: the custom op
    dynamic_qlinear where torch.compile traces, the engine's op directly in eager mode (kernels/ops:
    a custom op's Python dispatch costs 10-35 us a call, as much as fbgemm's whole 576x576 product
    at M=1: 23 us raw, 58 us through the custom op, 2 threads, a CPU with AVX512-VNNI)."""
    return call_op("dynamic_qlinear", x, handle, out_features, reduce_range)


def quantize_per_tensor_u8(x: torch.Tensor, reduce_range: bool) -> tuple[torch.Tensor, float, int]:
    """x float -> (q in [0, qmax] as float32, scale, zero point): linear_dynamic's activation
    quantization (qmax 255, or 127 with reduce_range; the range always holds 0)."""
    qmax = 127 if reduce_range else 255
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / qmax if hi > lo else 1.0
    zero = int(round(-lo / scale))
    return (torch.round(x / scale) + zero).clamp(0, qmax), scale, zero


def reference_per_tensor(x2: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, reduce_range: bool
                         ) -> torch.Tensor:
    """x2 [M, K] -> [M, N] float32: per-tensor uint8 activations x per-channel int8 weights, in
    float64 then rounded to float32."""
    xq, xs, xz = quantize_per_tensor_u8(x2.float(), reduce_range)
    w = qweight.to(x2.device, torch.float64) * scale.to(x2.device, torch.float64)[:, None]
    return (((xq.double() - xz) * xs) @ w.t()).float()
