"""Wide launch-config sweep of the Triton int4 GEMVs at M=1, timed the way a model runs them.

    source benchmarks/device_env.sh; python3 benchmarks/int4_sweep.py --out $OUT [--shapes 0,1,2,3,4]

Why: gemv_bench.py times one kernel alone in a graph (its ~8 us graph-replay floor hides what a
kernel costs inside a model: ~5 us) and sweeps only the library's short config list. Here each
(shape, config) is timed as a *chain*: L different layers of that shape (distinct weights, together
>= 256 MB, so none stays in the 50 MB L2) run back to back in one CUDA graph, L2 flushed before each
repeat; the time per layer is the chain's median / L. The tinygemm (`_weight_int4pack_mm`) and
bf16 `F.linear` chains of the same layers are the references. Shapes are llama8's M=1 GEMVs with
sibling fusion (q/k/v 6144x4096, o 4096x4096, gate/up 28672x4096, down 4096x14336, lm_head
128256x4096), g128.

Configs: the library's INT4_CONFIGS plus a grid of the tensor-core kernel ("mma") over BLOCK_N x
warps, BLOCK_K, num_stages (its weight tile is software-pipelined through shared memory with
cp.async; more stages = more bytes in flight per SM) and SPLIT_K. (Session 4's second and third
runs swept `--grid dq`, a kernel since removed: benchmarks/NOTES.md.) All configs are compiled first by
a pool of processes (Triton's disk cache), then timed one at a time. Each config's output on layer 0
is checked against the fp64 product with the dequantized weight. Writes int4_sweep.csv (every
config) and int4_sweep.md (per shape: references and the 12 fastest).
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from autoao.evaluators.timing import time_cuda
from autoao.kernels import triton_gemv as tg
from autoao.kernels.int4 import tinygemm_layout
from autoao.kernels.quant import dequantize_int4_groupwise, pack_int4, quantize_int4_groupwise

sys.path.insert(0, str(Path(__file__).parent))
from bandwidth import copy_bandwidth  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]  # (N, K)
CHAIN_BYTES = 256e6  # int4 bytes per chain (>= 5x the H200's 50 MB L2)
MAX_LAYERS = 32


def chain_weights(n: int, k: int, group: int):
    """The layers of one chain (enough distinct N x K layers for >= CHAIN_BYTES of int4 weights, at
    most MAX_LAYERS), drawn from the current RNG one at a time: yields (w fp32, q, scales, zeros) with
    q, scales, zeros autoao's group-wise int4 of w."""
    nbytes = n * k / 2 + 4 * n * k / group  # int4 weights + bf16 scales and zeros
    for _ in range(max(1, min(MAX_LAYERS, math.ceil(CHAIN_BYTES / nbytes)))):
        w = torch.randn(n, k, device="cuda") * k ** -0.5
        yield (w, *quantize_int4_groupwise(w, group))


