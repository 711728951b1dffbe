"""The accuracy-aware rows on a GPU: autoao's searched plan against the best uniform plan on the
two real built-in models, and the search's wall time with the calibrated algorithms on vs off.

    source benchmarks/device_env.sh
    python3 benchmarks/h200_rows.py stack --out $OUT/stack [--trials 40]
    python3 benchmarks/h200_rows.py real --model smollm2-135m --out $OUT/smollm2 [--budgets 0.01]
        [--algorithms off,on] [--search-budget 150s]
    python benchmarks/h200_rows.py real --model minilm-l6 --smoke --out /tmp/rows   # CPU check, minutes

`stack`: autoao.optimize on the 8-layer Llama-3-8B-shaped stack (llama_stack.py, random weights) at
M = 1, once with the default candidates and once with the calibrated variants added, the same
number of trials each, each with an empty autoao cache (timing cells and layer errors measured
afresh, calibrated algorithms fitted afresh); a pure speed search (max_accuracy_drop=1, as e2e.py's searched row), since
on random weights no accuracy is meaningful. Records wall time, stage times, algorithm fit seconds
and the plan's composition.

`real`: the model's own workload as `autoao search --model NAME` builds it (the encoder's bundled
batch; a causal LM's 256-token prefill + 32 one-token steps), its own task (minilm-l6: autoao_pairs;
smollm2-135m: lm-eval autoao_facts, all documents), the demo's provenance rule (SmolLM2's int4 g32
left out). Every uniform plan's accuracy; the speed-up of those within the largest budget, measured
interleaved with the unchanged model (compiled on CUDA, as optimize measures); then for each
budget x algorithms setting, autoao.optimize's plan: its speed-up (optimize's own interleaved
final comparison), its accuracy on the whole task, composition, trials and wall time, and
searched / best-uniform. rows.json and rows.md are rewritten after every row, so a timeout keeps
what finished.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "lib"))  # the helper modules: benchmarks/lib/
import llama_stack  # noqa: E402

import autoao  # noqa: E402
import autoao.models as models  # noqa: E402
from autoao import search_space  # noqa: E402
from autoao.profile import profile  # noqa: E402
from autoao.stages.measure import forward_timing  # noqa: E402

DEMO_TASK = "autoao_facts"


def calibrated(groups: list[int]) -> list[str]:
    """The calibrated variants added when algorithms are on: int4 GPTQ / AWQ / HQQ at each group
    size, and SmoothQuant for int8_dyn."""
    return [f"int4_wo(group_size={g}, algorithm={a})" for g in groups for a in ("gptq", "awq", "hqq")] + [
        "int8_dyn(algorithm=smoothquant)"]


def environment(device: torch.device) -> dict[str, Any]:
    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "absent"

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "python": sys.version.split()[0], "command": " ".join(sys.argv),
            **{p: version(p) for p in ("triton", "transformers", "optuna", "lm_eval", "gguf")}}


def search_record(res: autoao.api.OptimizeResult, wall_s: float) -> dict[str, Any]:
    """What a searched row reports, from optimize's result (summary.json's fields)."""
    s = res.summary
    return {"plan": res.plan.summary() or {"unchanged": 0}, "trials": s.trials, "wall_s": wall_s,
            "summary_seconds": s.seconds, "stage_seconds": s.stage_seconds,
            "algorithm_seconds": getattr(s, "algorithm_seconds", None),
            "speedup_measured": s.speedup.measured, "speedup_predicted": s.speedup.predicted,
            "speedup_range": s.speedup_range, "rounds": s.rounds,
            "tier2_accuracy": s.accuracy.accuracy if s.accuracy else None,
            "tier2_drop": s.accuracy.drop if s.accuracy else None,
            "tier2_source": s.accuracy.source if s.accuracy else None,
            "decisions": s.notes}


def keep_small(out_dir: Path) -> None:
    """Drop what must not be committed from an optimize out_dir: the saved model, the study, the report."""
    for f in ("model", "study.db", "report.html"):
        p = out_dir / f
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


class Rows:
    """rows.json (everything) and rows.md (the table), rewritten after each row."""

    def __init__(self, out: Path, env: dict[str, Any], header: str) -> None:
        self.out, self.data, self.header = out, {"environment": env, "uniform": [], "searched": []}, header

    def add(self, kind: str, row: dict[str, Any]) -> None:
        self.data[kind].append(row)
        print(json.dumps(row, default=str)[:1500], flush=True)
        self.write()

    def write(self) -> None:
        (self.out / "rows.json").write_text(json.dumps(self.data, indent=2, default=str))
        lines = [self.header, "", "| plan | accuracy | drop (points) | speed-up (range) | eval s |", "|---|---|---|---|---|"]
        for r in self.data["uniform"]:
            sp = f"{r['speedup']:.3f}x ({r['speedup_lo']:.3f}-{r['speedup_hi']:.3f})" if r.get("speedup") else "not timed"
            lines.append(f"| {r['plan']} | {r['accuracy']:.4f} | {r['drop_points']:+.2f} | {sp} | {r['eval_s']:.1f} |")
        lines += ["", "| budget (points) | algorithms | searched plan | accuracy (drop) | speed-up (range) | trials | "
                  "wall s | best uniform within budget | searched / best uniform |", "|---|---|---|---|---|---|---|---|---|"]
        for r in self.data["searched"]:
            comp = ", ".join(f"{k} x{v}" for k, v in r["plan"].items())
            lo, hi = r["speedup_range"] or (r["speedup_measured"], r["speedup_measured"])
            best = r.get("best_uniform")
            best_s = f"{best['plan']} {best['speedup']:.3f}x" if best else "none"
            ratio = f"{r['vs_best_uniform']:.3f}" if best else "n/a"
            lines.append(f"| {100 * r['budget']:g} | {r['algorithms']} | {comp} | {r['accuracy']:.4f} "
                         f"({r['drop_points']:+.2f}) | {r['speedup_measured']:.3f}x ({lo:.3f}-{hi:.3f}) | "
                         f"{r['trials']} | {r['wall_s']:.0f} | {best_s} | {ratio} |")
        (self.out / "rows.md").write_text("\n".join(lines) + "\n")


##### stack ###################################################################################

def stack(args: argparse.Namespace) -> None:
    device = torch.device("cpu" if args.smoke else "cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = llama_stack.LlamaShape.tiny() if args.smoke else llama_stack.LlamaShape()
    base = llama_stack.build(shape, device=device).requires_grad_(False)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randint(0, shape.vocab, (1, 1), device=device, generator=gen)
    held = [torch.randint(0, shape.vocab, (1, 256), device=device, generator=gen)]
    default = [c.name for c in search_space.all_candidates()]
    result: dict[str, Any] = {"environment": environment(device), "trials_budget": args.trials,
                              "calibrated": calibrated(args.groups), "runs": []}
    # "on" first, each run with an empty autoao cache of its own: neither reuses the other's timing
    # cells or layer errors (what stays warm is torch's and Triton's compile caches, which favour
    # the second run)
    for algorithms, cands in (("on", default + calibrated(args.groups)), ("off", None)):
        work = Path(tempfile.gettempdir()) / "autoao_rows" / f"stack-{algorithms}"
        shutil.rmtree(work, ignore_errors=True)
        os.environ["AUTOAO_CACHE_DIR"] = str(work.parent / f"cache-{algorithms}")
        shutil.rmtree(os.environ["AUTOAO_CACHE_DIR"], ignore_errors=True)
        model = copy.deepcopy(base)
        t0 = time.perf_counter()
        res = autoao.optimize(model, x, budget=args.trials, eval_inputs=held, max_accuracy_drop=1.0,
                              candidates=cands, out_dir=work, progress=False)
        row = {"algorithms": algorithms, **search_record(res, time.perf_counter() - t0)}
        keep_small(work)
        for name in ("summary", "context"):
            shutil.copy(work / f"{name}.json", out / f"stack_{algorithms}_{name}.json")
        result["runs"].append(row)
        print(json.dumps(row, default=str)[:2000], flush=True)
        (out / "stack.json").write_text(json.dumps(result, indent=2, default=str))
        del model, res
        gc.collect()
        torch.cuda.empty_cache()
    print(f"wrote {out / 'stack.json'}")


##### real models #############################################################################

def load(name: str, device: torch.device, limit: int | None = None
         ) -> tuple[nn.Module, Any, list[Any], Any, Callable[[nn.Module], float], Any]:
    """(model, tokenizer, examples, eval_inputs, full-task accuracy(model), optimize's accuracy arg),
    as `autoao search --model NAME` builds them; `limit`: lm-eval documents for the table's accuracy
    (None: all)."""
    model, tok = models.load(name, device=device)
    if models.MODELS[name].kind == "encoder":
        work = models.encoder_inputs(name, tok, device=device)
        task = work["accuracy"]
        return model, tok, [work["example_inputs"]], work["eval_inputs"], task, task
    from autoao.evaluators import lmeval

    prefill = models.text_inputs(tok, seq_len=256, n_seqs=1)[0].to(device)
    examples = [prefill] + [prefill[:, i:i + 1] for i in range(32)]
    held = [t.to(device) for t in models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True)]
    def full(m: nn.Module) -> float:  # the task on `limit` documents (all: None), one number
        return float(lmeval.evaluate(m, tok, [DEMO_TASK], limit=limit).metrics[DEMO_TASK]["acc"])

    return model, tok, examples, held, full, DEMO_TASK


def interleaved_speedup(base: nn.Module, plan_model: nn.Module, examples: list[Any], rounds: int,
                        compile: bool) -> dict[str, float]:
    """Baseline / plan workload time, measured A, B, A, B, ... after one dropped baseline run (the
    same order optimize's final comparison uses); the range is over the rounds' ratios."""
    forward_timing(base, examples, compile=compile, reps=5)
    ratios, b_us, p_us = [], [], []
    for _ in range(rounds):
        b = forward_timing(base, examples, compile=compile, reps=5)[0]
        p = forward_timing(plan_model, examples, compile=compile, reps=5)[0]
        ratios.append(b / p)
        b_us.append(b)
        p_us.append(p)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return {"speedup": med(b_us) / med(p_us), "speedup_lo": min(ratios), "speedup_hi": max(ratios),
            "baseline_ms": med(b_us) / 1e3, "plan_ms": med(p_us) / 1e3, "rounds": rounds}


def real(args: argparse.Namespace) -> None:
    device = torch.device("cpu" if args.smoke else "cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    model, tok, examples, held, task, accuracy_arg = load(args.model, device, 24 if args.smoke else None)
    model.requires_grad_(False)
    if args.smoke:  # CPU check of the whole path: one decode step, a few documents' worth of time
        examples = examples[:2]
    unrep = models.unrepresentative(args.model)
    default = [c.name for c in search_space.all_candidates() if c.name not in unrep]
    cal = calibrated(args.groups)
    compile = device.type == "cuda"
    budgets = [float(b) for b in args.budgets.split(",")]
    settings = args.algorithms.split(",")
    rows = Rows(out, {**environment(device), "model": args.model, "left_out": unrep,
                      "workload": [tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__ for e in examples[:2]]
                      + ([f"... {len(examples)} inputs"] if len(examples) > 2 else [])},
                f"# {args.model} on {environment(device)['device']}\n\ncommand: `{' '.join(sys.argv)}`")
    t = time.perf_counter()
    base_acc = task(model)
    # the unchanged model is the uniform plan to beat when no quantized one is faster within the budget
    rows.add("uniform", {"plan": "unchanged", "accuracy": base_acc, "drop_points": 0.0, "eval_s": time.perf_counter() - t,
                         "load_s": t - t_start, "speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0})
    prof = profile(model, examples if len(examples) > 1 else examples[0])
    uniform_names = [] if args.uniform == "none" else args.uniform.split(";") if args.uniform else [
        n for n in default if n not in ("bf16", "fp32_compute")] + (cal if "on" in settings else [])
    for name in uniform_names:
        q = copy.deepcopy(model)
        try:
            plan = autoao.Plan.uniform(q, name, device=device)
            if not plan.layers:
                rows.add("uniform", {"plan": f"uniform {name}", "accuracy": base_acc, "drop_points": 0.0, "eval_s": 0.0,
                                     "note": "no layer supports it here"})
                continue
            autoao.apply(q, plan, calibration=prof.calibration)
            t = time.perf_counter()
            acc = task(q)
            row: dict[str, Any] = {"plan": f"uniform {name}", "layers": len(plan.layers), "accuracy": acc,
                                   "drop_points": 100 * (base_acc - acc), "eval_s": time.perf_counter() - t}
            if base_acc - acc <= max(budgets) + 1e-9:
                row.update(interleaved_speedup(model, q, examples, args.rounds, compile))
        except Exception as e:  # noqa: BLE001 - a candidate failing here is a row, not the end of the run
            row = {"plan": f"uniform {name}", "accuracy": float("nan"), "drop_points": float("nan"), "eval_s": 0.0,
                   "error": f"{type(e).__name__}: {e}"[:500]}
        rows.add("uniform", row)
        del q
        gc.collect()
        if compile:
            torch.cuda.empty_cache()
    for drop in budgets:
        fitting = [r for r in rows.data["uniform"] if r.get("speedup") and r["drop_points"] <= 100 * drop + 1e-9]
        for algorithms in settings:
            cands = default if algorithms == "off" else default + cal
            best = max((r for r in fitting if algorithms == "on" or not any(a in r["plan"] for a in
                        ("gptq", "awq", "hqq", "smoothquant"))), key=lambda r: r["speedup"], default=None)
            work = out / f"search-{args.model}-{drop:g}-{algorithms}"
            shutil.rmtree(work, ignore_errors=True)
            m = copy.deepcopy(model)
            t0 = time.perf_counter()
            try:  # (no left_out: optimize does not take it; only the command line's RunHooks do)
                res = autoao.optimize(m, examples if len(examples) > 1 else examples[0], budget=args.search_budget,
                                      accuracy=accuracy_arg, tokenizer=tok, max_accuracy_drop=drop, candidates=cands,
                                      eval_inputs=held, out_dir=work, progress=True)
            except Exception as e:  # noqa: BLE001 - recorded; the other searches still run
                rows.data.setdefault("errors", []).append(f"search {drop} {algorithms}: {type(e).__name__}: {e}"[:800])
                rows.write()
                continue
            rec = search_record(res, time.perf_counter() - t0)
            t = time.perf_counter()
            acc = task(res.model)
            rec.update({"budget": drop, "algorithms": algorithms, "accuracy": acc, "drop_points": 100 * (base_acc - acc),
                        "full_task_s": time.perf_counter() - t, "best_uniform": best,
                        "vs_best_uniform": rec["speedup_measured"] / best["speedup"] if best else None})
            keep_small(work)
            rows.add("searched", rec)
            del m, res
            gc.collect()
            if compile:
                torch.cuda.empty_cache()
    rows.data["wall_s"] = time.perf_counter() - t_start
    rows.write()
    print(f"wrote {out / 'rows.md'} in {rows.data['wall_s']:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)
    s = sub.add_parser("stack", help="issue 23: the llama8 stack's search with algorithms off and on")
    s.add_argument("--out", required=True)
    s.add_argument("--trials", type=int, default=40)
    s.add_argument("--groups", default="128", help="int4 group sizes of the calibrated variants (comma-separated)")
    s.add_argument("--smoke", action="store_true", help="the tiny stack on the CPU (checks the path, not a result)")
    r = sub.add_parser("real", help="a real built-in model: uniform plans and searched plans per budget")
    r.add_argument("--model", required=True, choices=models.available())
    r.add_argument("--out", required=True)
    r.add_argument("--budgets", default="0.01", help="max accuracy drops, absolute (0.01 = 1 point), comma-separated")
    r.add_argument("--algorithms", default="off,on", help="off, on or off,on")
    r.add_argument("--groups", default="64", help="int4 group sizes of the calibrated variants (comma-separated)")
    r.add_argument("--search-budget", default="150s")
    r.add_argument("--rounds", type=int, default=3, help="interleaved rounds for each uniform plan's speed-up")
    r.add_argument("--uniform", default=None, help="';'-separated uniform plans (default: the whole space; none: no uniform rows)")
    r.add_argument("--smoke", action="store_true", help="on the CPU, one decode step, 24 lm-eval documents (checks the path, not a result)")
    args = ap.parse_args()
    args.groups = [int(g) for g in args.groups.split(",")]
    if args.part == "real" and not set(args.algorithms.split(",")) <= {"off", "on"}:
        ap.error(f"--algorithms {args.algorithms!r}: expected off, on or off,on")
    stack(args) if args.part == "stack" else real(args)


if __name__ == "__main__":
    main()
