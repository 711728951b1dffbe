"""Calibrated quantization on real weights, end to end: uniform int4 per algorithm on SmolLM2-135M
(lm-eval and the tier-1 proxy), and MiniLM's layer SQNR and task score per algorithm.

    D=benchmarks/results/<date>-cpu/algorithms-accuracy    # wall times: 2-core CPU, shared, 1 thread
    python benchmarks/algorithms_accuracy.py --part smollm2 --groups 64 --algorithms rtn,gptq --out $D   # 395 s
    python benchmarks/algorithms_accuracy.py --part smollm2 --groups 64 --algorithms awq,hqq --out $D    # 436 s
    python benchmarks/algorithms_accuracy.py --part smollm2 --groups 128 --out $D                        # 352 s
    python benchmarks/algorithms_accuracy.py --part smollm2 --groups 64 --algorithms gptq,awq --calibration prefill --out $D
    python benchmarks/algorithms_accuracy.py --part minilm-layers --out $D                               # 55 s
    python benchmarks/algorithms_accuracy.py --part minilm-uniform --out $D                              # 229 s
    python benchmarks/algorithms_accuracy.py --part awq-why --out $D                                     # 56 s
    python benchmarks/algorithms_accuracy.py --part calibration-rows --out $D                            # 17 s
    python benchmarks/algorithms_accuracy.py --part tables --out $D                                      # tables.md

`smollm2`: bf16, then uniform int4_wo(group_size=g, algorithm=a) for each group and algorithm
(rtn, gptq, awq, hqq) on every layer the group takes (the others stay bf16), each fitted on the
calibration a default `autoao search` profiles: one 256-token prefill of the bundled calibration
text and 32 one-token decode steps, 256 rows kept per layer. Scored with lm-eval (`--tasks`,
default autoao_facts and autoao_text) and the tier-1 proxy (top-1 agreement with bf16, KL against
bf16 and next-token accuracy, on 2 x 256 held-out tokens); for a multiple-choice task also the
share of questions each plan answers as bf16 does. The int4 modules run their `dequant`
kernel (dequantize, then one bf16 matmul) above 16 rows: the route a search times for large row
counts on this CPU; the numbers are the same canonical weights either way. smollm2_g<groups>_<algorithms>.json (rows
written after each plan).

`--calibration prefill` fits on the 256-token prefill alone instead: the 32 one-token steps each
run at position 0, so the default profile holds 33 first-position rows, whose large activations
dominate some layers' input sample (file suffix _prefill).

`minilm-layers`: every linear layer of all-MiniLM-L6-v2 (fp32), each algorithm fitted on the rows
the profiler keeps from the search's example batch (32 calibration sentences, 256 rows) and
measured on 512 rows of the 4 x 32 held-out sentences: SQNR (dB) of the layer's output through the
module's float32 reference against the fp32 layer's, for int4 g32/g64/g128 (rtn, gptq, awq, hqq)
and int8_dyn (rtn, smoothquant). minilm_layers.json: per layer, and per family/group/algorithm the
median and worst SQNR, the gain over RTN and the share of layers above RTN.

`minilm-uniform`: fp32, then uniform int4 per group and algorithm (fitted as above): autoao_pairs
and the mean cosine of the embeddings to fp32's, through the float32 reference paths (the CPU int4
kernels take bf16 activations; the reference computes the same weights in fp32). minilm_uniform.json.

`awq-why`: where AWQ lands on RTN and why, at each group size (default 64), on SmolLM2 (every third
block, fitted on the default search's profile, measured on 256 held-out rows) and MiniLM (every
layer, as minilm-layers): per layer the output error of every grid point alpha on the fit rows and
on the held-out rows, for AWQ's base mean|x| and for max|x|; the alpha the fit picks and its
held-out gain over RTN (alpha = 0); and RTN's weight error against the step^2 / 12 a weight off any
grid has, for W and for W * s at alpha 0.05, 0.1, 0.25, 0.5 (SmolLM2's weights are a 4-bit grid of group
32: re-quantizing them is easier than that, until a scale moves them off it).
awq_why.json.

`calibration-rows`: for each SmolLM2 layer, the share of the sample's sum x^2 that its 33 largest
rows hold, in the default search's profile and in the prefill's alone. calibration_rows.json.

`tables`: the markdown tables of every part's json found in --out (tables.md); for SmolLM2 the
questions on which a plan and RTN at its group size disagree about matching bf16's answer.

Every part runs on `--threads` intra-op threads (default 1: on a shared 2-core machine two threads
wait for each other).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import autoao
import autoao.models
from autoao import search_space
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import sqnr_db
from autoao.kernels import algorithms
from autoao.kernels._base import QuantizedLinear
from autoao.kernels.quant import dequantize_int4_groupwise, quantize_int4_groupwise
from autoao.profile import profile

ALGORITHMS = ("rtn", "gptq", "awq", "hqq")
PARTS = ("smollm2", "minilm-layers", "minilm-uniform", "awq-why", "calibration-rows", "tables")
LARGE_M_ROUTE = "tinygemm_cpu<=16,dequant"  # int4 on the CPU: GEMV kernel for decode, dequant + bf16 matmul above


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", required=True, choices=PARTS)
    ap.add_argument("--out", required=True, help="folder for the part's json")
    ap.add_argument("--groups", default=None, help="comma-separated int4 group sizes (smollm2: 64,128; "
                                                   "minilm: 32,64,128)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated (default %(default)s)")
    ap.add_argument("--tasks", default="autoao_facts,autoao_text", help="lm-eval tasks for smollm2")
    ap.add_argument("--limit", type=int, default=None, help="lm-eval documents per task (default all)")
    ap.add_argument("--calibration", default="search", choices=("search", "prefill"),
                    help="smollm2: fit on what a default search profiles (the prefill and 32 one-token steps), "
                         "or on the 256-token prefill alone (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default %(default)s)")
    args = ap.parse_args()
    algs = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algs if a not in ALGORITHMS]
    if unknown or not algs:
        ap.error(f"--algorithms: each must be one of {', '.join(ALGORITHMS)}, got {args.algorithms!r}")
    default_groups = {"smollm2": "64,128", "awq-why": "64"}.get(args.part, "32,64,128")
    try:
        groups = [int(g) for g in (args.groups or default_groups).split(",")]
    except ValueError:
        ap.error(f"--groups: comma-separated integers, got {args.groups!r}")
    if args.part in ("smollm2", "awq-why") and 32 in groups:
        ap.error("--groups: smollm2's weights are a Q4_1 grid of group 32 (int4 g32 is lossless on it); use 64,128")
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python " + " ".join(sys.argv), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "threads": args.threads}
    if args.part == "smollm2":
        smollm2(groups, algs, args.tasks, args.limit, args.calibration, out, meta)
    elif args.part == "minilm-layers":
        minilm_layers(groups, algs, out, meta)
    elif args.part == "minilm-uniform":
        minilm_uniform(groups, algs, out, meta)
    elif args.part == "awq-why":
        awq_why(groups, out, meta)
    elif args.part == "calibration-rows":
        calibration_rows(out, meta)
    else:
        tables(out)
    return 0


def write(path: Path, meta: dict[str, Any], t_start: float, **parts: Any) -> None:
    """The part's json, rewritten as it grows (a run cut short keeps what it measured)."""
    meta = {**meta, "wall_s": round(time.perf_counter() - t_start, 1)}
    path.write_text(json.dumps({"meta": meta, **parts}, indent=1) + "\n")


