"""Every CUDA kernel of the candidates that have several, timed as the search times them.

    source benchmarks/device_env.sh; python3 benchmarks/kernel_table.py --out $OUT
        [--candidates "int4_wo(group_size=128);int4_wo(group_size=32)"] [--shapes 4096x4096,...]
        [--tokens 16,2048] [--mode compile|graph]

`autoao kernels` shows the kernel timing chose per shape; this shows all of them (LatencyTable's
kernel_timings): measure_latencies in its default CUDA mode (torch.compile, CUDA graph replay, L2
flushed by a read, median) or `--mode graph` (the eager module in a CUDA graph), with a fresh
timing cache. Writes kernel_table.md and .csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import torch

from autoao import search_space
from autoao.evaluators.cache import TimingCache
from autoao.evaluators.timing import measure_latencies

LLAMA8 = "4096x4096,1024x4096,14336x4096,4096x14336,128256x4096"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--candidates", default="int4_wo(group_size=128);int4_wo(group_size=32)",
                    help="';'-separated candidate names")
    ap.add_argument("--shapes", default=LLAMA8, help="comma-separated NxK (weight shapes)")
    ap.add_argument("--tokens", default="16,2048")
    ap.add_argument("--mode", default="compile", choices=["compile", "graph"])
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cands = [search_space.get(c) for c in args.candidates.split(";")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        table = measure_latencies(shapes, tokens, cands, device="cuda", mode=args.mode,
                                  cache=TimingCache(Path(tmp) / "t.sqlite"), progress=False)
    rows = []
    for (cand, k, n), by_kernel in table.kernel_timings.items():
        for kern, times in by_kernel.items():
            for m, t in times.items():
                rows.append(dict(candidate=cand, n=n, k=k, m=m, kernel=kern, us=t.median_us if t.ok else "",
                                 error=t.error or ""))
    with open(out / "kernel_table.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    lines = [f"# Every kernel's timing ({torch.cuda.get_device_name()}, torch {torch.__version__}, mode {table.mode})",
             "", f"command: python {' '.join(sys.argv)}; {table.seconds:.0f} s", "",
             "| candidate | N x K | M | " + " | ".join(f"{k} us" for k in kernels) + " | chosen |",
             "|---" * (len(kernels) + 4) + "|"]
    for (cand, k, n), by_kernel in table.kernel_timings.items():
        for m in tokens:
            cells = [f"{by_kernel[kern][m].median_us:.1f}" if kern in by_kernel and by_kernel[kern][m].ok else "-"
                     for kern in kernels]
            lines.append(f"| {cand} | {n}x{k} | {m} | " + " | ".join(cells) + f" | {table.kernel_for(cand, k, n)} |")
    (out / "kernel_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
