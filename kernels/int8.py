"""int8 linears: dynamic (int8 weights x int8 per-token activations) and weight-only.

Int8DynLinear: y = (q_x @ q_w^T) * s_x * s_w, the integer product by torch._int_mm (cuBLASLt int8
on CUDA; oneDNN on CPU), the per-token activation quantization fused in one Triton kernel on CUDA.
Int8WeightOnlyLinear: y = x @ (q_w * s_w)^T; CPU runs torch._weight_int8pack_mm; CUDA has two
kernels (timing picks per layer): "triton", autoao's Triton GEMV for M <= 8 rows (1 byte per
weight, kernels/triton_gemv.py) and the "dequant" path for more rows, and "dequant", which casts
the weight inside F.linear (gpt-fast's one-liner, 5 bytes moved per weight unless max-autotune
fuses the cast).
"""

from __future__ import annotations

import torch

from autoao.kernels._base import (
    GEMV_MAX_ROWS,
    PerChannelWeights,
    flatten_tokens,
    pad_rows,
    per_channel_weight_only,
    unflatten_tokens,
)
from autoao.kernels.algorithms import quantize_int8
from autoao.kernels.quant import (
    dequantize_output,
    load_triton_ops,
    quantize_int8_per_token,
    quantize_per_token,
)

# torch._int_mm on CUDA needs M > 16 (cuBLASLt int8 heuristics); decode rows are padded up to this.
_INT_MM_MIN_ROWS_CUDA = 17


class _Int8Weights(PerChannelWeights):
    """Canonical: qweight [N, K] int8, scale [N] float32 (w ~ qweight * scale[:, None]), symmetric
    per output channel; for SmoothQuant also act_scale [K] float32 (the layer computes
    (x / act_scale) @ w^T, w quantized from W * act_scale)."""

    qdtype = torch.int8

    def quantize(self, weight, stats=None):
        q, s, act_scale = quantize_int8(weight, self.algorithm, stats)
        return {"qweight": q, "scale": s, **({"act_scale": act_scale} if act_scale is not None else {})}


class Int8DynLinear(_Int8Weights):
    """int8 per-channel symmetric weights, int8 per-token dynamic activations."""

    algorithms = ("rtn", "smoothquant")

    def _pack(self, device):
        if device.type == "cuda":
            load_triton_ops()
        self.register_buffer("w_q", self._canon["qweight"].to(device), persistent=False)  # [N, K]
        self.register_buffer("w_scale", self._canon["scale"].to(device), persistent=False)  # [N]

    def _int_matmul(self, xq: torch.Tensor) -> torch.Tensor:
        """xq [M, K] int8 -> [M, N] int32 (exact)."""
        m = xq.shape[0]
        if xq.is_cuda:
            xq = pad_rows(xq, 1, minimum=_INT_MM_MIN_ROWS_CUDA)
        return torch._int_mm(xq, self.w_q.t())[:m]

    def _forward(self, x):
        x2 = flatten_tokens(x)
        xq, xs = quantize_per_token(x2, torch.int8)  # [M, K] int8, [M, 1] fp32
        y = dequantize_output(self._int_matmul(xq), xs, self.w_scale, self.bias, x.dtype)  # [M, N]
        return unflatten_tokens(y, x)

    def reference(self, x):
        xq, xs = quantize_int8_per_token(flatten_tokens(self._scale_input_reference(x)))
        w = self._canon["qweight"].to(x.device, torch.float64)
        y = (xq.double() @ w.t()) * xs.double() * self._canon["scale"].to(x.device, torch.float64)
        y = y.float()
        return unflatten_tokens(self._add_bias(y), x)


class Int8WeightOnlyLinear(_Int8Weights):
    """int8 per-channel symmetric weights; activations stay in the model's dtype."""

    kernels = ("triton", "dequant")  # measured: the GEMV is 2.2-4.8x faster at M=1 on the H200
    algorithms = ("rtn", "gptq")

    @classmethod
    def same_code(cls, kernel, m, n, k, **params):
        # "dequant" is the F.linear that "triton" runs above GEMV_MAX_ROWS rows, or at every M
        # where the Triton ops cannot load
        if kernel == "dequant" and (m > GEMV_MAX_ROWS or not load_triton_ops()):
            return "triton"
        return None

    @classmethod
    def single_op(cls, kernel, m, n, k, **params):
        return kernel == "triton" and m <= GEMV_MAX_ROWS and load_triton_ops()  # the Triton GEMV

    def _pack(self, device):
        self._gemv = device.type == "cuda" and self.kernel == "triton" and load_triton_ops()
        self.register_buffer("w_q", self._canon["qweight"].to(device), persistent=False)  # [N, K]
        # Both kernels take the scales in the activation dtype.
        self.register_buffer("w_scale", self._canon["scale"].to(device, self.dtype), persistent=False)

    def _forward(self, x):
        x2 = flatten_tokens(x)
        if x2.is_cuda or self._gemv:  # (_gemv is set for CUDA; tests set it to run the GEMV interpreted)
            y = per_channel_weight_only(x2, self.w_q, self.w_scale, self._gemv)
        else:
            y = torch._weight_int8pack_mm(x2.contiguous(), self.w_q, self.w_scale.to(x.dtype))
        return unflatten_tokens(self._add_bias(y), x)

    def reference(self, x):
        w = self._canon["qweight"].float() * self._canon["scale"].to(self.dtype).float()[:, None]
        y = flatten_tokens(x).float() @ w.to(x.device).t()
        return unflatten_tokens(self._add_bias(y), x)
