"""Dense linears that change only where the arithmetic happens, not the weights' numbers.

Bf16Linear: the `bf16_compute` candidate, for models in another dtype (fp32, fp16): weights stored
in bf16, computed in bf16 (the baseline candidate `bf16` leaves every nn.Linear as it came).

Fp32ComputeLinear: a bf16 / fp16 layer's own weights, multiplied in float32 where that is faster:
on a CPU fp32 GEMV beats bf16 at a few rows (measured 1536x576 at M=1 on a CPU with AMX: 76 us vs
124 us), and a CPU without AMX or AVX512-BF16 runs every bf16 matmul several times slower than
fp32. Kernels: "fp32" (an fp32 copy of the weight made at pack time, x cast to fp32 and the result
back) and "native" (the layer's own F.linear in its dtype), which read the same weight, so a
route ("fp32<=16,native") runs fp32 for decode and bf16 (AMX) for prefill.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoao.kernels._base import CanonicalSpec, QuantizedLinear
from autoao.kernels.routes import KernelInfo, route_kernel
from autoao.kernels.tensors import add_bias


class Bf16Linear(QuantizedLinear):
    """Canonical: weight [N, K] bf16. forward casts x to bf16 and the result back to x.dtype."""

    rows_independent = True
    differentiable = True  # F.linear

    def __init__(self, in_features, out_features, bias, dtype, device=None):
        super().__init__(in_features, out_features, bias, dtype, device)
        self._init_canonical()

    def canonical_spec(self) -> CanonicalSpec:
        return {"weight": ((self.out_features, self.in_features), torch.bfloat16)}

    def quantize(self, weight, stats=None):
        return {"weight": weight.to(torch.bfloat16)}

    def _pack(self, device):
        self.register_buffer("w", self._canon["weight"].to(device), persistent=False)

    def _forward(self, x):
        b = None if self.bias is None else self.bias.to(torch.bfloat16)
        return F.linear(x.to(torch.bfloat16), self.w, b).to(x.dtype)

    def reference(self, x):
        return add_bias(x.float() @ self._canon["weight"].float().to(x.device).t(), self.bias)


class Fp32ComputeLinear(QuantizedLinear):
    """Canonical: weight [N, K] in the layer's dtype, unchanged. "fp32" keeps an fp32 copy [N, K] at
    runtime (twice the bf16 bytes) wherever the route uses it."""

    rows_independent = True
    differentiable = True  # F.linear

    @classmethod
    def declared_kernels(cls, **params) -> tuple[KernelInfo, ...]:
        # all read the layer's weight ("fp32" adds a copy)
        return (KernelInfo("native", "cuda", layout="weight"),
                KernelInfo("fp32", "cpu", layout="weight"), KernelInfo("native", "cpu", layout="weight"))

    def __init__(self, in_features, out_features, bias, dtype, device=None):
        super().__init__(in_features, out_features, bias, dtype, device)
        self._init_canonical()

    def canonical_spec(self) -> CanonicalSpec:
        return {"weight": ((self.out_features, self.in_features), self.dtype)}

    def quantize(self, weight, stats=None):
        return {"weight": weight.to(self.dtype)}

    def _pack(self, device):
        self.drop_runtime()
        self.register_buffer("w", self._canon["weight"].to(device), persistent=False)  # [N, K] model dtype
        if self.uses("fp32"):
            self.register_buffer("w32", self._canon["weight"].to(device, torch.float32), persistent=False)

    def _forward(self, x):
        if route_kernel(self._route, x.reshape(-1, x.shape[-1]).shape[0]) == "fp32":
            b = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.w32, b).to(x.dtype)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.w.to(x.dtype), b)

    def reference(self, x):
        return add_bias(x.float() @ self._canon["weight"].float().to(x.device).t(), self.bias)