##### SmolLM2: uniform int4 per algorithm, lm-eval and the proxy #################################

def default_search_profile(model: torch.nn.Module, tok: Any):
    """The profile `autoao search` takes of the demo model with its defaults: a 256-token prefill
    of the calibration text, then 32 one-token decode steps (autoao/cli.py), 256 rows per layer."""
    prefill = autoao.models.text_inputs(tok, seq_len=256, n_seqs=1)[0]  # [1, 256]
    return profile(model, [prefill] + [prefill[:, i:i + 1] for i in range(32)])


def smollm2(groups: list[int], algs: list[str], tasks: str, limit: int | None, calibration: str, out: Path,
            meta: dict[str, Any]) -> None:
    t_start = time.perf_counter()
    model, tok = autoao.models.load("smollm2-135m")
    prefill = autoao.models.text_inputs(tok, seq_len=256, n_seqs=1)[0]  # [1, 256]
    prof = default_search_profile(model, tok) if calibration == "search" else profile(model, [prefill])
    proxy = ProxyEvaluator(model, autoao.models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True))
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    meta = {**meta, "model": "smollm2-135m (bf16)", "tasks": names, "limit": limit,
            "calibration": calibration, "fit_rows_per_layer": max(len(p.stats.sample) for p in prof.layers),
            "proxy_tokens": 512, "int4_route": LARGE_M_ROUTE}
    # one file per (groups, algorithms) asked for: a part split over several runs keeps each
    suffix = "" if calibration == "search" else f"_{calibration}"
    path = out / f"smollm2_g{'-'.join(map(str, groups))}_{'-'.join(algs)}{suffix}.json"
    rows: list[dict[str, Any]] = []
    answers: dict[str, list[int]] = {}  # multiple-choice task -> bf16's choice per question
    picks: dict[str, dict[str, list[int]]] = {}  # plan -> multiple-choice task -> its choice per question

    def score(label: str, q: torch.nn.Module, **extra: Any) -> None:
        p = proxy(q)
        metrics, chosen, seconds = lmeval_per_question(q, tok, names, limit)
        row = {"plan": label, **extra, "proxy_top1_agreement": round(p.metrics["agreement"], 4),
               "proxy_kl": round(p.metrics["kl"], 4), "proxy_next_token": round(p.metrics["next_token"], 4),
               "lmeval_s": round(seconds, 1)}
        for t in names:
            m = metrics[t]
            if "acc" in m:
                row[f"{t}_acc"], row[f"{t}_acc_stderr"] = m["acc"], m.get("acc_stderr")
            if "word_perplexity" in m:
                row[f"{t}_word_ppl"] = m["word_perplexity"]
            if t in chosen:  # the share of questions answered as bf16 answers them
                ref = answers.setdefault(t, chosen[t])
                row[f"{t}_same_answer_as_bf16"] = round(sum(a == b for a, b in zip(chosen[t], ref)) / len(ref), 4)
                picks.setdefault(label, {})[t] = chosen[t]
        rows.append(row)
        print(row, flush=True)
        write(path, meta, t_start, rows=rows, answers=picks)

    score("bf16", model, group_size=None, algorithm=None, layers=0)
    for g in groups:
        for alg in algs:
            q = copy.deepcopy(model)
            cand = search_space.get("int4_wo", group_size=g, algorithm=alg)
            plan = autoao.Plan.uniform(q, cand)
            plan.kernels.update({fqn: LARGE_M_ROUTE for fqn in plan.layers})
            t0 = time.perf_counter()
            autoao.apply(q, plan, calibration=prof.calibration)
            label = cand.name if calibration == "search" else f"{cand.name} [fit on the prefill alone]"
            score(label, q, group_size=g, algorithm=alg, calibration=calibration, layers=len(plan.layers),
                  apply_s=round(time.perf_counter() - t0, 1))
            del q


