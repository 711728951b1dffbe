"""Triton weight-only GEMVs (kernels/triton_gemv.py) against torch's kernels at M = 1, 4, 8.

    source benchmarks/device_env.sh; python3 benchmarks/gemv_bench.py --out $OUT

For each layer shape of Llama-3-8B and SmolLM2-135M: correctness of each Triton kernel against the
fp64 product with the dequantized weight; at M=1 a sweep of every launch configuration (CSV), and
the best one against bf16 `F.linear`, tinygemm (int4), `F.linear(x, w.to(bf16)) * s` eager and
compiled and `torch._weight_int8pack_mm` (int8), the dequantizing F.linear (fp8); at M=4 and 8 the
six best M=1 configurations and each kernel variant's best. Timings: CUDA graphs, L2 flushed by reading 256 MB, median
(evaluators/timing.time_cuda). Roofline: the bytes each kernel must read over the measured copy
bandwidth.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from autoao import search_space
from autoao.evaluators.timing import time_cuda
from autoao.kernels import triton_gemv as tg
from autoao.kernels.quant import (dequantize_int4_groupwise, quantize_fp8, quantize_int4_groupwise,
                                  quantize_int8_per_channel, pack_int4)

sys.path.insert(0, str(Path(__file__).parent))
from bandwidth import copy_bandwidth  # noqa: E402

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096),
          (576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]  # (N, K): Llama-3-8B, SmolLM2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--shapes", default="all", help="'all' or indices into SHAPES, e.g. 0,4")
    ap.add_argument("--tokens", default="1,4,8", help="M values (the sweep runs at the first)")
    ap.add_argument("--kinds", default="int4,int8,fp8", help="comma-separated, of int4, int8, fp8")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    bw = copy_bandwidth("cuda")
    sweep_rows, lines = [], []
    head = ("| N x K | M | kernel | bytes MB | torch best | torch us | triton us | config | vs torch | "
            "vs bf16 | % roofline | rel err |")
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for n, k in shapes:
        torch.manual_seed(0)
        w = torch.randn(n, k, device="cuda") * k ** -0.5  # fp32 [N, K]
        wb = w.to(torch.bfloat16)
        g4 = 128 if k % 128 == 0 else 64  # SmolLM2's K = 576 takes g64
        q4, s4, z4 = quantize_int4_groupwise(w, g4)
        p4 = pack_int4(q4)
        q8, s8 = quantize_int8_per_channel(w)
        s8 = s8.to(torch.bfloat16)
        f8, sf = quantize_fp8(w, "row")
        sf = sf.reshape(-1)
        lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(wb)
        tiny = search_space.get("int4_wo", group_size=g4).build(lin)
        w_deq4 = dequantize_int4_groupwise(q4, s4, z4).double()
        kinds = {  # kind -> (tensors for _launch, group, dequantized weight fp64, bytes)
            "int4": ((p4, s4, z4), g4, w_deq4, n * k / 2 + 4 * n * k / g4),
            "int8": ((q8, s8), 0, q8.double() * s8.double()[:, None], n * k + 2 * n),
            "fp8": ((f8, sf), 0, f8.double() * sf.double()[:, None], n * k + 4 * n),
        }
        deq8 = torch.compile(lambda x: F.linear(x, q8.to(x.dtype)) * s8, dynamic=False)
        for m in [int(t) for t in args.tokens.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                t_bf16 = time_cuda(lambda: F.linear(x, wb))[0]
                torch_alts = {
                    "int4": {"tinygemm": lambda: tiny(x)},
                    "int8": {"dequant eager": lambda: F.linear(x, q8.to(x.dtype)) * s8,
                             "dequant compiled": lambda: deq8(x),
                             "_weight_int8pack_mm": lambda: torch._weight_int8pack_mm(x, q8, s8)},
                    "fp8": {"dequant eager": lambda: F.linear(x, f8.to(x.dtype)) * sf.to(x.dtype)},
                }
                for kind, (tensors, g, wd, nbytes) in kinds.items():
                    if kind not in args.kinds.split(","):
                        continue
                    alts = {}
                    for name, fn in torch_alts[kind].items():
                        try:
                            alts[name] = time_cuda(fn)[0]
                        except Exception as e:  # noqa: BLE001 - e.g. a kernel missing on this build
                            print(f"{kind} {name} at {n}x{k} M={m}: {type(e).__name__}: {e}", flush=True)
                    if m == int(args.tokens.split(",")[0]):
                        configs = [c for c in (tg.INT4_CONFIGS if kind == "int4" else tg.CONFIGS)
                                   if tg._fits(c, k, g)]
                    else:
                        done = sorted((r for r in sweep_rows if r["kind"] == kind and r["n"] == n
                                       and r["k"] == k and r["m"] == 1), key=lambda r: r["us"])
                        # the six best at M=1 and each variant's best (the mma kernel's time
                        # hardly grows with M, so it can win here while losing at M=1)
                        best_of = {r["cfg"].variant: r["cfg"] for r in reversed(done)}
                        configs = list(dict.fromkeys([r["cfg"] for r in done[:6]] + list(best_of.values())))
                    best = (float("inf"), None)
                    for cfg in configs:
                        fn = lambda: tg._finish(tg._launch(kind, x, tensors, n, k, cfg, g), x.dtype)  # noqa: E731
                        try:
                            us = time_cuda(fn)[0]
                        except Exception as e:  # noqa: BLE001
                            print(f"{kind} {cfg} failed: {type(e).__name__}: {e}", flush=True)
                            continue
                        sweep_rows.append(dict(kind=kind, n=n, k=k, m=m, cfg=cfg, us=us))
                        best = min(best, (us, cfg), key=lambda t: t[0])
                    us, cfg = best
                    y = tg._finish(tg._launch(kind, x, tensors, n, k, cfg, g), x.dtype).double()
                    ref = x.double() @ wd.t()
                    err = ((y - ref).norm() / ref.norm()).item()
                    alt_name, alt_us = min(alts.items(), key=lambda t: t[1]) if alts else ("-", float("nan"))
                    mb = (nbytes + 2 * m * (k + n)) / 1e6
                    roof = 100 * mb * 1e6 / bw / (us * 1e-6)
                    c = f"{cfg.block_n}/{cfg.block_k}/{cfg.split_k}/{cfg.num_warps}" + (f"/{cfg.variant}" if cfg.variant else "")
                    lines.append(f"| {n}x{k} | {m} | {kind} | {mb:.1f} | {alt_name} | {alt_us:.1f} | {us:.1f} | "
                                 f"{c} | {alt_us / us:.2f}x | {t_bf16 / us:.2f}x | {roof:.0f}% | {err:.1e} |")
                    print(lines[-1], f"(bf16 {t_bf16:.1f} us; torch: "
                          + ", ".join(f"{a} {t:.1f}" for a, t in alts.items()) + ")", flush=True)
        lin = tiny = kinds = w = wb = q4 = s4 = z4 = p4 = q8 = f8 = deq8 = None  # free the layer before the next
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        (out / "gemv_bench.md").write_text(
            f"# Triton weight-only GEMV vs torch on {torch.cuda.get_device_name()} (torch {torch.__version__})\n\n"
            f"command: python {' '.join(sys.argv)}; copy bandwidth {bw / 1e12:.2f} TB/s; config = "
            "BLOCK_N/BLOCK_K/SPLIT_K/warps; int4 = g128 (g64 where K = 576)\n\n" + "\n".join(lines) + "\n")
        with open(out / "gemv_sweep.csv", "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["kind", "n", "k", "m", "block_n", "block_k", "split_k", "num_warps", "num_stages", "variant",
                         "us"])
            for r in sweep_rows:
                c = r["cfg"]
                wr.writerow([r["kind"], r["n"], r["k"], r["m"], c.block_n, c.block_k, c.split_k, c.num_warps,
                         c.num_stages, c.variant, f"{r['us']:.2f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
