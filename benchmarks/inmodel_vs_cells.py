"""Do autoao's per-layer timing cells predict the layers' time inside the model? SmolLM2 on the CPU.

    python benchmarks/inmodel_vs_cells.py --out benchmarks/results/2026-12-02-cpu/inmodel-vs-cells

For the demo model (bf16 as it comes) and uniform autoao plans on the kernels timing chose, runs the
demo's workload (one 256-token prefill, then 32 one-token forwards) with a timer around every
planned layer's forward (perf_counter_ns in forward pre/post hooks; the hooks' own cost, ~2 us a
call, is in every number alike) and compares, per layer shape (N x K) and row count, the median
in-model time of one call with the timing cell the cost model reads (`measure_latencies`, a fresh
cache). The rest of the workload (attention, norms, embeddings: everything outside the planned
layers) is the hooked total minus the layers' sum, per variant: a plan that changes the rest (an
output dtype, a layout copy) shows up there, where the cost model cannot see it.

Writes inmodel.json and inmodel.md to --out.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

import autoao
import autoao.models
from autoao.evaluators.timing import device_name
from autoao.plan import Plan
from cpu_bench import demo, demo_timings, workload  # the demo and its workload, as cpu_bench.py runs them


def hooked(model: nn.Module, fqns: list[str]) -> tuple[dict, list]:
    """Forward hooks on each fqn recording (fqn, rows) -> [ns per call]; returns (record, handles)."""
    record: dict[tuple[str, int], list[int]] = defaultdict(list)
    start: dict[str, int] = {}
    handles = []
    for fqn in fqns:
        mod = model.get_submodule(fqn)

        def pre(_m, args, fqn=fqn):
            start[fqn] = time.perf_counter_ns()

        def post(_m, args, out, fqn=fqn):
            record[(fqn, args[0].numel() // args[0].shape[-1])].append(time.perf_counter_ns() - start[fqn])
        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return record, handles


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timing-seconds", type=float, default=150.0)
    ap.add_argument("--candidates", default="int8_dyn(act=tensor),int8_wo,int4_wo(group_size=64),fp32_compute")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    bf16, _, ids, shapes = demo()  # shapes: fqn -> (K, N)
    names = [c.strip() for c in args.candidates.split(",")]
    table = demo_timings(shapes, names, args.timing_seconds)
    print(f"[{time.perf_counter() - t0:.0f} s] timed {table.measured} cells", file=sys.stderr, flush=True)
    variants = {"bf16": bf16}
    for name in names:
        plan = Plan.uniform(bf16, name)
        plan.kernels = {f: k for f in plan.layers if (k := table.kernel_for(name, *shapes[f])) is not None}
        variants[name] = autoao.apply(copy.deepcopy(bf16), plan)
    fqns = list(shapes)
    for m in variants.values():
        workload(m, ids)  # warm-up
    per_call: dict[str, dict] = {v: defaultdict(list) for v in variants}  # v -> (shape, rows) -> [us]
    totals: dict[str, list[float]] = {v: [] for v in variants}
    plain: dict[str, list[float]] = {v: [] for v in variants}
    layer_sum: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v, m in variants.items():
            w = time.perf_counter()
            workload(m, ids)
            plain[v].append((time.perf_counter() - w) * 1e3)
            record, handles = hooked(m, fqns)
            w = time.perf_counter()
            workload(m, ids)
            totals[v].append((time.perf_counter() - w) * 1e3)
            for h in handles:
                h.remove()
            layer_sum[v].append(sum(sum(ns) for ns in record.values()) / 1e6)
            for (fqn, rows), ns in record.items():
                k, n = shapes[fqn]
                per_call[v][(f"{n}x{k}", rows)].extend(x / 1e3 for x in ns)
        print(f"[{time.perf_counter() - t0:.0f} s] round {r + 1}: " +
              ", ".join(f"{v} {plain[v][-1]:.0f} ms" for v in variants), file=sys.stderr, flush=True)
    rows = []
    for v in variants:
        cand = "bf16" if v == "bf16" else v
        for (shape, m_rows), us in sorted(per_call[v].items()):
            n, k = map(int, shape.split("x"))
            cell = table.get(cand, m_rows, k, n)
            rows.append({"variant": v, "shape": shape, "rows": m_rows, "calls_per_round": len(us) // args.rounds,
                         "inmodel_median_us": statistics.median(us), "cell_median_us": cell.median_us,
                         "kernel": table.kernel_for(cand, k, n)})
    summary = []
    for v in variants:
        pred = sum(r["calls_per_round"] * r["cell_median_us"] for r in rows if r["variant"] == v) / 1e3
        inm = sum(r["calls_per_round"] * r["inmodel_median_us"] for r in rows if r["variant"] == v) / 1e3
        summary.append({"variant": v, "workload_ms": statistics.median(plain[v]), "hooked_ms": statistics.median(totals[v]),
                        "layers_inmodel_ms": statistics.median(layer_sum[v]), "layers_cells_ms": pred,
                        "layers_inmodel_median_sum_ms": inm,
                        "rest_ms": statistics.median(totals[v]) - statistics.median(layer_sum[v]),
                        "speedup_vs_bf16": statistics.median(plain["bf16"]) / statistics.median(plain[v]),
                        "rounds_ms": plain[v], "paired_vs_bf16": [b / x for b, x in zip(plain["bf16"], plain[v])]})
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "cpu": device_name(torch.device("cpu")), "threads": torch.get_num_threads(),
           "load_average": os.getloadavg(), "torch": torch.__version__, "rounds": args.rounds,
           "summary": summary, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inmodel.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Layer cells vs in-model layer time, SmolLM2-135M on the CPU ({res['date']})", "",
             f"- command: `{res['command']}`", f"- CPU: {res['cpu']}; torch {res['torch']}; {res['threads']} threads; "
             f"load average after {tuple(round(x, 2) for x in res['load_average'])}; {args.rounds} rounds", "",
             "| variant | workload ms | vs bf16 | layers in model ms | layers by cells ms | rest ms |",
             "|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['variant']} | {s['workload_ms']:.0f} | {s['speedup_vs_bf16']:.2f}x | "
                     f"{s['layers_inmodel_ms']:.0f} | {s['layers_cells_ms']:.0f} | {s['rest_ms']:.0f} |")
    lines += ["", "Per round (workload ms, without hooks): " + "; ".join(
        f"{s['variant']} " + ", ".join(f"{x:.0f}" for x in s["rounds_ms"]) for s in summary)]
    lines += ["", "| variant | shape | rows | calls | in model us | cell us | in/cell | kernel |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['shape']} | {r['rows']} | {r['calls_per_round']} | {r['inmodel_median_us']:.0f} | "
                     f"{r['cell_median_us']:.0f} | {r['inmodel_median_us'] / r['cell_median_us']:.2f} | {r['kernel'] or ''} |")
    (args.out / "inmodel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
