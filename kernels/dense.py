"""bf16 linear for models in another dtype (fp32, fp16): weights stored in bf16, computed in bf16.

For a bf16 model the `bf16` candidate leaves nn.Linear untouched; this module exists so that a
plan can say "bf16 here" for an fp32 model and mean it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoao.kernels._base import CanonicalSpec, QuantizedLinear


class Bf16Linear(QuantizedLinear):
    """Canonical: weight [N, K] bf16. forward casts x to bf16 and the result back to x.dtype."""

    rows_independent = True

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
        return self._add_bias(x.float() @ self._canon["weight"].float().to(x.device).t())
