"""What the in-process GEMV tuners see: every launch config's tuning time on every shape and M.

    source benchmarks/device_env.sh; python3 benchmarks/tuner_table.py --out $OUT [--kinds int8,fp8,cuda]
        [--tokens 1,8] [--groups 128,64,32]

For each kind (the Triton int8 / fp8 per-channel GEMVs and int4 GEMV, kernels/triton_gemv.py, and
the CUDA int4 GEMV, kernels/cuda_int4.py) on the weight shapes of llama8 (its five, plus the
fused q/k/v and gate/up) and SmolLM2-135M, at each M: every config the library's tuner would try,
timed exactly as the tuner times it (evaluators/timing.tuning_us: 20 runs, L2 flushed by a read,
no graph). Writes tuner_table.csv (kind, group, n, k, m, config, us) and tuner_table.md: per cell
the tuner's winner, and the smallest config list (greedy cover) that keeps every cell within 2%
and 5% of its best: the data for pruning the lists the tuners time during a search.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

from autoao.evaluators.timing import tuning_us
from autoao.kernels import cuda_int4 as ci
from autoao.kernels import triton_gemv as tg
from autoao.kernels.quant import pack_int4, quantize_fp8, quantize_int4_groupwise, quantize_int8_per_channel

SHAPES = [(4096, 4096), (1024, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336), (128256, 4096),
          (576, 576), (192, 576), (960, 576), (1536, 576), (3072, 576), (576, 1536), (49152, 576)]  # (N, K)


def cover(cells: dict[tuple, dict[str, float]], slack: float) -> list[str]:
    """Greedy: the fewest configs such that every cell's best among them is within `slack` of the
    cell's best overall (each step adds the config that brings the most cells within)."""
    need = {cell: min(t.values()) * (1 + slack) for cell, t in cells.items()}
    chosen: list[str] = []
    open_cells = set(cells)
    while open_cells:
        gain = {}
        for cell in open_cells:
            for cfg, us in cells[cell].items():
                if us <= need[cell]:
                    gain[cfg] = gain.get(cfg, 0) + 1
        best = max(gain, key=lambda c: gain[c])
        chosen.append(best)
        open_cells = {c for c in open_cells if cells[c].get(best, float("inf")) > need[c]}
    return chosen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="int8,fp8,cuda", help="comma-separated, of int8, fp8, int4 (Triton), cuda")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--groups", default="128,64,32", help="int4 group sizes")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds, tokens = args.kinds.split(","), [int(t) for t in args.tokens.split(",")]
    groups = [int(g) for g in args.groups.split(",")]
    rows: list[dict] = []
    t0 = time.perf_counter()
    for n, k in SHAPES:
        torch.manual_seed(0)
        w = torch.randn(n, k, device="cuda") * k ** -0.5  # fp32 [N, K]
        for kind in kinds:
            for g in (groups if kind in ("int4", "cuda") else [0]):
                if g and k % g:
                    continue
                if kind == "int8":
                    q, s = quantize_int8_per_channel(w)
                    tensors = (q, s.to(torch.bfloat16))
                elif kind == "fp8":
                    q, s = quantize_fp8(w, "row")
                    tensors = (q, s.reshape(-1))
                else:
                    q, s, z = quantize_int4_groupwise(w, g)
                    if kind == "cuda":
                        if ci.unsupported(n, k, g):
                            continue
                        tensors = ci.pack_mma(q, s, z, g)
                    else:
                        tensors = (pack_int4(q), s, z)
                for m in tokens:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    if kind == "cuda":
                        configs = ci.tuner_configs(k, g)
                        run = lambda c: lambda: ci._launch(x, *tensors, g, c)  # noqa: E731
                    else:
                        configs = tg._candidates(kind, k, g, m)
                        run = lambda c: lambda: tg._finish(tg._launch(kind, x, tensors, n, k, c, g), x.dtype)  # noqa: E731
                    for cfg in configs:
                        try:
                            us = tuning_us(run(cfg))
                        except Exception as e:  # noqa: BLE001 - as the tuner: a config that fails is skipped
                            print(f"{kind} g{g} {n}x{k} M={m} {cfg}: {type(e).__name__}", flush=True)
                            continue
                        rows.append(dict(kind=kind, group=g, n=n, k=k, m=m, config=repr(cfg), us=us))
        print(f"[{time.perf_counter() - t0:.0f} s] {n}x{k} done", flush=True)
        w = None
        torch.cuda.empty_cache()
        with open(out / "tuner_table.csv", "w", newline="") as f:  # after every shape: a timeout keeps them
            wr = csv.DictWriter(f, fieldnames=["kind", "group", "n", "k", "m", "config", "us"])
            wr.writeheader()
            wr.writerows(rows)
    lines = [f"# GEMV tuners: every config on every cell ({torch.cuda.get_device_name()}, torch {torch.__version__})",
             "", f"command: python {' '.join(sys.argv)}; {time.perf_counter() - t0:.0f} s", ""]
    for kind in kinds:
        for g in sorted({r["group"] for r in rows if r["kind"] == kind}):
            cells: dict[tuple, dict[str, float]] = {}
            for r in rows:
                if r["kind"] == kind and r["group"] == g:
                    cells.setdefault((r["n"], r["k"], r["m"]), {})[r["config"]] = r["us"]
            if not cells:
                continue
            n_cfg = len({c for t in cells.values() for c in t})
            lines += [f"## {kind}" + (f" g{g}" if g else ""), "", f"{len(cells)} cells, {n_cfg} configs", "",
                      "| N x K | M | best us | best config |", "|---|---|---|---|"]
            for (n, k, m), t in sorted(cells.items()):
                best = min(t, key=t.get)
                lines.append(f"| {n}x{k} | {m} | {t[best]:.2f} | `{best}` |")
            for slack in (0.02, 0.05):
                lines += ["", f"cover within {slack:.0%}: " + ", ".join(f"`{c}`" for c in cover(cells, slack))]
            lines.append("")
    (out / "tuner_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
