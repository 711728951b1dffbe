"""2:4 semi-structured sparse linears: plain, with int8 dynamic quantization, with fp8 dynamic.

Weights are pruned along K (2 of every 4 input channels kept; Wanda scores when activation norms
are given, magnitudes otherwise) and compressed for cuSPARSELt (torch._cslt_compress), whose
torch._cslt_sparse_mm computes W_sparse [N, K] @ B [K, M]; we pass B = x^T and take y back
row-major (`cslt_mm`, below). The per-channel weight scale rides in cuSPARSELt's
alpha vector. (torch's CUTLASS 2:4 backend refuses compute capability 9.0 in torch 2.11: measured.)

The CPU has no 2:4 kernel: there forward multiplies the pruned dense weight (the same numbers),
and the modules say `emulated`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoao.calibration import LayerStats
from autoao.clock import fastest
from autoao.kernels._base import CanonicalSpec, QuantizedLinear
from autoao.kernels.fp8 import Fp8DynLinear
from autoao.kernels.int8 import Int8DynLinear
from autoao.kernels.ops import EAGER, call_op
from autoao.kernels.quant import FP8_DTYPE, dequantize_output, prune_24_mask, quantize_per_token
from autoao.kernels.tensors import add_bias, flatten_tokens, needs_grad, pad_rows, unflatten_tokens

# cuSPARSELt's dense operand needs its row count (our M) aligned: 16 covers bf16/fp16, int8, fp8.
_CSLT_ROW_MULTIPLE = 16


def _prune(weight: torch.Tensor, stats: LayerStats | None) -> tuple[torch.Tensor, str]:
    """2:4-pruned weight, by Wanda where the layer's activation norms are known, else by magnitude."""
    act_norm = stats.act_norm if stats is not None else None
    mask = prune_24_mask(weight, act_norm)
    return weight * mask, ("wanda" if act_norm is not None else "magnitude")


def _cslt_linear(w_compressed: torch.Tensor, x2: torch.Tensor, alpha: torch.Tensor | None,
                 out_dtype: torch.dtype | None, n: int) -> torch.Tensor:
    """x2 [M, K] -> [M, N] (row-major) = x2 @ W^T through cuSPARSELt (W compressed, 2:4 along K)."""
    m = x2.shape[0]
    xp = pad_rows(x2, _CSLT_ROW_MULTIPLE)
    return call_op("cslt_mm", w_compressed, xp, alpha, out_dtype, n)[:m]  # [Mp, N] -> [M, N]


##### cuSPARSELt: algorithm and output layout chosen per problem ################################
# cuSPARSELt offers several algorithms (alg_id 0..max) per problem; torch uses 0 unless told, and
# which is fastest depends on the shape and dtype (torch's own search op is deprecated). It also
# computes W @ x^T, i.e. y^T [N, Mp]; y must reach the rest of the model row-major: a transposed
# view makes everything downstream strided (measured on a datacenter GPU: under torch.compile, attention
# fell back to the fp32 math kernel, 0.56x bf16). cuSPARSELt can write y row-major itself
# (transpose_result), which is free where supported; otherwise y^T is copied. Each (N, K, M,
# dtype) problem tries every (algorithm, way) once per process on first use and keeps the fastest,
# as the Triton GEMVs do.

_ALG: dict[tuple, tuple[int, bool]] = {}


def _alg_count() -> int:
    get = getattr(torch.backends.cusparselt, "get_max_alg_id", None)
    return (get() if get is not None else None) or 1


def _cslt_row_major(w_c: torch.Tensor, xt: torch.Tensor, alpha: torch.Tensor | None,
                    out_dtype: torch.dtype | None, alg: int, transposed: bool) -> torch.Tensor:
    # xt [K, Mp] column-major -> y [Mp, N] row-major
    if transposed:
        return torch._cslt_sparse_mm(w_c, xt, alpha=alpha, out_dtype=out_dtype, transpose_result=True, alg_id=alg)
    return torch._cslt_sparse_mm(w_c, xt, alpha=alpha, out_dtype=out_dtype, alg_id=alg).t().contiguous()


