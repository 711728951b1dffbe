"""int8 linears: dynamic (int8 weights x int8 activations) and weight-only.

Int8DynLinear: y = (q_x @ q_w^T) * s_x * s_w. With per-token activations (act="token") the integer
product runs in torch._int_mm (cuBLASLt int8 on CUDA; oneDNN on CPU), the activation quantization
fused in one Triton kernel on CUDA. With one activation scale per call (act="tensor", CPU only)
it is torch's prepacked dynamic linear, the kernel quantize_dynamic uses: "fbgemm" or "onednn"
(kernels/cpu_int8.py), one packed layout each.
Int8WeightOnlyLinear: y = x @ (q_w * s_w)^T. CUDA has two kernels (timing picks per layer):
"triton", autoao's Triton GEMV for M <= 8 rows (1 byte per weight, kernels/triton_gemv.py); eager
calls of up to 64 rows, a decode step's too, run one CUDA kernel (kernels/cuda_rows.py), larger ones the "dequant" path;
and "dequant", which casts the weight inside F.linear (gpt-fast's one-liner, 5 bytes moved per
weight unless max-autotune fuses the cast). The CPU has two:
"int8pack", torch._weight_int8pack_mm (fastest for a few rows: ~1 byte read per weight), and
"dequant", the weight cast to the activation dtype for one bf16 matmul (AMX-BF16 where the CPU has
it: ~5x faster than int8pack at 256 rows). All four read one layout (q_w, s_w), so a route
("int8pack<=16,dequant") serves decode and prefill from one packed weight.
"""

from __future__ import annotations

import torch

from autoao.kernels import cpu_int8
from autoao.kernels._base import PerChannelWeights
from autoao.kernels.cpu_isa import fbgemm_reduce_range
from autoao.kernels.algorithms import quantize_int8
from autoao.kernels.quant import (
    dequantize_output,
    load_triton_ops,
    quantize_int8_per_token,
    quantize_per_token,
)
from autoao.kernels.routes import KernelInfo, route_kernel
from autoao.kernels.tensors import add_bias, flatten_tokens, needs_grad, pad_rows, unflatten_tokens
from autoao.kernels.weight_only import GEMV_MAX_ROWS, WEIGHT_ONLY_VIEWS, pack_weight_only, weight_only_forward

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
    """int8 per-channel symmetric weights, int8 dynamic activations: symmetric per token
    (act="token") or asymmetric uint8 per tensor (act="tensor", torch's prepacked CPU kernels)."""

    ACTS = ("token", "tensor")
    algorithms = ("rtn", "smoothquant")

    def __init__(self, in_features, out_features, bias, dtype, device=None, act: str = "token",
                 algorithm: str = "rtn"):
        if act not in self.ACTS:
            raise ValueError(f"act must be one of {', '.join(self.ACTS)}, got {act!r}")
        self.act = act
        self._handle: int | None = None  # act="tensor": the packed weight (cpu_int8.prepack)
        super().__init__(in_features, out_features, bias, dtype, device, algorithm=algorithm)

    def params(self):
        return {"act": self.act, **super().params()}

    @classmethod
    def declared_kernels(cls, act: str = "token", **params) -> tuple[KernelInfo, ...]:
        if act == "tensor":  # torch's prepacked engines, one packed layout each (CPU only)
            return tuple(KernelInfo(engine, "cpu") for engine in cpu_int8.ENGINES)
        # CUDA: torch._int_mm after the fused Triton quantization. CPU, per token: "int_mm"
        # (torch._int_mm) wins at a few rows; above them its CPU kernel is ~15x slower than
        # "bf16_mm", the same int8 values (exact in bf16) in one bf16 matmul (AMX-BF16 where
        # present), its accumulator rounded to bf16 (~2^-9 relative). Both read w_q.
        return (KernelInfo("default", "cuda"),
                KernelInfo("int_mm", "cpu", layout="int8"), KernelInfo("bf16_mm", "cpu", layout="int8"))

    @classmethod
    def fusable(cls, **params):
        # act=tensor: one activation scale, numbers span rows; SmoothQuant: an input scale [K]
        return super().fusable(**params) and params.get("act", "token") == "token"

    def _pack(self, device):
        if device.type == "cuda":
            load_triton_ops()
        self.register_buffer("w_q", self._canon["qweight"].to(device), persistent=False)  # [N, K]
        self.register_buffer("w_scale", self._canon["scale"].to(device), persistent=False)  # [N]
        cpu_int8.release(self._handle)
        self._handle = None
        if self.act == "tensor" and device.type == "cpu":
            engine = self._route[0][0]
            self._reduce_range = engine == "fbgemm" and fbgemm_reduce_range()
            self._handle = cpu_int8.prepack(self, self._canon["qweight"], self._canon["scale"], engine)

    def __setstate__(self, state):
        # a deep copy (timing's streaming copies) gets a packed weight of its own
        super().__setstate__(state)
        if getattr(self, "_handle", None) is not None:
            self._handle = None
            self._pack(self.device)

    def _int_matmul(self, xq: torch.Tensor) -> torch.Tensor:
        """xq [M, K] int8 -> [M, N] int32 (exact), or fp32 (bf16-rounded: the "bf16_mm" kernel)."""
        m = xq.shape[0]
        if xq.is_cuda:
            xq = pad_rows(xq, 1, minimum=_INT_MM_MIN_ROWS_CUDA)
        elif route_kernel(self._route, m) == "bf16_mm":  # [M, N] integer sums, rounded to bf16, as fp32
            return torch.nn.functional.linear(xq.to(torch.bfloat16), self.w_q.to(torch.bfloat16)).float()
        return torch._int_mm(xq, self.w_q.t())[:m]

    def _forward(self, x):
        if self.act == "tensor":
            if self._handle is None:
                raise RuntimeError("int8_dyn(act=tensor) runs on the CPU only (torch's fbgemm / oneDNN kernels)")
            # x [..., K] as it comes: the op flattens the leading dims itself (a reshape each way
            # cost ~2.5 us of a 576x576 one-token call's 26 us, where fbgemm takes 17)
            y = cpu_int8.linear_dynamic(x.float().contiguous(), self._handle, self.out_features,
                                        self._reduce_range)  # [..., N] float32, a fresh tensor
            if self.bias is not None:
                # in place, in float32, before the one rounding to x.dtype: a second [M, N] tensor
                # for the sum held MiniLM's 32-sentence batch at 0.78x quantize_dynamic's speed
                # (the same fbgemm kernel); in place, 0.93x (docs/kernels.md#cpu-kernels)
                y.add_(self.bias.float())
            return y.to(x.dtype)
        x2 = flatten_tokens(x)
        xq, xs = quantize_per_token(x2, torch.int8)  # [M, K] int8, [M, 1] fp32
        y = dequantize_output(self._int_matmul(xq), xs, self.w_scale, self.bias, x.dtype)  # [M, N]
        return unflatten_tokens(y, x)

    def reference(self, x):
        if self.act == "tensor":
            y = cpu_int8.reference_per_tensor(flatten_tokens(self._scale_input_reference(x)), self._canon["qweight"],
                                              self._canon["scale"], getattr(self, "_reduce_range", False))
            return unflatten_tokens(add_bias(y, self.bias), x)
        xq, xs = quantize_int8_per_token(flatten_tokens(self._scale_input_reference(x)))
        w = self._canon["qweight"].to(x.device, torch.float64)
        y = (xq.double() @ w.t()) * xs.double() * self._canon["scale"].to(x.device, torch.float64)
        y = y.float()
        return unflatten_tokens(add_bias(y, self.bias), x)


