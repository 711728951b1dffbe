"""fp8 (e4m3) dynamic linear: fp8 weights x fp8 activations quantized per call.

granularity "row": one scale per output channel (weights) and per token (activations), the
per-token quantization fused in one Triton kernel on CUDA; "tensor": one scale each.
torch._scaled_mm runs the product (cuBLASLt fp8 on sm89+). The CPU has no fp8 matrix unit: there
the fp8 values are upconverted and multiplied in fp32, so the CPU path is flagged emulated.
Also here: fp8 weight-only (Fp8WeightOnlyLinear), for decode.
"""

from __future__ import annotations

import torch

from autoao.kernels._base import CanonicalSpec, PerChannelWeights, QuantizedLinear
from autoao.kernels.layouts import PerChannel
from autoao.kernels.quant import FP8_DTYPE, load_triton_ops, quantize_fp8, quantize_per_token
from autoao.kernels.routes import KernelInfo
from autoao.kernels.tensors import add_bias, flatten_tokens, unflatten_tokens
from autoao.kernels.weight_only import GEMV_MAX_ROWS, WEIGHT_ONLY_VIEWS, pack_weight_only, weight_only_forward

GRANULARITIES = ("row", "tensor")


class Fp8DynLinear(QuantizedLinear):
    """Canonical: qweight [N, K] float8_e4m3fn, scale [N] (row) or [] (tensor) float32."""

    layout_type = PerChannel

    emulated_on = frozenset({"cpu"})
    rows_independent = True  # for granularity="row" only: see fusable

    def __init__(self, in_features, out_features, bias, dtype, device=None, granularity: str = "row"):
        super().__init__(in_features, out_features, bias, dtype, device)
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        self.granularity = granularity
        self._init_canonical()

    def params(self):
        return {"granularity": self.granularity}

    @classmethod
    def fusable(cls, granularity: str = "row", **params):
        # one tensor-wide scale would differ between the siblings
        return cls.rows_independent and granularity == "row"

    def canonical_spec(self) -> CanonicalSpec:
        n, k = self.out_features, self.in_features
        scale_shape = (n,) if self.granularity == "row" else ()
        return {"qweight": ((n, k), FP8_DTYPE), "scale": (scale_shape, torch.float32)}

    def quantize(self, weight, stats=None):
        q, s = quantize_fp8(weight, self.granularity)
        return {"qweight": q, "scale": s.reshape(self.canonical_spec()["scale"][0])}

    def _pack(self, device):
        if device.type == "cuda":
            load_triton_ops()
        self.register_buffer("w_q", self._canon["qweight"].to(device), persistent=False)  # [N, K]
        # _scaled_mm wants scale_b as [1, N] (row) or a scalar (tensor)
        s = self._canon["scale"]
        s = s[None, :] if self.granularity == "row" else s
        self.register_buffer("w_scale", s.to(device).contiguous(), persistent=False)

    def _quantize_act(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.granularity == "row":
            return quantize_per_token(x2, FP8_DTYPE)  # [M, K] fp8, [M, 1] fp32
        return quantize_fp8(x2, "tensor")  # [M, K] fp8, [] fp32

    def _forward(self, x):
        x2 = flatten_tokens(x)
        xq, xs = self._quantize_act(x2)
        if x2.is_cuda:
            # Rowwise scaling needs a bf16 output; tensorwise uses the same for one code path.
            y = torch._scaled_mm(xq, self.w_q.t(), scale_a=xs, scale_b=self.w_scale, out_dtype=torch.bfloat16,
                                 use_fast_accum=True)
        else:
            # The CPU's _scaled_mm upconverts too, but takes per-tensor scales only before torch 2.13:
            # the same product in fp32 ([M, 1] or [] token scales, [1, N] or [] weight scales), rounded
            # to bf16 like the CUDA output.
            y = ((xq.float() @ self.w_q.float().t()) * xs * self.w_scale).to(torch.bfloat16)
        return unflatten_tokens(add_bias(y.to(x.dtype), self.bias), x)

    def reference(self, x):
        xq, xs = quantize_fp8(flatten_tokens(x).float(), self.granularity)
        s = self._canon["scale"]
        w = self._canon["qweight"].float() * (s[:, None] if self.granularity == "row" else s)
        y = (xq.float() * xs) @ w.to(x.device).t()
        return unflatten_tokens(add_bias(y, self.bias), x)


class Fp8WeightOnlyLinear(PerChannelWeights):
    """fp8 e4m3 per-output-channel weights, activations in the model's dtype (decode-oriented:
    1 byte per weight like int8_wo, with e4m3's relative precision instead of a uniform grid).

    Canonical: qweight [N, K] float8_e4m3fn, scale [N] float32. CUDA: autoao's Triton GEMV for
    M <= 8 rows compiled (the hardware converts e4m3 pairs); eager calls of up to 64 rows run one CUDA kernel
    (kernels/cuda_rows.py), larger ones a dequantized bf16 weight into F.linear. The CPU has only
    the dequantizing path: emulated.
    """

    emulated_on = frozenset({"cpu"})
    qdtype = FP8_DTYPE
    runtime_views = WEIGHT_ONLY_VIEWS  # pack_weight_only's layout
    differentiable = True  # an x that requires grad takes the dequantizing path

    def quantize(self, weight, stats=None):
        q, s = quantize_fp8(weight, "row")
        return {"qweight": q, "scale": s.reshape(-1)}

    @classmethod
    def declared_kernels(cls, **params) -> tuple[KernelInfo, ...]:
        # one CUDA kernel (the CPU's one path carries its name)
        return (KernelInfo("triton", "cuda", single_op=_gemv_one_op),)

    def _pack(self, device):
        self._gemv = device.type == "cuda" and load_triton_ops()
        pack_weight_only(self, device, torch.float32)

    def _forward(self, x):
        return weight_only_forward(x, self.w_q, self.w_scale, self.bias, self._route, self._gemv)

    def reference(self, x):
        w = self._canon["qweight"].float() * self._canon["scale"][:, None]
        y = flatten_tokens(x).float() @ w.to(x.device).t()
        return unflatten_tokens(add_bias(y, self.bias), x)


def _gemv_one_op(m: int, n: int, k: int) -> bool:
    """Whether the CUDA "triton" kernel runs M rows as one op (KernelInfo.single_op): autoao's
    Triton GEMV."""
    return m <= GEMV_MAX_ROWS and load_triton_ops()