def lmeval_per_question(model: torch.nn.Module, tok: Any, names: list[str], limit: int | None
                        ) -> tuple[dict[str, dict[str, float]], dict[str, list[int]], float]:
    """The run autoao.evaluators.lmeval.evaluate makes (its bundled tasks, model wrapper, offline
    environment), with lm-eval's per-document log kept: (task -> metrics, multiple-choice task ->
    the choice picked per document in document order, seconds). Two plans' picks compared question
    by question say how close they answer, which the accuracies' difference (372 questions: a
    standard error of 2.5 points) cannot."""
    import tempfile

    import lm_eval
    from lm_eval.tasks import TaskManager

    from autoao.evaluators import lmeval

    start = time.perf_counter()
    with lmeval._offline_env(), tempfile.TemporaryDirectory(prefix="autoao-lmeval-") as tmp:
        manager = TaskManager(include_path=str(lmeval._write_bundled_tasks(Path(tmp))), include_defaults=False)
        lm = lmeval._wrap(model, tok, batch_size=8, device=None, max_length=None)
        out = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=limit, log_samples=True,
                                      bootstrap_iters=1000, random_seed=None, numpy_random_seed=None,
                                      torch_random_seed=None)
    metrics = {t: lmeval._metrics(out["results"][t]) for t in names}
    chosen = {}
    for t in names:
        docs = sorted(out["samples"][t], key=lambda d: d["doc_id"])
        if docs and "acc" in docs[0]:  # multiple choice: filtered_resps = [(loglikelihood, greedy), ...]
            chosen[t] = [max(range(len(d["filtered_resps"])), key=lambda i: float(d["filtered_resps"][i][0]))
                         for d in docs]
    return metrics, chosen, time.perf_counter() - start