class Int8WeightOnlyLinear(_Int8Weights):
    """int8 per-channel symmetric weights; activations stay in the model's dtype."""

    algorithms = ("rtn", "gptq")
    runtime_views = WEIGHT_ONLY_VIEWS  # pack_weight_only's layout
    differentiable = True  # an x that requires grad takes the dequantizing path

    @classmethod
    def declared_kernels(cls, **params) -> tuple[KernelInfo, ...]:
        # All four read one layout (w_q, w_scale). CUDA: the GEMV is 2.2-4.8x faster at M=1 on a datacenter GPU.
        return (KernelInfo("triton", "cuda", layout="int8", single_op=_gemv_one_op),
                KernelInfo("dequant", "cuda", layout="int8", same_code=_dequant_code),
                KernelInfo("int8pack", "cpu", layout="int8"),
                KernelInfo("dequant", "cpu", layout="int8"))

    def _pack(self, device):
        self._gemv = device.type == "cuda" and self.uses("triton") and load_triton_ops()
        pack_weight_only(self, device, self.dtype)  # both kernels take the scales in the activation dtype

    def _forward(self, x):
        # the CPU's "int8pack" takes rows (no backward: not for an x that requires grad); every other
        # kernel is weight_only_forward's (where the route says "triton" and _gemv is set, on CUDA or
        # in tests run interpreted: the GEMV, or eagerly the rows kernel; else the weight
        # dequantized per call into one matmul)
        if x.is_cpu and not needs_grad(x) and route_kernel(self._route, x.numel() // x.shape[-1]) == "int8pack":
            x2 = flatten_tokens(x)
            y = torch._weight_int8pack_mm(x2.contiguous(), self.w_q, self.w_scale.to(x.dtype))
            return unflatten_tokens(add_bias(y, self.bias), x)
        return weight_only_forward(x, self.w_q, self.w_scale, self.bias, self._route, self._gemv)

    def reference(self, x):
        w = self._canon["qweight"].float() * self._canon["scale"].to(self.dtype).float()[:, None]
        y = flatten_tokens(x).float() @ w.to(x.device).t()
        return unflatten_tokens(add_bias(y, self.bias), x)


##### timing hints (KernelInfo): functions of a call's rows M and the layer's N x K ###############

def _gemv_one_op(m: int, n: int, k: int) -> bool:
    """Whether the CUDA "triton" kernel runs M rows as one op: autoao's Triton GEMV."""
    return m <= GEMV_MAX_ROWS and load_triton_ops()


def _dequant_code(m: int, n: int, k: int) -> str | None:
    """The CUDA "dequant" kernel is the F.linear that "triton" runs above GEMV_MAX_ROWS rows, or at
    every M where the Triton ops cannot load."""
    return "triton" if m > GEMV_MAX_ROWS or not load_triton_ops() else None