def _pick_alg(w_c: torch.Tensor, xt: torch.Tensor, alpha: torch.Tensor | None,
              out_dtype: torch.dtype | None) -> tuple[int, bool]:
    key = (w_c.numel(), tuple(xt.shape), xt.dtype, out_dtype, alpha is not None, xt.device.index)
    if key in _ALG:
        return _ALG[key]
    if xt.is_cuda and torch.cuda.is_current_stream_capturing():
        return 0, False  # no timing inside a graph capture: torch's default
    ref = _cslt_row_major(w_c, xt, alpha, out_dtype, 0, False).float()  # torch's default way
    tol = 1e-2 * ref.abs().max().item()

    def run(way: tuple[int, bool]):
        y = _cslt_row_major(w_c, xt, alpha, out_dtype, *way)
        # only ways that give the same numbers, row-major (a way that misreads a layout would be
        # fast and wrong)
        if not y.is_contiguous() or (y.float() - ref).abs().max().item() > tol:
            return None
        return lambda: _cslt_row_major(w_c, xt, alpha, out_dtype, *way)

    # RuntimeError: an algorithm or layout this problem does not support
    ways = [(alg, transposed) for alg in range(_alg_count()) for transposed in (True, False)]
    best = fastest(ways, run, skip=(RuntimeError,)) or (0, False)
    _ALG[key] = best
    return best


def cslt_mm_impl(w_c: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor | None, out_dtype: torch.dtype | None,
                 n: int) -> torch.Tensor:
    """x [Mp, K] @ W^T -> y [Mp, N] row-major, W compressed by torch._cslt_compress from [N, K],
    with the fastest cuSPARSELt algorithm and output layout for this problem (timed on first use)."""
    # cuSPARSELt takes the dense operand column-major (x^T of a row-major x); inductor may hand a
    # custom op its inputs in other strides than eager code would (measured: "operation not
    # supported" for a row-major [K, Mp]), so the layout is fixed here.
    xt = x.contiguous().t()  # [K, Mp]
    return _cslt_row_major(w_c, xt, alpha, out_dtype, *_pick_alg(w_c, xt, alpha, out_dtype))


@torch.library.custom_op("autoao::cslt_mm", mutates_args=())
def cslt_mm(w_c: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor | None, out_dtype: torch.dtype | None,
            n: int) -> torch.Tensor:
    """Custom-op wrapper of cslt_mm_impl: opaque to torch.compile, so the algorithm is chosen at run
    time, not at trace time."""
    return cslt_mm_impl(w_c, x, alpha, out_dtype, n)


EAGER["cslt_mm"] = cslt_mm_impl


@cslt_mm.register_fake
def _(w_c, x, alpha, out_dtype, n):
    return x.new_empty((x.shape[0], n), dtype=out_dtype or x.dtype)


class Sparse24Linear(QuantizedLinear):
    """2:4-pruned weights in the model's dtype (bf16 compute on CUDA for fp32 models).

    Canonical: weight [N, K] in the layer dtype, zeros where pruned.
    """

    emulated_on = frozenset({"cpu"})
    calibration_uses = frozenset({"act_norm"})  # Wanda
    rows_independent = True  # 2:4 chosen within each row
    differentiable = True  # an x that requires grad takes the pruned weight's F.linear

    def __init__(self, in_features, out_features, bias, dtype, device=None):
        super().__init__(in_features, out_features, bias, dtype, device)
        self.prune_rule = "unknown"  # "wanda" or "magnitude" once quantized; informational
        self._init_canonical()

    def canonical_spec(self) -> CanonicalSpec:
        return {"weight": ((self.out_features, self.in_features), self.dtype)}

    def quantize(self, weight, stats=None):
        w, self.prune_rule = _prune(weight, stats)
        return {"weight": w.to(self.dtype)}

    @property
    def _cuda_dtype(self) -> torch.dtype:
        return self.dtype if self.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16

    def _pack(self, device):
        w = self._canon["weight"]
        if device.type == "cuda":
            self.register_buffer("w_c", torch._cslt_compress(w.to(device, self._cuda_dtype)), persistent=False)
        else:
            self.register_buffer("w_c", w, persistent=False)  # dense, pruned: the emulated path

    def _forward(self, x):
        x2 = flatten_tokens(x)
        if x2.is_cpu:
            y = F.linear(x2, self.w_c.to(x2.dtype))
        elif needs_grad(x):  # cuSPARSELt has no backward: the pruned weight, dense
            y = F.linear(x2, self._canon["weight"].to(x2.device, x2.dtype))
        else:
            y = _cslt_linear(self.w_c, x2.to(self._cuda_dtype), None, None, self.out_features)
        return unflatten_tokens(add_bias(y.to(x.dtype), self.bias), x)

    def reference(self, x):
        y = flatten_tokens(x).float() @ self._canon["weight"].float().to(x.device).t()
        return unflatten_tokens(add_bias(y, self.bias), x)


