"""Triton int4 GEMV (kernels/triton_int4.py) vs tinygemm vs bf16 at M=1 on Llama-3-8B shapes.

    source benchmarks/device_env.sh; python3 benchmarks/int4_gemv.py --out $OUT

Correctness against the dequantized float32 reference (relative L2 error), then CUDA-graph
timings with L2 flushed (evaluators/timing.time_cuda), the bytes each kernel must read, and the
fraction of the measured copy bandwidth reached.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from autoao import search_space
from autoao.evaluators.timing import time_cuda
from autoao.kernels.quant import dequantize_int4_groupwise, unpack_int4
from autoao.kernels.triton_int4 import int4_gemv

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--groups", default="128,32")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    med, *_ = time_cuda(lambda: b.copy_(a), reps=20, graph=False, flush_l2=False)
    bw = 2 * a.numel() * 2 / (med * 1e-6)
    del a, b
    lines = [f"# int4 GEMV at M=1 on {torch.cuda.get_device_name()} (torch {torch.__version__})", "",
             f"command: python {' '.join(sys.argv)}; copy bandwidth {bw / 1e12:.2f} TB/s", "",
             "| shape NxK | g | rel err triton | bf16 us | tinygemm us | triton us | triton vs tinygemm | "
             "triton vs bf16 | triton % of roofline |", "|---|---|---|---|---|---|---|---|---|"]
    for g in [int(v) for v in args.groups.split(",")]:
        for n, k in SHAPES:
            lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
            torch.nn.init.normal_(lin.weight, std=k ** -0.5)
            mod = search_space.get("int4_wo", group_size=g).build(lin)
            c = {name: t.cuda() for name, t in mod.canonical().items()}
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                ref = x.float() @ dequantize_int4_groupwise(unpack_int4(c["qweight"]), c["scales"], c["zeros"]).t()
                y = int4_gemv(x, c["qweight"], c["scales"], c["zeros"], g)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t_bf16 = time_cuda(lambda: F.linear(x, lin.weight))[0]
                t_tiny = time_cuda(lambda: mod(x))[0]
                t_tri = time_cuda(lambda: int4_gemv(x, c["qweight"], c["scales"], c["zeros"], g))[0]
            bytes_ = n * k / 2 + 4 * n * k / g + 2 * k + 2 * n
            roof_us = bytes_ / bw * 1e6
            lines.append(f"| {n}x{k} | {g} | {err:.1e} | {t_bf16:.1f} | {t_tiny:.1f} | {t_tri:.1f} | "
                         f"{t_tiny / t_tri:.2f}x | {t_bf16 / t_tri:.2f}x | {100 * roof_us / t_tri:.0f}% |")
            print(lines[-1], flush=True)
            del lin, mod, c
            torch.cuda.empty_cache()
    (out / "int4_gemv.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