def mma_grid(k: int, group: int) -> list[tg.Config]:
    """Tensor-core kernel configs: (BLOCK_N, warps) x BLOCK_K x stages x SPLIT_K, keeping shared
    memory per program (stages x (weights BN*BK/2 + x 16*BK*2 bytes)) under ~180 KB."""
    out = []
    for bn, w in [(16, 1), (32, 1), (32, 2), (64, 4), (128, 4), (128, 8), (256, 4), (256, 8)]:
        for bk in (128, 256, 512):
            for stages in (2, 3, 4, 6):
                if stages * (bn * bk // 2 + 32 * bk) > 180_000:
                    continue
                for sk in (1, 2, 4, 8):
                    cfg = tg.Config(bn, bk, sk, w, "mma", stages)
                    if tg._fits(cfg, k, group):
                        out.append(cfg)
    return out


def configs_for(k: int, group: int) -> list[tg.Config]:
    lib = [c for c in tg.INT4_CONFIGS if tg._fits(c, k, group)]
    return list(dict.fromkeys(lib + mma_grid(k, group)))


def _compile(job: tuple[list[tg.Config], int, int]) -> int:
    """Worker: run each config once on a small layer of the same specialisation (Triton compiles on
    first launch and caches to disk); returns how many failed."""
    cfgs, k, group = job
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    n = 512
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    s = torch.rand(n, k // group, device="cuda", dtype=torch.bfloat16)
    failed = 0
    for cfg in cfgs:
        try:
            tg._finish(tg._launch("int4", x, (q, s, s), n, k, cfg, group), x.dtype)
        except Exception:  # noqa: BLE001 - e.g. out of shared memory: skipped when timed too
            failed += 1
    torch.cuda.synchronize()
    return failed


def precompile(ks: list[int], group: int, procs: int) -> None:
    # one compile per config: the JIT's cache key does not hold K's value (every K here is a
    # multiple of 16), so each config runs on the largest K it fits
    fit: dict[tg.Config, int] = {}
    for k in sorted(ks, reverse=True):
        for cfg in configs_for(k, group):
            fit.setdefault(cfg, k)
    jobs = [([c for c, kk in fit.items() if kk == k][i::procs], k, group) for k in ks for i in range(procs)]
    t0 = time.time()
    with mp.get_context("spawn").Pool(procs) as pool:
        failed = sum(pool.map(_compile, jobs))
    print(f"compiled {sum(len(j[0]) for j in jobs)} (config, K) pairs in {time.time() - t0:.0f} s "
          f"with {procs} processes; {failed} failed", flush=True)


def fmt(c: tg.Config) -> str:
    return f"{c.variant or 'byte'} {c.block_n}/{c.block_k}/sk{c.split_k}/w{c.num_warps}/st{c.num_stages}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="0,1,2,3,4", help=f"indices into {SHAPES}")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--procs", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    g = args.group
    precompile(sorted({k for _, k in shapes}), g, args.procs)
    bw = copy_bandwidth("cuda")
    rows, lines = [], []
    for n, k in shapes:
        nbytes = n * k / 2 + 4 * n * k / g  # int4 weights + bf16 scales and zeros
        torch.manual_seed(0)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        canon, tiny, bf16 = [], [], []
        for i, (w, q, s, z) in enumerate(chain_weights(n, k, g)):
            canon.append((pack_int4(q), s, z))
            tiny.append(tinygemm_layout(*canon[-1]))
            bf16.append(w.to(torch.bfloat16))
            if i == 0:
                ref = x.double() @ dequantize_int4_groupwise(q, s, z).double().t()
            del w, q
        layers = len(canon)
        refs = {
            "bf16 F.linear": time_cuda(lambda: [F.linear(x, w) for w in bf16])[0] / layers,
            "tinygemm": time_cuda(lambda: [torch._weight_int4pack_mm(x, p, g, sz) for p, sz in tiny])[0] / layers,
        }
        bf16 = None  # free the bf16 weights before the sweep
        roof = (nbytes + 2 * (k + n)) / bw * 1e6  # us at the copy bandwidth
        results = []
        for cfg in configs_for(k, g):
            def chain(cfg=cfg):
                return [tg._finish(tg._launch("int4", x, t, n, k, cfg, g), x.dtype) for t in canon]
            try:
                y = chain()[0].double()
                err = ((y - ref).norm() / ref.norm()).item()
                us = time_cuda(chain)[0] / layers
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                print(f"{n}x{k} {fmt(cfg)}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            results.append((us, cfg, err))
            rows.append(dict(n=n, k=k, layers=layers, cfg=cfg, us=us, err=err))
        results.sort(key=lambda r: r[0])
        first = len(lines)  # this shape's block starts here
        lines.append(f"\n## {n}x{k} (int4 g{g}: {nbytes / 1e6:.1f} MB; chain of {layers} layers; roofline "
                     f"{roof:.1f} us)\n")
        lines.append(" / ".join(f"{name} {us:.1f} us" for name, us in refs.items()) + "\n")
        lines.append("| config | us per layer | vs tinygemm | % roofline | rel err |")
        lines.append("|---|---|---|---|---|")
        for us, cfg, err in results[:12]:
            lines.append(f"| {fmt(cfg)} | {us:.1f} | {refs['tinygemm'] / us:.2f}x | {100 * roof / us:.0f}% "
                         f"| {err:.1e} |")
        best_of = {}
        for us, cfg, err in results:
            best_of.setdefault(cfg.variant or "byte", (us, cfg))
        lines.append("\nbest per kernel: "
                     + "; ".join(f"{v} {us:.1f} us ({fmt(c)})" for v, (us, c) in best_of.items()))
        bad = [fmt(c) for _, c, e in results if e > 1e-2]
        lines.append(f"\nconfigs with rel err > 1e-2: {bad or 'none'}")
        print("\n".join(lines[first:]), flush=True)
        canon = tiny = None
        torch.cuda.empty_cache()
        (out / "int4_sweep.md").write_text(
            f"# int4 GEMV launch-config sweep, M=1, chained layers, {torch.cuda.get_device_name()}\n\n"
            f"command: python {' '.join(sys.argv)}; torch {torch.__version__}, triton "
            f"{__import__('triton').__version__}; copy bandwidth {bw / 1e12:.2f} TB/s; config = kernel "
            "BLOCK_N/BLOCK_K/SPLIT_K/warps/stages; date " + time.strftime("%Y-%m-%d") + "\n" + "\n".join(lines) + "\n")
        with open(out / "int4_sweep.csv", "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["n", "k", "layers", "variant", "block_n", "block_k", "split_k", "num_warps", "num_stages",
                         "us_per_layer", "rel_err"])
            for r in rows:
                c = r["cfg"]
                wr.writerow([r["n"], r["k"], r["layers"], c.variant or "byte", c.block_n, c.block_k, c.split_k,
                             c.num_warps, c.num_stages, f"{r['us']:.2f}", f"{r['err']:.1e}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
