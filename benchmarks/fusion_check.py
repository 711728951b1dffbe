"""Sibling fusion on CUDA: fused q/k/v and gate/up give the unfused numbers, and their time.

    source benchmarks/device_env.sh; python3 benchmarks/fusion_check.py --out $OUT/fusion
        [--candidates "int8_wo;int4_wo(group_size=128)"] [--tokens 1,16,2048]

For each candidate (each of its CUDA kernels) and each Llama-3-8B sibling group (q/k/v: 4096, 1024,
1024 outputs; gate/up: 14336, 14336; K = 4096), the members are built from random weights, run
alone, then fused (kernels.FusedRows) and run again on the same input:
- eager: the fused outputs must match the unfused ones (same weights, same numbers; only a GEMM's
  reduction order may differ with N: max abs difference reported, SQNR >= 60 dB required);
- compiled (torch.compile(fullgraph=True), for --compile-candidates): fused compiled vs unfused
  eager, SQNR >= 40 dB (inductor reorders float ops);
- time: the group's forward (every member called on x, outputs returned) in a CUDA graph, L2
  flushed before each repeat, median, unfused vs fused, eager modules (what the launch count costs
  is the same under compile; the e2e benchmark times compiled models).
Writes fusion_check.csv and fusion_check.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import sys
from pathlib import Path

import torch
from torch import nn

from autoao import search_space
from autoao.evaluators.sensitivity import sqnr_db as sqnr
from autoao.evaluators.timing import build_layer, kernel_names, time_cpu, time_cuda
from autoao.kernels import FusedRows

GROUPS = {"qkv": [4096, 1024, 1024], "gate_up": [14336, 14336]}  # member N; K = 4096
K = 4096
DEFAULT = ("int8_wo;fp8_wo;int4_wo(group_size=128);int8_dyn;fp8_dyn(granularity=row);sparse24_int8_dyn;"
           "sparse24_fp8")


class Group(nn.Module):
    """Calls every member on x, in order; returns all outputs (so none is dead code)."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x):
        return tuple(m(x) for m in self.members)


def graph_time(fn, x) -> float:
    with torch.no_grad():
        if x.is_cuda:
            return time_cuda(lambda: fn(x))[0]
        return time_cpu(lambda: fn(x), reps=5)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--candidates", default=DEFAULT, help="';'-separated candidate names")
    ap.add_argument("--compile-candidates", default="int8_wo;int4_wo(group_size=128);int8_dyn",
                    help="';'-separated: also check these compiled (one compile per group, kernel and M)")
    ap.add_argument("--tokens", default="1,16,2048")
    ap.add_argument("--cpu-smoke", action="store_true", help="small groups on the CPU (checks this script)")
    args = ap.parse_args()
    groups = {"qkv": [64, 32, 32], "gate_up": [128, 128]} if args.cpu_smoke else GROUPS
    k = 128 if args.cpu_smoke else K
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    compiled_names = set(args.compile_candidates.split(";"))
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    rows = []
    header = (f"command: python {' '.join(sys.argv)}\n\ndate: "
              f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; device: "
              f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}; torch {torch.__version__}\n")
    print(header, flush=True)
    for name in args.candidates.split(";"):
        cand = search_space.get(name)
        for kern in kernel_names(cand, dev):
            for gname, ns in groups.items():
                members = [build_layer(cand, k, n, torch.bfloat16, dev, seed=i) for i, n in enumerate(ns)]
                if kern is not None:
                    for m in members:
                        m.set_kernel(kern)
                unfused = Group(members)
                xs = {m: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for m in tokens}
                with torch.no_grad():
                    ref = {m: [y.clone() for y in unfused(x)] for m, x in xs.items()}
                t_unfused = {m: graph_time(unfused, x) for m, x in xs.items()}
                FusedRows(members)
                for m, x in xs.items():
                    with torch.no_grad():
                        got = unfused(x)  # the same modules, now fused
                    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref[m]))
                    eager_db = min(sqnr(a.float(), b.float()) for a, b in zip(got, ref[m]))
                    comp = None
                    if name in compiled_names:
                        torch._dynamo.reset()
                        with torch.no_grad():
                            cy = torch.compile(unfused, fullgraph=True)(x)
                        comp = min(sqnr(a.float(), b.float()) for a, b in zip(cy, ref[m]))
                    t = graph_time(unfused, x)
                    row = {"candidate": name, "kernel": kern or "", "group": gname, "m": m,
                           "unfused_us": round(t_unfused[m], 2), "fused_us": round(t, 2),
                           "speedup": round(t_unfused[m] / t, 3), "max_abs_diff": diff, "eager_sqnr_db": round(eager_db, 1),
                           "compiled_sqnr_db": None if comp is None else round(comp, 1)}
                    rows.append(row)
                    print(row, flush=True)
                del members, unfused
                torch.cuda.empty_cache()
    with open(out / "fusion_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["# Sibling fusion on CUDA: numbers and time (benchmarks/fusion_check.py)", "", header,
             "| candidate | kernel | group | M | unfused us | fused us | speed-up | eager: max abs diff, SQNR dB | "
             "compiled SQNR dB |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['candidate']} | {r['kernel']} | {r['group']} | {r['m']} | {r['unfused_us']} | {r['fused_us']} | "
              f"{r['speedup']:.2f} | {r['max_abs_diff']:.3g}, {r['eager_sqnr_db']} | {r['compiled_sqnr_db'] if r['compiled_sqnr_db'] is not None else '-'} |"
              for r in rows]
    (out / "fusion_check.md").write_text("\n".join(lines) + "\n")
    # eager: the same weights; only a GEMM's reduction order may differ with N (>= 60 dB, most exact)
    return 0 if all(r["eager_sqnr_db"] >= 60 and (r["compiled_sqnr_db"] is None or r["compiled_sqnr_db"] >= 40)
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