##### MiniLM: layer SQNR and the task per algorithm ##############################################

def minilm_profiles():
    """(model, tokenizer, workload, calibration profile: the search's example batch with 256 rows per
    layer, held-out profile: 512 rows per layer of the 4 x 32 held-out sentences)."""
    model, tok = autoao.models.load("minilm-l6")
    work = autoao.models.workload("minilm-l6", tok)
    fit = profile(model, work["example_inputs"])
    held = profile(model, work["eval_inputs"], max_sample_rows=512)
    return model, tok, work, fit, held


def minilm_candidates(groups: list[int], algs: list[str]) -> list[tuple[str, int | None, str]]:
    """(family, group size or None, algorithm) for every candidate measured."""
    int4 = [("int4_wo", g, a) for g in groups for a in algs]
    return int4 + [("int8_dyn", None, a) for a in ("rtn", "smoothquant")]


def minilm_layers(groups: list[int], algs: list[str], out: Path, meta: dict[str, Any]) -> None:
    t_start = time.perf_counter()
    model, _, _, fit, held = minilm_profiles()
    held_by = held.by_fqn()
    cands = minilm_candidates(groups, algs)
    meta = {**meta, "model": "minilm-l6 (fp32)", "fit_rows": max(len(p.stats.sample) for p in fit.layers),
            "held_out_rows": max(len(p.stats.sample) for p in held.layers),
            "path": "each module's float32 reference"}
    rows: list[dict[str, Any]] = []
    for lay in fit.layers:
        linear = model.get_submodule(lay.fqn)
        x = held_by[lay.fqn].stats.sample.float()  # [512, K] held-out rows
        with torch.no_grad():
            ref = linear(x)
            for family, g, alg in cands:
                cand = search_space.get(family, **({"group_size": g} if g else {}), algorithm=alg)
                if cand.supports(lay.spec, "cpu"):
                    continue
                t0 = time.perf_counter()
                module = cand.build(linear, lay.stats, fqn=lay.fqn)
                fit_s = time.perf_counter() - t0
                assert isinstance(module, QuantizedLinear)
                rows.append({"layer": lay.fqn, "shape": lay.spec.shape, "family": family, "group_size": g,
                             "algorithm": alg, "sqnr_db": round(sqnr_db(ref, module.reference(x)), 3),
                             "fit_s": round(fit_s, 3)})
        print(lay.fqn, [(r["family"], r["group_size"], r["algorithm"], r["sqnr_db"])
                        for r in rows if r["layer"] == lay.fqn], flush=True)
        write(out / "minilm_layers.json", meta, t_start, summary=summarize(rows), layers=rows)
    summary = summarize(rows)
    write(out / "minilm_layers.json", meta, t_start, summary=summary, layers=rows)
    print(markdown_summary(summary))


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, group size, algorithm): median / worst SQNR, and against RTN on the same layers
    the median / worst gain and the share of layers where the algorithm is above RTN."""
    out = []
    keys = list(dict.fromkeys((r["family"], r["group_size"], r["algorithm"]) for r in rows))
    for family, g, alg in keys:
        mine = {r["layer"]: r["sqnr_db"] for r in rows if (r["family"], r["group_size"], r["algorithm"]) == (family, g, alg)}
        rtn = {r["layer"]: r["sqnr_db"] for r in rows if (r["family"], r["group_size"], r["algorithm"]) == (family, g, "rtn")}
        gain = [mine[f] - rtn[f] for f in mine if f in rtn]
        out.append({"family": family, "group_size": g, "algorithm": alg, "layers": len(mine),
                    "median_sqnr_db": round(statistics.median(mine.values()), 2),
                    "worst_sqnr_db": round(min(mine.values()), 2),
                    "median_gain_db": round(statistics.median(gain), 2) if gain else None,
                    "worst_gain_db": round(min(gain), 2) if gain else None,
                    "above_rtn_pct": round(100 * sum(d > 0 for d in gain) / len(gain), 1) if gain else None,
                    "fit_s_per_layer": round(statistics.mean(r["fit_s"] for r in rows if (
                        r["family"], r["group_size"], r["algorithm"]) == (family, g, alg)), 3)})
    return out


def markdown_summary(summary: list[dict[str, Any]]) -> str:
    lines = ["| candidate | group | algorithm | layers | median SQNR dB | worst SQNR dB | median gain vs RTN dB "
             "| worst gain dB | above RTN | fit s/layer |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        rtn = s["algorithm"] == "rtn"
        lines.append(f"| {s['family']} | {s['group_size'] or ''} | {s['algorithm']} | {s['layers']} "
                     f"| {s['median_sqnr_db']} | {s['worst_sqnr_db']} | {'' if rtn else s['median_gain_db']} "
                     f"| {'' if rtn else s['worst_gain_db']} | {'' if rtn else str(s['above_rtn_pct']) + '%'} "
                     f"| {s['fit_s_per_layer']} |")
    return "\n".join(lines)


def reference_paths(model: torch.nn.Module) -> None:
    """Every quantized module computes through its float32 reference (same weights, no kernel)."""
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.forward = m.reference  # type: ignore[method-assign]


def minilm_uniform(groups: list[int], algs: list[str], out: Path, meta: dict[str, Any]) -> None:
    t_start = time.perf_counter()
    model, _, work, fit, _ = minilm_profiles()
    task = work["accuracy"]
    meta = {**meta, "model": "minilm-l6 (fp32)", "task": "autoao_pairs",
            "fit_rows": max(len(p.stats.sample) for p in fit.layers), "path": "each module's float32 reference"}
    t0 = time.perf_counter()
    base = task(model)
    rows = [{"plan": "fp32", **task.last_metrics, "eval_s": round(time.perf_counter() - t0, 1)}]
    print(rows[-1], flush=True)
    for g in groups:
        for alg in algs:
            cand = search_space.get("int4_wo", group_size=g, algorithm=alg)
            q = copy.deepcopy(model)
            plan = autoao.Plan.uniform(q, cand)
            t0 = time.perf_counter()
            autoao.apply(q, plan, calibration=fit.calibration)
            apply_s = time.perf_counter() - t0
            reference_paths(q)
            t0 = time.perf_counter()
            value = task(q)
            rows.append({"plan": cand.name, "group_size": g, "algorithm": alg, "layers": len(plan.layers),
                         **task.last_metrics, "drop_points": round(100 * (base - value), 2),
                         "apply_s": round(apply_s, 1), "eval_s": round(time.perf_counter() - t0, 1)})
            print(rows[-1], flush=True)
            write(out / "minilm_uniform.json", meta, t_start, rows=rows)
            del q
    write(out / "minilm_uniform.json", meta, t_start, rows=rows)


##### AWQ: why it ties or loses ###############################################################

def awq_curve(w: torch.Tensor, group: int, base: torch.Tensor, fit_x: torch.Tensor, held_x: torch.Tensor
              ) -> tuple[list[float], list[float]]:
    """Output error sum ((x / s) @ RTN(W s)^T - x @ W^T)^2 on the fit rows and on the held-out rows
    for s = base^alpha, alpha on AWQ's grid, normalized and rounded as algorithms.awq_scale does."""
    w = w.float()  # [N, K]
    fit_ref, held_ref = fit_x @ w.t(), held_x @ w.t()  # [S, N]
    base = base.float().clamp(min=1e-6)
    fit_err, held_err = [], []
    for i in range(algorithms.AWQ_GRID):
        sc = base.pow(i / algorithms.AWQ_GRID)
        sc = algorithms.round_scale(sc / (sc.max() * sc.min()).sqrt())
        dq = dequantize_int4_groupwise(*quantize_int4_groupwise(w * sc, group))  # [N, K]
        fit_err.append(float(((fit_x / sc) @ dq.t() - fit_ref).pow(2).sum()))
        held_err.append(float(((held_x / sc) @ dq.t() - held_ref).pow(2).sum()))
    return fit_err, held_err


