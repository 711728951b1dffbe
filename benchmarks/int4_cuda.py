"""autoao's CUDA int4 GEMV (kernels/cuda_int4.py) on the GPU: build time, correctness of every
launch config, and its in-model cost against the Triton int4 GEMV, tinygemm and bf16.

    source benchmarks/device_env.sh; python3 benchmarks/int4_cuda.py --out $OUT [--shapes 0,1,2,3,4]
        [--groups 128,64,32] [--tokens 1,8]

Timing as benchmarks/int4_sweep.py does: each (shape, kernel) runs as a *chain* of L distinct layers
of that shape (>= 256 MB of int4 weights, so none stays in the 50 MB L2) in one CUDA graph, L2
flushed by a read before each repeat; the time per layer is the chain's median / L. The Triton row
is the library's tuned choice (int4_gemv_triton: its tuner picks per shape, as in the model).
Correctness: every config's output on layer 0 against the fp64 product with the dequantized
weight, at M = 1, 3 and 8, and once more through a captured CUDA graph. Every launch config
(rows/warps/chunks/split, cuda_int4.Config) is timed at the first M, the tuner's pick at each.
Writes int4_cuda.md and int4_cuda.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from autoao.evaluators.timing import time_cuda
from autoao.kernels import cuda_int4 as ci
from autoao.kernels import triton_gemv as tg
from autoao.kernels.int4 import tinygemm_layout
from autoao.kernels.quant import dequantize_int4_groupwise, pack_int4

sys.path.insert(0, str(Path(__file__).parent))
from bandwidth import copy_bandwidth  # noqa: E402
from int4_sweep import chain_weights  # noqa: E402  (the chains int4_sweep.py times)

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]  # llama8, fused siblings


def fmt(c: ci.Config) -> str:
    return f"{c.rows}/{c.warps}/{c.chunks}/s{c.split}" + (f"/b{c.min_blocks}" if c.min_blocks > 1 else "")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="0,1,2,3,4", help=f"indices into {SHAPES}")
    ap.add_argument("--groups", default="128,64,32")
    ap.add_argument("--tokens", default="1,8", help="M values to time")
    ap.add_argument("--tuned-only", action="store_true", help="time only the tuner's config (not every config)")
    ap.add_argument("--splits", default="1,2,4,8", help="split-K values of the configs timed one by one")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups = [int(g) for g in args.groups.split(",")]
    tokens = [int(m) for m in args.tokens.split(",")]
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    lines = [f"# autoao CUDA int4 GEMV, {torch.cuda.get_device_name()}", "",
             f"command: python {' '.join(sys.argv)}; torch {torch.__version__}, triton "
             f"{__import__('triton').__version__}; date {time.strftime('%Y-%m-%d')}", ""]

    t0 = time.perf_counter()
    for g in groups:  # the first call builds every group size (parallel nvcc); the others load them
        ci.library(g)
    lines.append(f"build (nvcc, {len(ci.GROUP_SIZES)} group sizes in parallel, cold cache): "
                 f"{time.perf_counter() - t0:.1f} s")
    print(lines[-1], flush=True)
    bw = copy_bandwidth("cuda")
    lines.append(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []

    def flush_md():
        (out / "int4_cuda.md").write_text("\n".join(lines) + "\n")
        with open(out / "int4_cuda.csv", "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=["group", "n", "k", "m", "kernel", "us_per_layer", "roofline", "err"])
            wr.writeheader()
            wr.writerows(rows)

    for g in groups:
        for n, k in shapes:
            if ci.unsupported(n, k, g):
                continue
            nbytes = n * k / 2 + 4 * n * k / g
            torch.manual_seed(0)
            canon, tiny, mma = [], [], []
            for i, (w, q, s, z) in enumerate(chain_weights(n, k, g)):
                canon.append((pack_int4(q), s, z))
                tiny.append(tinygemm_layout(*canon[-1]))
                mma.append(ci.pack_mma(q, s, z, g))
                if i == 0:
                    wd = dequantize_int4_groupwise(q, s, z).double()
                del w, q
            layers = len(canon)
            # correctness of every config, and through a CUDA graph
            worst = {}
            for m in (1, 3, 8):
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ wd.t()
                for cfg in ci.CONFIGS:
                    nan = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")  # all written?
                    worst[cfg] = max(worst.get(cfg, 0.0), rel_err(ci._launch(x, *mma[0], g, cfg, out=nan), ref))
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    yg = ci.int4_gemv_cuda(x, *mma[0], g)
                graph.replay()
                worst["graph"] = max(worst.get("graph", 0.0), rel_err(yg, ref))
                worst["triton"] = max(worst.get("triton", 0.0), rel_err(tg.int4_gemv_triton(x, *canon[0], g), ref))
            del wd
            bad = {str(c): e for c, e in worst.items() if e > 5e-3}
            head = (f"\n## g{g} {n}x{k} ({nbytes / 1e6:.1f} MB int4; chain of {layers} layers)\n\n"
                    f"max rel err over M=1,3,8: cuda configs {max(e for c, e in worst.items() if c not in ('graph', 'triton')):.1e}, "
                    f"graph {worst['graph']:.1e}, triton {worst['triton']:.1e}; over 5e-3: {bad or 'none'}\n")
            lines.append(head)
            print(head, flush=True)
            for m in tokens:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                roof = (nbytes + 2 * m * (k + n)) / bw * 1e6
                res = {}
                res["tinygemm"] = time_cuda(lambda: [torch._weight_int4pack_mm(x, p, g, sz) for p, sz in tiny])[0]
                res["triton (tuned)"] = time_cuda(lambda: [tg.int4_gemv_triton(x, *c, g) for c in canon])[0]
                tc = tg._tune("int4", x, canon[0], n, k, g)  # the config it ran (cached by the call above)
                print(f"g{g} {n}x{k} M={m}: triton tuned {tc}", flush=True)
                # every config the tuner would time, at the first M only
                for cfg in ci.tuner_configs(k, g) if m == tokens[0] and not args.tuned_only else ():
                    if str(cfg.split) in args.splits.split(","):
                        res[f"cuda {fmt(cfg)}"] = time_cuda(
                            lambda cfg=cfg: [ci._launch(x, qw, sz, g, cfg) for qw, sz in mma])[0]
                tuned = fmt(ci._tune(x, *mma[0], g))
                # every config above runs with the process's launch options (ci.OPTIONS, from the
                # AUTOAO_CUDA_* environment); the tuned one also with programmatic dependent launch
                # on and off (each layer may start in the last's tail)
                for pdl in (True, False):
                    with ci.launch_options(pdl=pdl):
                        res[f"cuda (tuned: {tuned}){'' if pdl else ' PDL off'}"] = time_cuda(
                            lambda: [ci.int4_gemv_cuda_impl(x, qw, sz, g) for qw, sz in mma])[0]
                # each layer prefetching the next one's first prefetch_mb MB into L2, as in a model; with
                # and without the early weight loads (graphs only: time_cuda captures one)
                for early in (True, False):
                    with ci.launch_options(early=early) as opts:
                        res[f"cuda (tuned: {tuned}) +next {opts.prefetch_mb:g} MB{'' if early else ', early off'}"] = \
                            time_cuda(lambda: [ci.int4_gemv_cuda_impl(x, qw, sz, g, *mma[(i + 1) % layers])
                                               for i, (qw, sz) in enumerate(mma)])[0]
                lines.append(f"M={m}: roofline {roof:.1f} us/layer\n")
                lines.append("| kernel | us per layer | % roofline | vs tinygemm | vs triton |")
                lines.append("|---|---|---|---|---|")
                for name, us in sorted(res.items(), key=lambda kv: kv[1]):
                    per = us / layers
                    lines.append(f"| {name} | {per:.1f} | {100 * roof / per:.0f}% | {res['tinygemm'] / us:.2f}x "
                                 f"| {res['triton (tuned)'] / us:.2f}x |")
                    rows.append(dict(group=g, n=n, k=k, m=m, kernel=name, us_per_layer=f"{per:.2f}",
                                     roofline=f"{roof / per:.3f}", err=""))
                print("\n".join(lines[-len(res) - 3:]), flush=True)
                flush_md()
            if g == groups[0] and n == shapes[0][0]:
                bf16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(min(layers, 8))]
                x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
                us = time_cuda(lambda: [F.linear(x, w) for w in bf16])[0] / len(bf16)
                lines.append(f"(bf16 F.linear on this shape, M=1, chain of {len(bf16)}: {us:.1f} us/layer)")
                del bf16
            canon = tiny = mma = None
            torch.cuda.empty_cache()
            flush_md()
    return 0


if __name__ == "__main__":
    sys.exit(main())
