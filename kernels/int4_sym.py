"""int4 weight-only, symmetric: the int4 that serving checkpoints hold exactly.

w = (q - 8) * scale with q in [0, 15] (signed codes q - 8 in [-8, 7]) and a bf16 scale per group of
`group_size` inputs of a row: compressed-tensors' symmetric pack-quantized W4A16 (llm-compressor's
W4A16 preset, GPTQ's `sym=True`), which vLLM's Marlin, SGLang and transformers load and compute
exactly. autoao's int4_wo stores a float zero per group (w = (q - 8) * scale + zero, tinygemm's
convention), which no such checkpoint can hold.

It is int4_wo's format with every zero 0, so it runs on int4_wo's kernels unchanged and exactly
(the canonical tensors are Int4WeightOnlyLinear's; zeros is all zeros). Scales: amax / 7.5 of the
group, rounded to bf16 before the codes are computed (compressed-tensors' and GPTQ's symmetric
convention: +amax rounds to 7.5 and clamps to 7, -amax to -8). GPTQ runs its column loop
(kernels/algorithms.py) on these parameters.
"""

from __future__ import annotations

import torch

from autoao.calibration import LayerStats
from autoao.kernels.algorithms import gptq_columns, memoized_fit, output_error_energy, weight_key, gptq_damping
from autoao.kernels.int4 import Int4WeightOnlyLinear
from autoao.kernels.quant import dequantize_int4_groupwise, pack_int4


def quantize_int4_symmetric(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (q [N, K] uint8 in [0, 15], scales [N, K/g] bf16) with w ~ (q - 8) * scale."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features={k} is not a multiple of group_size={group_size}")
    g = w.float().reshape(n, k // group_size, group_size)  # [N, K/g, g]
    scales = (g.abs().amax(2).clamp(min=1e-6) / 7.5).to(torch.bfloat16)  # [N, K/g]
    q = torch.round(g / scales.float()[..., None]).clamp(-8, 7) + 8
    return q.to(torch.uint8).reshape(n, k), scales


def gptq_int4_symmetric(weight: torch.Tensor, group_size: int, hessian: torch.Tensor, damp: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ (kernels/algorithms.gptq_columns) with symmetric scales fitted per group on the error-updated
    weights; round-to-nearest's where GPTQ's output error on the Hessian's rows is not lower."""
    def fit(wg: torch.Tensor) -> tuple:
        return (quantize_int4_symmetric(wg, wg.shape[1])[1],)  # [N, 1] bf16

    def rnd(col: torch.Tensor, p: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        s = p[0][:, 0].float()
        qc = torch.round(col / s).clamp(-8, 7)
        return (qc + 8).to(torch.uint8), qc * s

    hessian = hessian.to(weight.device)
    q, params = gptq_columns(weight, hessian, group_size, fit, rnd, damp)
    found = (q, torch.cat([p[0] for p in params], dim=1))
    rtn = quantize_int4_symmetric(weight, group_size)

    def error(qs: tuple[torch.Tensor, torch.Tensor]) -> float:
        return output_error_energy(weight, dequantize_int4_groupwise(qs[0], qs[1], torch.zeros_like(qs[1])), hessian)
    return rtn if error(found) > error(rtn) else found


class Int4SymmetricLinear(Int4WeightOnlyLinear):
    """Symmetric int4 group-wise weights (module docstring): Int4WeightOnlyLinear's canonical
    tensors and kernels, zeros all 0."""

    algorithms = ("rtn", "gptq")

    def quantize(self, weight: torch.Tensor, stats: LayerStats | None = None) -> dict[str, torch.Tensor]:
        if self.algorithm == "gptq" and stats is not None and stats.sample is not None and len(stats.sample):
            damp = gptq_damping(weight.shape[1], len(stats.sample))
            q, scales = memoized_fit(
                stats, ("gptq", "int4_sym", self.group_size, damp, weight_key(weight)),
                lambda: gptq_int4_symmetric(weight, self.group_size, stats.hessian(device=weight.device), damp),
                weight.device)
        else:
            q, scales = quantize_int4_symmetric(weight, self.group_size)
        return {"qweight": pack_int4(q), "scales": scales, "zeros": torch.zeros_like(scales)}