def grid_ratio(w: torch.Tensor, group: int) -> float:
    """RTN's weight MSE over the mean step^2 / 12 of its groups: about 1 for weights off any grid,
    below 1 where the weights already sit near a coarser grid's points."""
    q, scales, zeros = quantize_int4_groupwise(w.float(), group)
    mse = float((dequantize_int4_groupwise(q, scales, zeros) - w.float()).pow(2).mean())
    return mse / float(scales.float().pow(2).mean() / 12)


GRID_ALPHAS = (0.05, 0.1, 0.25, 0.5)  # where awq-why measures RTN's weight error on W * s


def awq_why(groups: list[int], out: Path, meta: dict[str, Any]) -> None:
    t_start = time.perf_counter()
    torch.set_num_threads(1)
    sm, tok = autoao.models.load("smollm2-135m")
    sm_fit = default_search_profile(sm, tok)
    sm_held = profile(sm, autoao.models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True)).by_fqn()
    blocks = tuple(f"model.layers.{i}." for i in range(0, 30, 3))
    mini, _, _, mini_fit, mini_held = minilm_profiles()
    cases = [("smollm2-135m", sm, [p for p in sm_fit.layers if p.fqn.startswith(blocks)], sm_held),
             ("minilm-l6", mini, mini_fit.layers, mini_held.by_fqn())]
    rows: list[dict[str, Any]] = []
    for model_name, model, layers, held in cases:
        for lay in layers:
            w = model.get_submodule(lay.fqn).weight.detach()
            fit_x, held_x = lay.stats.sample.float(), held[lay.fqn].stats.sample.float()
            for g in groups:
                if lay.spec.in_features % g:
                    continue
                row: dict[str, Any] = {"model": model_name, "layer": lay.fqn, "group_size": g,
                                       "grid_ratio": round(grid_ratio(w, g), 3)}
                for alpha in GRID_ALPHAS:  # the weight AWQ quantizes at alpha: W * s, s = mean|x|^alpha
                    sc = lay.stats.act_mean.float().clamp(min=1e-6).pow(alpha)
                    sc = algorithms.round_scale(sc / (sc.max() * sc.min()).sqrt())
                    row[f"grid_ratio_alpha_{alpha}"] = round(grid_ratio(w.float() * sc, g), 3)
                for base_name, base in (("mean", lay.stats.act_mean), ("absmax", lay.stats.act_absmax)):
                    fit_err, held_err = awq_curve(w, g, base, fit_x, held_x)
                    pick = min(range(len(fit_err)), key=fit_err.__getitem__)
                    best = min(range(len(held_err)), key=held_err.__getitem__)
                    row[base_name] = {"alpha": pick / algorithms.AWQ_GRID,
                                      "fit_gain_db": round(10 * math.log10(fit_err[0] / fit_err[pick]), 3),
                                      "held_gain_db": round(10 * math.log10(held_err[0] / held_err[pick]), 3),
                                      "held_best_alpha": best / algorithms.AWQ_GRID,
                                      "held_best_gain_db": round(10 * math.log10(held_err[0] / held_err[best]), 3)}
                rows.append(row)
        print(model_name, "done", flush=True)
    summary = []
    for model_name, _, _, _ in cases:
        for g in groups:
            mine = [r for r in rows if r["model"] == model_name and r["group_size"] == g]
            if not mine:
                continue
            s: dict[str, Any] = {"model": model_name, "group_size": g, "layers": len(mine),
                                 "median_grid_ratio": round(statistics.median(r["grid_ratio"] for r in mine), 3),
                                 **{f"median_grid_ratio_alpha_{a}": round(
                                     statistics.median(r[f"grid_ratio_alpha_{a}"] for r in mine), 3)
                                    for a in GRID_ALPHAS}}
            for b in ("mean", "absmax"):
                s[b] = {"alpha_0_picked_pct": round(100 * sum(r[b]["alpha"] == 0 for r in mine) / len(mine), 1),
                        "held_above_rtn_pct": round(100 * sum(r[b]["held_gain_db"] > 0 for r in mine) / len(mine), 1),
                        "held_below_rtn_pct": round(100 * sum(r[b]["held_gain_db"] < 0 for r in mine) / len(mine), 1),
                        "median_held_gain_db": round(statistics.median(r[b]["held_gain_db"] for r in mine), 2),
                        "held_oracle_above_rtn_pct": round(
                            100 * sum(r[b]["held_best_gain_db"] > 0 for r in mine) / len(mine), 1)}
            summary.append(s)
            print(json.dumps(s), flush=True)
    write(out / "awq_why.json", {**meta, "awq_grid": algorithms.AWQ_GRID}, t_start, summary=summary, layers=rows)


