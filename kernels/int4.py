"""int4 weight-only linear, group-wise asymmetric (tinygemm's format).

CUDA has four kernels (timing picks per layer; `kernels` order):
- "tinygemm": torch._weight_int4pack_mm (bf16 activations only: other dtypes are cast to bf16 and
  back) on a tiled layout made at pack time, for every M;
- "cuda": autoao's CUDA C++ tensor-core GEMV (kernels/cuda_int4.py; built with nvcc on first use)
  on its own layout for M <= 8 rows, and for more rows that layout dequantized to bf16 by its CUDA
  kernel for one F.linear;
- "triton": the canonical nibble-packed weight read directly, by autoao's Triton GEMV for M <= 8
  rows (16 where its tensor-core kernel fits: triton_gemv.int4_max_rows) and, for more rows,
  dequantized to bf16 for one F.linear (tinygemm's large-M kernel is ~20x slower than bf16 at
  M=2048);
- "tinygemm_dequant": tinygemm for M <= 8 rows and the dequantizing F.linear above, for workloads
  with both decode and prefill; it keeps both layouts (1 byte per weight instead of 0.5).
The CPU has two: "tinygemm_cpu", torch._weight_int4pack_mm_for_cpu on its own tiled layout (fast
for a few rows, ~15-20x slower than bf16 at 256 rows), and "dequant", the canonical tensors
dequantized to bf16 per call for one bf16 matmul (AMX-BF16 where present). A CPU module holds its
canonical tensors in host memory anyway, so a route of the two ("tinygemm_cpu<=16,dequant") costs
no memory beyond the tiled layout.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from autoao.kernels import cuda_int4
from autoao.kernels.algorithms import quantize_int4
from autoao.kernels._base import CanonicalSpec, QuantizedLinear
from autoao.kernels.layouts import GroupedInt4
from autoao.kernels.quant import (
    dequantize_int4_groupwise,
    load_triton_ops,
    pack_int4,
    unpack_int4,
)
from autoao.kernels.ops import call_op
from autoao.kernels.routes import KernelInfo, route_kernel
from autoao.kernels.tensors import add_bias, flatten_tokens, needs_grad, unflatten_tokens
from autoao.kernels.triton_configs import int4_max_rows
from autoao.kernels.weight_only import GEMV_MAX_ROWS

GROUP_SIZES = (32, 64, 128)


def scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """scales, zeros [N, K/g] -> interleaved [K/g, N, 2], as tinygemm (CUDA and CPU) takes them."""
    return torch.stack([scales.t(), zeros.t()], dim=-1).contiguous()


def tinygemm_layout(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """autoao's canonical int4 tensors (qweight [N, K/2] uint8, scales/zeros [N, K/g] bf16, on a
    CUDA device) -> tinygemm's (tiled weight, scales_and_zeros [K/g, N, 2]) for
    torch._weight_int4pack_mm."""
    tiles = inner_k_tiles(qweight.shape[1] * 2)
    return torch._convert_weight_to_int4pack(qweight, tiles), scales_and_zeros(scales, zeros)


def triton_gemv_rows(in_features: int, group_size: int) -> int | None:
    """Rows up to which the "triton" kernel runs its GEMV (triton_configs.int4_max_rows: 8, or 16 where
    the tensor-core GEMV fits) on a layer with this K and group size; None where the Triton ops
    cannot load (the "triton" kernel then runs tinygemm's path)."""
    if not load_triton_ops():
        return None
    return int4_max_rows(in_features, group_size)


def inner_k_tiles(in_features: int) -> int | None:
    """tinygemm's innerKTiles for K: K must be a multiple of 16 * innerKTiles (8, 4 or 2)."""
    for tiles in (8, 4, 2):
        if in_features % (16 * tiles) == 0:
            return tiles
    return None


##### timing hints (KernelInfo): functions of a call's rows M and the layer's N x K ###############

def _one_op(m: int, n: int, k: int) -> bool:
    """The "tinygemm" kernel: one aten op at every M."""
    return True


def _gemv_one_op(m: int, n: int, k: int) -> bool:
    """The "cuda" and "tinygemm_dequant" kernels: one op (a GEMV) up to GEMV_MAX_ROWS rows; above
    them a dequantize, then a bf16 GEMM."""
    return m <= GEMV_MAX_ROWS


def _triton_one_op(m: int, n: int, k: int, group_size: int) -> bool:
    """The "triton" kernel: one custom op up to the rows its GEMV takes; without its ops it runs
    tinygemm's."""
    rows = triton_gemv_rows(k, group_size)
    return rows is None or m <= rows


def _triton_outrun_by(m: int, n: int, k: int, group_size: int) -> str | None:
    """The "cuda" kernel where it outruns "triton", that is where the two run comparable code: the GEMVs
    (M <= 8; the CUDA one was 1.21-5.67x faster on all 30 cells of g32/64/128 x llama8's shapes x
    M = 1, 8; docs/kernels.md#int4_wo) and the dequantize + bf16 GEMM above the rows Triton's
    tensor-core GEMV takes (10-12% faster on llama8's shapes at M = 2048, docs/kernels.md#int4_wo);
    in between (M 9-16) that GEMV races the CUDA kernel's dequantize + GEMM."""
    rows = triton_gemv_rows(k, group_size)
    return "cuda" if rows is not None and (m <= GEMV_MAX_ROWS or m > rows) else None


def _tinygemm_dequant_code(m: int, n: int, k: int, group_size: int) -> str | None:
    """The kernel whose code "tinygemm_dequant" runs: tinygemm's GEMV up to GEMV_MAX_ROWS rows, and
    above them the dequantize + F.linear that "triton" runs above the rows its GEMV takes."""
    if m <= GEMV_MAX_ROWS:
        return "tinygemm"
    rows = triton_gemv_rows(k, group_size)
    return "triton" if rows is not None and m > rows else None


class Int4WeightOnlyLinear(QuantizedLinear):
    """Canonical: qweight [N, K/2] uint8 (even k in the high nibble), scales and zeros [N, K/g] bf16,
    with w ~ (q - 8) * scale + zero; for AWQ also act_scale [K] float32 (the layer computes
    (x / act_scale) @ w^T, w quantized from W * act_scale)."""

    layout_type = GroupedInt4

    algorithms = ("rtn", "awq", "gptq", "hqq")
    rows_independent = True  # scales and zeros per (row, group)
    differentiable = True  # an x that requires grad takes a dequantizing path

    def __init__(self, in_features, out_features, bias, dtype, device=None, group_size: int = 128,
                 algorithm: str = "rtn"):
        super().__init__(in_features, out_features, bias, dtype, device)
        self._set_algorithm(algorithm)
        # The module whose GEMV runs after this one's (link_prefetch), or None. A plain attribute,
        # not a submodule: no state_dict entry, no cycle in the module tree.
        object.__setattr__(self, "prefetch_next", None)
        if group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
        if in_features % group_size:
            raise ValueError(f"in_features={in_features} is not a multiple of group_size={group_size}")
        self.group_size = group_size
        self._init_canonical()

    def params(self):
        return {"group_size": self.group_size, **({"algorithm": self.algorithm} if self.algorithm != "rtn" else {})}

    @classmethod
    def declared_kernels(cls, group_size: int = 128, **params) -> tuple[KernelInfo, ...]:
        # What each runs: the module docstring. "cuda" runs with the sm_90+ launch features of
        # cuda_int4.LaunchOptions. On the CPU "dequant" reads the canonical tensors, which live in
        # host memory beside the tiled layout.
        return (KernelInfo("tinygemm", "cuda", single_op=_one_op),
                KernelInfo("cuda", "cuda", options=cuda_int4.OPTIONS.tag(), single_op=_gemv_one_op),
                KernelInfo("triton", "cuda", outrun_by=partial(_triton_outrun_by, group_size=group_size),
                           single_op=partial(_triton_one_op, group_size=group_size)),
                KernelInfo("tinygemm_dequant", "cuda", single_op=_gemv_one_op,
                           same_code=partial(_tinygemm_dequant_code, group_size=group_size)),
                KernelInfo("tinygemm_cpu", "cpu", layout="int4_cpu"),
                KernelInfo("dequant", "cpu", layout="int4_cpu"))

    def canonical_spec(self) -> CanonicalSpec:
        n, k, g = self.out_features, self.in_features, self.group_size
        return {
            "qweight": ((n, k // 2), torch.uint8),
            "scales": ((n, k // g), torch.bfloat16),
            "zeros": ((n, k // g), torch.bfloat16),
            **self._input_scale_spec(),
        }

    def quantize(self, weight, stats=None):
        q, scales, zeros, act_scale = quantize_int4(weight, self.group_size, self.algorithm, stats)
        return {"qweight": pack_int4(q), "scales": scales, "zeros": zeros,
                **({"act_scale": act_scale} if act_scale is not None else {})}

    def _pack(self, device):
        c = self._canon
        self.drop_runtime()  # the other kernel's layout, if any
        self._gemv_rows = GEMV_MAX_ROWS  # rows up to which forward runs a GEMV (tinygemm, Triton, CUDA)
        if device.type == "cuda" and self.kernel == "cuda":
            self._pack_mma(device)
            return
        if device.type == "cuda" and (self.kernel == "tinygemm_dequant"
                                      or (self.kernel == "triton" and load_triton_ops())):
            self._pack_canonical(device)
            if self.kernel == "triton":
                self._gemv_rows = triton_gemv_rows(self.in_features, self.group_size)
                return
        if device.type == "cuda":  # tinygemm on CUDA: bf16 scales only
            packed, sz = tinygemm_layout(*(c[name].to(device) for name in ("qweight", "scales", "zeros")))
        else:
            q32 = unpack_int4(c["qweight"]).to(torch.int32)  # [N, K]
            packed = torch._convert_weight_to_int4pack_for_cpu(q32, 2)
            sz = scales_and_zeros(c["scales"], c["zeros"]).to(self.dtype)  # the CPU kernel: activation dtype
        self.register_buffer("w_packed", packed, persistent=False)
        self.register_buffer("scales_and_zeros", sz, persistent=False)

    def _pack_canonical(self, device: torch.device) -> None:
        """The canonical layout itself (qweight [N, K/2] uint8, scales/zeros [N, K/g] bf16) on
        `device`, read by the Triton GEMV and the dequantizing path (on CUDA; tests also pack it
        on the CPU)."""
        for name in ("qweight", "scales", "zeros"):
            self.register_buffer(f"{name}_rt", self._canon[name].to(device), persistent=False)

    def _pack_mma(self, device: torch.device) -> None:
        """The CUDA kernel's layout (cuda_int4.pack_mma) on `device`, its library built; raises
        ValueError for a shape it cannot run and RuntimeError where it cannot be built."""
        problem = cuda_int4.unsupported(self.out_features, self.in_features, self.group_size)
        if problem:
            raise ValueError(f"int4 kernel 'cuda': {problem}")
        cuda_int4.library(self.group_size, device)
        cuda_int4.reserve_scratch(device, self.out_features, self.in_features, self.group_size)
        c = self._canon
        qw, sz = cuda_int4.pack_mma(unpack_int4(c["qweight"]).to(device), c["scales"].to(device),
                                    c["zeros"].to(device), self.group_size)
        self.register_buffer("qweight_mma", qw, persistent=False)
        self.register_buffer("scales_mma", sz, persistent=False)

    def _forward(self, x):
        x2 = flatten_tokens(x)
        grad = needs_grad(x)  # the GEMVs and tinygemm have no backward: dequantize instead
        small = x2.shape[0] <= self._gemv_rows and not grad
        buffers = self._buffers  # read once: each nn.Module attribute lookup costs the host ~0.4 us
        qw = buffers.get("qweight_mma")
        if qw is not None:
            if small:
                # the next GEMV's CUDA layouts, if it has them: our kernel prefetches them into L2
                nxt = self.prefetch_next
                nxt = nxt._buffers if nxt is not None else {}
                y = call_op("int4_gemv_cuda", x2, qw, buffers["scales_mma"], self.group_size,
                            nxt.get("qweight_mma"), nxt.get("scales_mma"))
            else:  # [N, K] bf16 weight made by our dequantizing kernel, then one bf16 GEMM
                w = call_op("int4_dequant_cuda", qw, buffers["scales_mma"], self.group_size)
                y = F.linear(x2.to(torch.bfloat16), w)
        elif "qweight_rt" in self._buffers and not (small and self.kernel == "tinygemm_dequant"):
            xb = x2.to(torch.bfloat16)
            if small:
                y = call_op("int4_gemv", xb, self.qweight_rt, self.scales_rt, self.zeros_rt, self.group_size)
            else:  # [N, K] bf16 weight made on the fly, then one bf16 GEMM
                w = dequantize_int4_groupwise(unpack_int4(self.qweight_rt), self.scales_rt, self.zeros_rt)
                y = F.linear(xb, w.to(torch.bfloat16))
        elif grad or (x2.is_cpu and route_kernel(self._route, x2.shape[0]) == "dequant"):
            c = self._canon  # [N, K] bf16 weight made per call, one bf16 matmul
            w = dequantize_int4_groupwise(unpack_int4(c["qweight"]), c["scales"], c["zeros"])
            y = F.linear(x2.to(torch.bfloat16), w.to(x2.device, torch.bfloat16))
        elif x2.is_cuda:
            y = torch._weight_int4pack_mm(x2.to(torch.bfloat16).contiguous(), self.w_packed,
                                          self.group_size, self.scales_and_zeros)
        else:
            y = torch._weight_int4pack_mm_for_cpu(x2.contiguous(), self.w_packed, self.group_size,
                                                  self.scales_and_zeros.to(x2.dtype))
        return unflatten_tokens(add_bias(y if y.dtype == x.dtype else y.to(x.dtype), self.bias), x)

    def reference(self, x):
        c = self._canon
        w = dequantize_int4_groupwise(unpack_int4(c["qweight"]), c["scales"], c["zeros"])
        y = flatten_tokens(self._scale_input_reference(x)) @ w.to(x.device).t()
        return unflatten_tokens(add_bias(y, self.bias), x)


def link_prefetch(model: torch.nn.Module) -> None:
    """Tell each int4 module of `model` which module's GEMV runs after its own, so that its CUDA
    kernel can prefetch the first bytes of that module's weights into L2 (how many:
    cuda_int4.LaunchOptions.prefetch_mb; the DRAM is idle between GEMVs while norms and attention
    run). Call order is taken to be the module order of autoao's quantized layers (transformers
    registers layers in the order they run); fused siblings count as their group's one module. A
    wrong order only wastes bandwidth: the prefetch is a hint and never changes a result."""
    runs: list[torch.nn.Module] = []
    for m in model.modules():
        if not isinstance(m, QuantizedLinear):
            continue
        unit = m.fused[0].module if m.fused is not None else m
        if not runs or runs[-1] is not unit:
            runs.append(unit)
    for cur, nxt in zip(runs, runs[1:] + [None]):
        if isinstance(cur, Int4WeightOnlyLinear):
            object.__setattr__(cur, "prefetch_next", nxt if isinstance(nxt, Int4WeightOnlyLinear) else None)
