"""Calibrated int4 on real weights: layer-output SQNR of GPTQ, AWQ and HQQ against round-to-nearest.

    python benchmarks/algorithms.py --out benchmarks/results/<date>-cpu/algorithms   # ~3 min on 2 CPU cores

SmolLM2-135M (the built-in demo model; bf16, CPU). Each algorithm is fitted on the input rows the
profiler keeps from calibration text (`--fit-rows` rows per layer, sampled from --fit-seqs x 256
tokens) and measured on rows of *other* text (256 rows per layer from 2 held-out sequences): SQNR
(dB) of the quantized layer's output against the bf16 layer's. Group sizes 64 and 128 only: the
model's weights are a Q4_1 grid of group 32, on which int4 g32 is lossless (autoao.models). Layers:
every `--every`-th of the 30 blocks, all 7 linears of each. Writes results.json (per layer and
summary) and prints the summary table as markdown.

    python benchmarks/algorithms.py --uniform rtn,gptq,hqq --out ...   # ~4 min on 2 CPU cores

instead applies uniform int4 g64 with each algorithm to every layer that takes it (fitted on 256
rows per layer, as a default search profiles) and scores the model with the tier-1 proxy on 2 x 256
held-out tokens (next-token accuracy, KL against bf16): uniform.json.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import autoao
import autoao.models
from autoao import search_space
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import sqnr_db
from autoao.profile import profile

ALGORITHMS = ("rtn", "gptq", "awq", "hqq")
GROUPS = (64, 128)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/algorithms")
    ap.add_argument("--every", type=int, default=3, help="measure every n-th block (default 3: 10 of 30)")
    ap.add_argument("--fit-seqs", type=int, default=4, help="calibration sequences of 256 tokens (default 4)")
    ap.add_argument("--fit-rows", type=int, default=1024, help="input rows kept per layer to fit on (default 1024)")
    ap.add_argument("--uniform", default=None, help="comma-separated algorithms: score uniform int4 g64 plans instead")
    args = ap.parse_args()
    if args.uniform:
        return uniform(args.uniform.split(","), Path(args.out))
    t_start = time.perf_counter()
    torch.manual_seed(0)
    model, tok = autoao.models.load("smollm2-135m")
    calib = autoao.models.text_inputs(tok, seq_len=256, n_seqs=args.fit_seqs)
    held = autoao.models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True)
    fit_prof = profile(model, calib, max_sample_rows=args.fit_rows)
    held_prof = profile(model, held, max_sample_rows=256).by_fqn()
    blocks = {f"model.layers.{i}." for i in range(0, 30, args.every)}
    layers = [lay for lay in fit_prof.layers if any(lay.fqn.startswith(b) for b in blocks)]
    rows = []
    for lay in layers:
        linear = model.get_submodule(lay.fqn)
        x = held_prof[lay.fqn].stats.sample  # [256, K] held-out rows
        with torch.no_grad():
            ref = linear(x).float()
            for g in GROUPS:
                if search_space.get("int4_wo", group_size=g).supports(lay.spec, "cpu"):
                    continue  # K = 576 takes group 64, not 128: only down_proj (K = 1536) has g128
                for alg in ALGORITHMS:
                    cand = search_space.get("int4_wo", group_size=g, algorithm=alg)
                    t0 = time.perf_counter()
                    q = cand.build(linear, lay.stats, fqn=lay.fqn)
                    fit_s = time.perf_counter() - t0
                    rows.append({"layer": lay.fqn, "shape": lay.spec.shape, "group_size": g, "algorithm": alg,
                                 "sqnr_db": round(sqnr_db(ref, q(x).float()), 3), "fit_s": round(fit_s, 3)})
        print(lay.fqn, [(r["group_size"], r["algorithm"], r["sqnr_db"]) for r in rows if r["layer"] == lay.fqn],
              flush=True)

    summary = []
    for g in GROUPS:
        rtn = {r["layer"]: r["sqnr_db"] for r in rows if r["group_size"] == g and r["algorithm"] == "rtn"}
        for alg in ALGORITHMS:
            mine = {r["layer"]: r["sqnr_db"] for r in rows if r["group_size"] == g and r["algorithm"] == alg}
            gain = [mine[f] - rtn[f] for f in mine]
            summary.append({
                "group_size": g, "algorithm": alg, "layers": len(mine),
                "median_sqnr_db": round(statistics.median(mine.values()), 2),
                "worst_sqnr_db": round(min(mine.values()), 2),
                "median_gain_db": round(statistics.median(gain), 2),
                "worst_gain_db": round(min(gain), 2),
                "beats_rtn_pct": round(100 * sum(d > 0 for d in gain) / len(gain), 1),
                "fit_s_per_layer": round(statistics.mean(r["fit_s"] for r in rows
                                                         if r["group_size"] == g and r["algorithm"] == alg), 3),
            })
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "machine": platform.machine(),
            "threads": torch.get_num_threads(), "fit_seqs": args.fit_seqs, "fit_rows": args.fit_rows,
            "held_out_rows": 256, "every": args.every, "gptq_damping": "clamp(K / rows, 0.01, 1)",
            "wall_s": round(time.perf_counter() - t_start, 1)}
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "layers": rows}, indent=1) + "\n")
    print("| group | algorithm | layers | median SQNR dB | worst SQNR dB | median gain vs RTN dB | worst gain dB "
          "| beats RTN | fit s/layer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['group_size']} | {s['algorithm']} | {s['layers']} | {s['median_sqnr_db']} | {s['worst_sqnr_db']} "
              f"| {s['median_gain_db']} | {s['worst_gain_db']} | {s['beats_rtn_pct']}% | {s['fit_s_per_layer']} |")
    print(json.dumps(meta))
    return 0


def uniform(algs: list[str], out: Path) -> int:
    """Tier-1 proxy of uniform int4 g64 with each algorithm (module docstring)."""
    t_start = time.perf_counter()
    model, tok = autoao.models.load("smollm2-135m")
    calib = autoao.models.text_inputs(tok, seq_len=256, n_seqs=4)
    held = autoao.models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True)
    prof = profile(model, calib)  # 256 rows per layer: the search's default
    proxy = ProxyEvaluator(model, held)
    rows = []
    for alg in algs:
        q = copy.deepcopy(model)
        plan = autoao.Plan.uniform(q, search_space.get("int4_wo", group_size=64, algorithm=alg))
        t0 = time.perf_counter()
        autoao.apply(q, plan, calibration=prof.calibration)
        apply_s = time.perf_counter() - t0
        p = proxy(q)
        rows.append({"algorithm": alg, "layers": len(plan.layers), "proxy_acc": round(p.accuracy, 4),
                     "proxy_drop": round(p.drop, 4), "kl": round(p.metrics["kl"], 4), "apply_s": round(apply_s, 1)})
        print(rows[-1], flush=True)
        # after each plan: a run cut short keeps what it measured
        out.mkdir(parents=True, exist_ok=True)
        meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "held_out_tokens": 512,
                "fit_rows": 256, "wall_s": round(time.perf_counter() - t_start, 1)}
        (out / "uniform.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