def calibration_rows(out: Path, meta: dict[str, Any]) -> None:
    t_start = time.perf_counter()
    model, tok = autoao.models.load("smollm2-135m")
    prefill = autoao.models.text_inputs(tok, seq_len=256, n_seqs=1)[0]  # [1, 256]
    profs = {"search": default_search_profile(model, tok).by_fqn(), "prefill": profile(model, [prefill]).by_fqn()}
    rows = []
    for fqn in profs["search"]:
        row: dict[str, Any] = {"layer": fqn}
        for name, prof in profs.items():
            energy = prof[fqn].stats.sample.float().pow(2).sum(1)  # [S]: each row's sum x^2
            row[f"top33_share_{name}"] = round(float(energy.sort(descending=True).values[:33].sum() / energy.sum()), 3)
        rows.append(row)
    top = sorted(rows, key=lambda r: -r["top33_share_search"])[:10]
    for r in top:
        print(r)
    write(out / "calibration_rows.json", meta, t_start, layers=rows)


##### tables ##################################################################################

def smollm2_table(files: list[Path]) -> list[str]:
    """One markdown row per plan of the smollm2 runs (bf16 once), then per group the test of the
    acceptance rule: is the best algorithm (lowest KL) closer to bf16 than RTN on every task?"""
    rows, picks = [], {}
    for f in files:
        d = json.loads(f.read_text())
        picks.update(d.get("answers", {}))
        rows += [r for r in d["rows"] if r["plan"] != "bf16" or not any(x["plan"] == "bf16" for x in rows)]
    rows.sort(key=lambda r: (r["group_size"] or 0, ALGORITHMS.index(r["algorithm"]) if r["algorithm"] else -1,
                             r.get("calibration") == "prefill"))
    base = next(r for r in rows if r["plan"] == "bf16")
    bf16 = picks.get("bf16", {}).get("autoao_facts")
    lines = ["| plan | layers | facts acc | same answer as bf16 | vs RTN: questions won / lost | text word ppl "
             "| proxy top-1 agreement | proxy KL | next-token acc | fit+apply s | lm-eval s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rtn = next((x for x in rows if x["group_size"] == r["group_size"] and x["algorithm"] == "rtn"), None)
        paired = ""
        mine, theirs = picks.get(r["plan"], {}).get("autoao_facts"), picks.get(rtn["plan"] if rtn else "", {}).get(
            "autoao_facts")
        if bf16 and mine and theirs and r["algorithm"] not in (None, "rtn"):
            won = sum(a == b != c for a, b, c in zip(mine, bf16, theirs))
            lost = sum(c == b != a for a, b, c in zip(mine, bf16, theirs))
            paired = f"{won} / {lost}"
        lines.append(f"| {r['plan']} | {r['layers'] or 'none'} | {r['autoao_facts_acc']:.4f} ± {r['autoao_facts_acc_stderr']:.4f} "
                     f"| {r['autoao_facts_same_answer_as_bf16']:.4f} | {paired} | {r['autoao_text_word_ppl']:.2f} "
                     f"| {r['proxy_top1_agreement']:.4f} | {r['proxy_kl']:.4f} | {r['proxy_next_token']:.4f} "
                     f"| {r.get('apply_s', '')} | {r['lmeval_s']} |")
    lines.append("")
    for g in sorted({r["group_size"] for r in rows if r["group_size"]}):
        rtn = next((r for r in rows if r["group_size"] == g and r["algorithm"] == "rtn"), None)
        for calib in ("search", "prefill"):
            mine = [r for r in rows if r["group_size"] == g and r["algorithm"] != "rtn"
                    and r.get("calibration", "search") == calib]
            if rtn is None or not mine:
                continue
            best = min(mine, key=lambda r: r["proxy_kl"])
            checks = {
                "facts acc": abs(best["autoao_facts_acc"] - base["autoao_facts_acc"])
                < abs(rtn["autoao_facts_acc"] - base["autoao_facts_acc"]),
                "facts answers": best["autoao_facts_same_answer_as_bf16"] > rtn["autoao_facts_same_answer_as_bf16"],
                "text ppl": abs(best["autoao_text_word_ppl"] - base["autoao_text_word_ppl"])
                < abs(rtn["autoao_text_word_ppl"] - base["autoao_text_word_ppl"]),
                "proxy KL": best["proxy_kl"] < rtn["proxy_kl"],
            }
            lines.append(f"- group {g}, fitted on {'the default search profile' if calib == 'search' else 'the prefill alone'}:"
                         f" best algorithm by proxy KL {best['algorithm']}; closer to bf16 than RTN on "
                         + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in checks.items()))
    return lines