class Sparse24Int8DynLinear(Int8DynLinear):
    """2:4-pruned int8 per-channel weights x int8 per-token dynamic activations.

    Canonical as Int8DynLinear (qweight is 2:4 sparse). CUDA: cuSPARSELt int8 with the weight
    scale as alpha; CPU: torch._int_mm on the dense pruned weight (emulated).
    """

    emulated_on = frozenset({"cpu"})
    calibration_uses = frozenset({"act_norm"})  # Wanda
    prune_rule = "unknown"  # "wanda" or "magnitude" once quantized; informational

    def quantize(self, weight, stats=None):
        # SmoothQuant scales whole input channels, which leaves every Wanda score |W_k| ||x_k|| as
        # it was: pruning the unscaled weight keeps the same 2:4 mask
        w, self.prune_rule = _prune(weight, stats)
        return super().quantize(w, stats)

    def _pack(self, device):
        super()._pack(device)
        if device.type == "cuda":
            self.register_buffer("w_q", torch._cslt_compress(self.w_q), persistent=False)

    def _forward(self, x):
        x2 = flatten_tokens(x)
        if not x2.is_cuda:
            return super()._forward(x)
        xq, xs = quantize_per_token(x2, torch.int8)
        y = _cslt_linear(self.w_q, xq, self.w_scale, torch.bfloat16, self.out_features)  # [M, N] = (xq @ qw^T) * s_w
        return unflatten_tokens(dequantize_output(y, xs, None, self.bias, x.dtype), x)


class Sparse24Fp8DynLinear(Fp8DynLinear):
    """2:4-pruned fp8 rowwise weights x fp8 per-token dynamic activations (cuSPARSELt fp8, sm90).

    Canonical as Fp8DynLinear(granularity="row"). CPU: Fp8DynLinear's emulated product on the
    dense pruned weight.
    """

    calibration_uses = frozenset({"act_norm"})  # Wanda
    prune_rule = "unknown"

    def __init__(self, in_features, out_features, bias, dtype, device=None):
        super().__init__(in_features, out_features, bias, dtype, device, granularity="row")

    def params(self):
        return {}

    def quantize(self, weight, stats=None):
        # SmoothQuant scales whole input channels, which leaves every Wanda score |W_k| ||x_k|| as
        # it was: pruning the unscaled weight keeps the same 2:4 mask
        w, self.prune_rule = _prune(weight, stats)
        return super().quantize(w, stats)

    def _pack(self, device):
        super()._pack(device)
        if device.type == "cuda":
            self.register_buffer("w_q", torch._cslt_compress(self.w_q), persistent=False)
            self.register_buffer("w_scale", self.w_scale.reshape(-1).contiguous(), persistent=False)  # [N]

    def _forward(self, x):
        x2 = flatten_tokens(x)
        if not x2.is_cuda:
            return super()._forward(x)
        xq, xs = quantize_per_token(x2, FP8_DTYPE)
        # cuSPARSELt 0.8 refuses alpha-vector scaling for fp8 (measured on a datacenter GPU: docs/kernels.md#24-sparse):
        # both scales go in the (fused) epilogue.
        y = _cslt_linear(self.w_q, xq, None, torch.bfloat16, self.out_features)
        return unflatten_tokens(dequantize_output(y, xs, self.w_scale, self.bias, x.dtype), x)