def tables(out: Path) -> None:
    lines = []
    sm = sorted(out.glob("smollm2_g*.json"))
    if sm:
        lines += ["## SmolLM2-135M, uniform int4 per algorithm", "", *smollm2_table(sm), ""]
    if (out / "minilm_layers.json").is_file():
        d = json.loads((out / "minilm_layers.json").read_text())
        lines += ["## MiniLM layer-output SQNR (held-out rows)", "", markdown_summary(d["summary"]), ""]
    if (out / "minilm_uniform.json").is_file():
        d = json.loads((out / "minilm_uniform.json").read_text())
        lines += ["## MiniLM uniform int4 per algorithm", "",
                  "| plan | autoao_pairs | drop (points) | pairing | retrieval | cosine to fp32 embeddings | fit+apply s |",
                  "|---|---|---|---|---|---|---|"]
        for r in d["rows"]:
            lines.append(f"| {r['plan']} | {r['accuracy']:.4f} | {r.get('drop_points', 0)} | {r['pairing']:.3f} "
                         f"| {r['retrieval']:.3f} | {r['cosine_to_reference']:.4f} | {r.get('apply_s', '')} |")
        lines.append("")
    if (out / "awq_why.json").is_file():
        d = json.loads((out / "awq_why.json").read_text())
        lines += ["## AWQ against RTN, per layer (fit rows -> held-out rows)", "",
                  "| model | group | layers | RTN weight MSE / (step^2/12): W, W*s at alpha 0.05 / 0.1 / 0.25 / 0.5 "
                  "| base | fit picks alpha 0 | held-out above RTN | below RTN | median held-out gain dB "
                  "| best alpha on held-out itself above RTN |", "|---|---|---|---|---|---|---|---|---|---|"]
        for s in d["summary"]:
            ratios = " / ".join(str(s[f"median_grid_ratio_alpha_{a}"]) for a in GRID_ALPHAS)
            for b in ("mean", "absmax"):
                x = s[b]
                lines.append(f"| {s['model']} | {s['group_size']} | {s['layers']} | {s['median_grid_ratio']}, {ratios} "
                             f"| {'mean' if b == 'mean' else 'max'} abs(x) | {x['alpha_0_picked_pct']}% | {x['held_above_rtn_pct']}% "
                             f"| {x['held_below_rtn_pct']}% | {x['median_held_gain_db']} | {x['held_oracle_above_rtn_pct']}% |")
        lines.append("")
    (out / "tables.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
