"""The ceiling of a speed search on one workload: the best uniform plan within an accuracy budget,
autoao's searched plan, and the CEILING (on every layer group the candidate autoao's own timing
table says is fastest, whatever it costs in accuracy), measured in one interleaved run.

    source benchmarks/device_env.sh
    python3 benchmarks/h200_ceiling.py --model smollm2-135m --workload decode --budgets 0.01 \
        --search-budget 240s --out $OUT/decode [--accuracies-from OLD/ceiling.json] [--save-plans DIR]
    python3 benchmarks/h200_ceiling.py --model smollm2-135m --workload prefill --no-search --out $OUT/prefill
    python3 benchmarks/h200_ceiling.py --synthetic smollm2-135m --workload decode --out $OUT/synthetic
    python3 benchmarks/h200_ceiling.py --model minilm-l6 --workload batch --budgets 0.005,0.01,0.02 --out $OUT/minilm
    python benchmarks/h200_ceiling.py --model smollm2-135m --workload decode --smoke --out /tmp/ceil   # CPU check

Workloads (the model's own text; decode and prefill at batch 1):
    decode    one generated token against a KV cache of --context tokens, as generate() runs each
              step: a transformers StaticCache (--cache-len slots) filled by a prefill of the prompt,
              the step fed at position --context; a forward pre-hook puts the cache's length back to
              --context before each call, so every timed call (and every CUDA-graph replay) runs the
              same step and writes the same slot
    prefill   one forward of --context tokens, no cache
    batch     an encoder's (minilm-l6) one forward of its batch of 32 sentences, as `autoao search
              --model minilm-l6` runs it; accuracy: the bundled retrieval task (autoao_pairs)

Steps: (1) the timing table: autoao's kernel timing (measure.time_candidates, the cells the search
reads, cached in AUTOAO_CACHE_DIR) of every candidate on every layer shape and fused sibling shape
of the workload; (2) plans as the search ships them (ModelBench.shipped: sibling groups share a
choice, fused where the table says it pays, the timed kernel per layer): each uniform plan, and the
ceiling; (3) the whole task's accuracy of the unchanged model and of each uniform plan and the
ceiling (SmolLM2: lm-eval autoao_facts, all documents; MiniLM: autoao_pairs, all items;
--synthetic: none, random weights);
(4) phase A: the unchanged model, every uniform plan within the largest budget that the timing
table does not price slower than the unchanged model, and the ceiling, each compiled and captured as a CUDA graph once, then --rounds rounds replaying each in turn
(order rotated each round, L2 flushed before each replay), timed with events; (5) for each budget,
autoao.optimize on the same workload (its candidates: the default space less the model's
unrepresentative ones; --synthetic: a speed search, max_accuracy_drop=1; --search-workload: with
the user's generate() as `workload=`), its plan's accuracy on
the whole task; (6) phase B: the searched plans captured too and the rounds run again over every
side. Speed-ups: the unchanged model's median replay time over the side's; the range is over the
rounds' ratios. On the CPU (--smoke) the sides are timed eagerly with forward_timing instead.
Each side's compile and capture costs 25-50 s on an H200 for SmolLM2's decode step (more at 256
tokens): plan a call's time for the sides it captures (results/2026-12-03-h200/ceiling-*/).
ceiling.json and ceiling.md are rewritten after every step, so a timeout keeps what finished.
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import json
import math
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from generate_bench import SYNTHETIC, generate, synthetic_model  # noqa: E402  random-init Llamas of real models' shapes
from h200_rows import DEMO_TASK, environment, keep_small, search_record  # noqa: E402

import autoao  # noqa: E402
import autoao.models as models  # noqa: E402
from autoao import search_space  # noqa: E402
from autoao.api import siblings  # noqa: E402
from autoao.stages.bench import ModelBench, captured  # noqa: E402
from autoao.clock import L2_FLUSH_BYTES  # noqa: E402
from autoao.common import BASELINE, cache_dir, call_model  # noqa: E402
from autoao.cost import CostModel  # noqa: E402
from autoao.evaluators.cache import ResultCache, TimingCache  # noqa: E402
from autoao.export import targets  # noqa: E402
from autoao.ledger import RunLedger  # noqa: E402
from autoao.stages.measure import layer_choices, time_candidates, forward_timing  # noqa: E402
from autoao.stages.search import make_groups, uniform_params  # noqa: E402
from autoao.stages.inputs import build_inputs  # noqa: E402



##### the workload ##############################################################################

def cache_kwarg(model: nn.Module) -> str:
    """The forward keyword of the KV cache (transformers 5.x: `past_key_values`, later `cache`)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _reset_cache(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: a cache marked with `_autoao_position` gets its length set back to it (each
    static layer's cumulative_length, a tensor with a fixed address: captured in a CUDA graph too)."""
    for key in ("past_key_values", "cache"):
        c = kwargs.get(key)
        pos = getattr(c, "_autoao_position", None)
        if pos is not None:
            for layer in c.layers:
                layer.cumulative_length.fill_(pos)
    return None


def decode_example(model: nn.Module, prompt: torch.Tensor, cache_len: int) -> dict[str, Any]:
    """One decode step's kwargs: a StaticCache filled by the prompt [1, T], the greedy next token fed
    at position T; installs the pre-hook that keeps every call at position T (deep copies of the
    model keep it)."""
    import transformers

    ctx = prompt.shape[1]
    cache = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
    kw = cache_kwarg(model)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True, **{kw: cache})
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    cache._autoao_position = ctx
    for layer in cache.layers:  # the hook's tensors must exist (lazy init ran in the prefill)
        assert int(layer.cumulative_length) == ctx, (int(layer.cumulative_length), ctx)
    model.register_forward_pre_hook(_reset_cache, with_kwargs=True)
    example = {"input_ids": token, kw: cache, "use_cache": True}
    with torch.no_grad():  # the step, called twice through the hook, against the whole sequence's forward
        steps = [call_model(model, example).logits[:, -1].float() for _ in range(2)]
        whole = model(input_ids=torch.cat([prompt, token], 1), use_cache=False).logits[:, -1].float()
    CHECK.update({"step_repeat_max_abs": float((steps[0] - steps[1]).abs().max()),
                  "step_vs_full_rel": float((steps[1] - whole).norm() / whole.norm()),
                  "same_argmax": bool((steps[1].argmax(-1) == whole.argmax(-1)).all())})
    return example


CHECK: dict[str, Any] = {}  # decode_example's check of the step it builds


def load_model(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, Any, list[Any], Any, Any]:
    """(model, tokenizer or None, held-out inputs, the workload's input, optimize's accuracy): a causal
    LM's input is a prompt [1, context] and its accuracy lm-eval's task; an encoder's input is its
    batch of 32 sentences and its accuracy the bundled retrieval task (a callable); --synthetic: none."""
    if args.synthetic:
        model = synthetic_model(args.synthetic, device)
        config = model.config
        gen = torch.Generator().manual_seed(3)
        prompt = torch.randint(0, config.vocab_size, (1, args.context), generator=gen).to(device)
        held = [torch.randint(0, config.vocab_size, (1, 256), generator=gen).to(device) for _ in range(2)]
        return model, None, held, prompt, None
    model, tok = models.load(args.model, device=device)
    if models.MODELS[args.model].kind == "encoder":
        work = models.encoder_inputs(args.model, tok, device=device)
        return model, tok, work["eval_inputs"], work["example_inputs"], work["accuracy"]
    prompt = models.text_inputs(tok, seq_len=args.context, n_seqs=1)[0].to(device)
    held = [t.to(device) for t in models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True)]
    return model, tok, held, prompt, DEMO_TASK


def task_accuracy(model: nn.Module, tok: Any, task: Any, limit: int | None) -> float:
    """The whole task's score: an encoder's callable task, or lm-eval's `task` on `limit` documents."""
    if callable(task):
        return float(task(model))
    from autoao.evaluators import lmeval

    return float(lmeval.evaluate(model, tok, [task], limit=limit).metrics[task]["acc"])


##### timing ####################################################################################

class Sides:
    """Models captured once each (compiled, one CUDA graph per distinct example), replayed in
    interleaved rounds. On the CPU: eager forward_timing, one call per side per round."""

    def __init__(self, examples: list[Any], cuda: bool) -> None:
        self.examples, self.cuda = examples, cuda
        self.models: dict[str, nn.Module] = {}
        self.replays: dict[str, list[Any]] = {}
        self.keep: list[Any] = []  # the compiled functions, alive as long as their graphs
        self.capture_s: dict[str, float] = {}

    def add(self, name: str, model: nn.Module) -> None:
        self.models[name] = model
        if not self.cuda:
            return
        t0 = time.perf_counter()
        torch._dynamo.reset()
        fn = torch.compile(model)
        self.replays[name] = captured(fn, self.examples)  # compiled, warmed and captured as optimize does
        torch.cuda.synchronize()
        self.keep.append(fn)
        self.capture_s[name] = time.perf_counter() - t0

    def rounds(self, n: int) -> dict[str, Any]:
        """Per side: median us, and the speed-up over 'unchanged' (median of medians, and the
        min/max of the per-round ratios)."""
        names = list(self.models)
        us: dict[str, list[float]] = {k: [] for k in names}
        if self.cuda:
            flush = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
            for _ in range(3):  # warm every graph
                for k in names:
                    for r in self.replays[k]:
                        r()
            torch.cuda.synchronize()
        for i in range(n):
            order = names[i % len(names):] + names[:i % len(names)]
            for k in order:
                if self.cuda:
                    flush.sum()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for r in self.replays[k]:
                        r()
                    end.record()
                    torch.cuda.synchronize()
                    us[k].append(start.elapsed_time(end) * 1e3)
                else:
                    us[k].append(forward_timing(self.models[k], self.examples, reps=3, max_seconds=0.5)[0])
        base = us["unchanged"]
        out = {}
        for k in names:
            ratios = [b / t for b, t in zip(base, us[k])]
            out[k] = {"median_us": statistics.median(us[k]), "p10_us": sorted(us[k])[len(us[k]) // 10],
                      "p90_us": sorted(us[k])[(9 * len(us[k])) // 10],
                      "speedup": statistics.median(base) / statistics.median(us[k]),
                      "speedup_lo": min(ratios), "speedup_hi": max(ratios),
                      "capture_s": self.capture_s.get(k)}
        return {"rounds": n, "sides": out}


##### the run ###################################################################################

class Record:
    def __init__(self, out: Path, head: dict[str, Any]) -> None:
        self.out = out
        self.data: dict[str, Any] = {**head, "plans": {}, "phase_a": None, "searched": [], "phase_b": None,
                                     "errors": []}

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "ceiling.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "ceiling.md").write_text(render(self.data))


def render(d: dict[str, Any]) -> str:
    env = d["environment"]
    lines = [f"# {d['model']}, {d['workload']} workload, on {env['device']}", "",
             f"`{env['command']}`; {env['date']}; torch {env['torch']}, triton {env['triton']}, "
             f"transformers {env['transformers']}; workload: {d['workload_desc']}", "",
             f"Timing table: {d.get('table', {})}", "", f"Decode step check: {d.get('decode_check')}; cache length "
             f"after the run: {d.get('cache_length_after')}", ""]
    phase = d.get("phase_b") or d.get("phase_a")
    sides = phase["sides"] if phase else {}
    lines += ["| plan | layers | accuracy (drop, points) | predicted speed-up | measured speed-up (per-round range) | "
              "median us |", "|---|---|---|---|---|---|"]
    for name, p in d["plans"].items():
        s = sides.get(name)
        acc = "n/a" if p.get("accuracy") is None else f"{p['accuracy']:.4f} ({p['drop_points']:+.2f})" + (
            ", scored in --accuracies-from" if p.get("reused") else "")
        pred = f"{p['predicted_speedup']:.3f}x" if p.get("predicted_speedup") else ""
        meas = f"{s['speedup']:.3f}x ({s['speedup_lo']:.3f}-{s['speedup_hi']:.3f})" if s else "not measured"
        comp = ", ".join(f"{k} x{v}" for k, v in (p.get("composition") or {}).items()) or "none"
        lines.append(f"| {name} | {comp} | {acc} | {pred} | {meas} | {s['median_us']:.1f} |" if s else
                     f"| {name} | {comp} | {acc} | {pred} | {meas} | |")
    if phase:
        which = "phase B, after the searches" if d.get("phase_b") else "phase A"
        lines += ["", f"Measured: {phase['rounds']} interleaved rounds ({which})."]
    for r in d["searched"]:
        lines += ["", f"Search at {100 * r['budget']:g} points: {r['plan']} in {r['trials']} trials, "
                  f"{r['wall_s']:.0f} s; optimize's own comparison {r['speedup_measured']:.3f}x "
                  f"(range {r['speedup_range']}); decisions: {'; '.join(str(x) for x in r['decisions'])[:1500]}"]
    for b in d.get("verdicts", []):
        lines += ["", b]
    if d["errors"]:
        lines += ["", "Errors: " + "; ".join(d["errors"])]
    return "\n".join(lines) + "\n"


def uniform_sides(rows: dict[str, Any], plans: dict[str, autoao.Plan], cost: CostModel, budgets: list[float],
                  which: str) -> set[str]:
    """The uniform plans phase A times: within the largest budget and not priced slower than the
    unchanged model by the timing table (a plan nobody ships); with which="best", only the one
    priced fastest within each budget."""
    def within(name: str, budget: float) -> bool:
        drop = rows.get(name, {}).get("drop_points", math.inf)
        return drop is None or drop <= 100 * budget + 1e-9

    base = cost.predict(autoao.Plan())
    ok = [n for n, p in plans.items() if n.startswith("uniform ") and n in rows and cost.predict(p) <= base]
    if which == "all":
        return {n for n in ok if within(n, max(budgets, default=0.0))}
    return {min(fits, key=lambda n: cost.predict(plans[n])) for b in budgets if (fits := [n for n in ok if within(n, b)])}


def save_plan(folder: Path | None, name: str, plan: autoao.Plan) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        plan.save(folder / (re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_") + ".json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=models.available())
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="random-init Llama of these shapes (speed only)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workload", choices=("decode", "prefill", "batch"), default="decode",
                    help="batch: an encoder's (and only an encoder's) batch of 32 sentences")
    ap.add_argument("--context", type=int, default=256, help="decode: tokens in the KV cache; prefill: tokens")
    ap.add_argument("--cache-len", type=int, default=320, help="decode: the static cache's slots")
    ap.add_argument("--budgets", default="0.01", help="max accuracy drops (0.01 = 1 point), comma-separated; none: no search")
    ap.add_argument("--search-budget", default="240s")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--timing-deadline", type=float, default=240.0, help="seconds for the timing table")
    ap.add_argument("--candidates", default=None, help="comma-separated (default: the space less the model's "
                    "unrepresentative candidates)")
    ap.add_argument("--search-dir", type=Path, default=None, help="where optimize writes (default under --out); "
                    "plan.json, summary.json and context.json are kept")
    ap.add_argument("--search-cache", type=Path, default=None, help="the searches' AUTOAO_CACHE_DIR (a fresh folder: "
                    "their kernel timings and the judges' unchanged sides start cold; the compiler's caches stay warm)")
    ap.add_argument("--uniform-sides", choices=("all", "best"), default="all", help="phase A: every uniform plan "
                    "within the largest budget, or only each budget's best (the one the timing table prices fastest)")
    ap.add_argument("--accuracies-from", type=Path, default=None, help="a ceiling.json of the same model and task: "
                    "plans of the same composition take its accuracy instead of scoring again (marked 'reused')")
    ap.add_argument("--save-plans", type=Path, default=None, help="write each side's plan here as NAME.json (spaces "
                    "and brackets as _), for generate_bench.py --plan")
    ap.add_argument("--smoke", action="store_true", help="CPU: eager timing, 24 lm-eval documents")
    ap.add_argument("--no-search", action="store_true", help="phase A only: the budgets pick the uniform plans timed")
    ap.add_argument("--search-workload", choices=("none", "eager", "compiled"), default="none", help="a causal LM: "
                    "give each search the user's generate() in this mode (32 greedy tokens after the prompt's first "
                    "32) as `workload=`, so a plan ships only if faster there too")
    args = ap.parse_args()

    device = torch.device("cpu" if args.smoke else "cuda")
    cuda = device.type == "cuda"
    t_start = time.perf_counter()
    name = args.synthetic or args.model
    if args.search_workload != "none" and args.workload == "batch":
        ap.error("--search-workload runs generate(): a causal LM's, not an encoder's")
    if args.smoke and args.accuracies_from:
        ap.error("--accuracies-from holds whole-task scores; --smoke scores 24 documents, so the two do not compare")
    if (args.workload == "batch") != (not args.synthetic and models.MODELS[args.model].kind == "encoder"):
        ap.error(f"--workload batch is an encoder's workload, and an encoder has only that one ({name})")
    model, tok, held, prompt, task = load_model(args, device)
    model.requires_grad_(False)
    if args.workload == "batch":
        examples = [prompt]
        desc = "one forward of a batch of 32 sentences (the bundled prose), as `autoao search --model` runs it"
    elif args.workload == "decode":
        examples = [decode_example(model, prompt, args.cache_len)]
        desc = (f"one decode step, batch 1, StaticCache of {args.cache_len} slots holding {args.context} "
                f"prompt tokens, fed at position {args.context}")
    else:
        examples = [prompt]
        desc = f"one prefill forward of {args.context} tokens, batch 1, no cache"
    unrep = {} if args.synthetic else models.unrepresentative(args.model)
    cand_names = args.candidates.split(",") if args.candidates else [
        c.name for c in search_space.all_candidates() if c.name not in unrep]
    if BASELINE not in cand_names:
        cand_names = [BASELINE, *cand_names]
    cands = [search_space.get(n) for n in cand_names]
    budgets = [] if args.budgets == "none" else [float(b) for b in args.budgets.split(",")]
    if args.synthetic:
        budgets = [1.0] if budgets else []
    rec = Record(args.out, {"environment": environment(device), "model": name, "workload": args.workload,
                            "workload_desc": desc, "candidates": cand_names, "left_out": list(unrep),
                            "synthetic": bool(args.synthetic), "decode_check": CHECK})
    limit = 24 if args.smoke else None
    accuracy = (lambda m: None) if args.synthetic else (lambda m: task_accuracy(m, tok, task, limit))

    # (1) the timing table, as the search measures it
    t = time.perf_counter()
    work = build_inputs(model, examples, eval_inputs=held, tokenizer=tok, confirm=False)
    ledger = RunLedger(None, progress=True)
    table, health = time_candidates(work, cands, cache=TimingCache(ResultCache(cache_dir() / "timings.sqlite").path),
                                    ledger=ledger, deadline=time.perf_counter() + args.timing_deadline)
    cost = CostModel.build(work.prof, table)
    choices, excluded = layer_choices(work.prof, cands, table, device, False)
    groups = make_groups(choices, siblings(work, targets.get("autoao")))
    bench = ModelBench(model, work.prof, work.examples, compile=cuda, groups=groups, cost=cost, table=table)
    rec.data["table"] = {"seconds": round(time.perf_counter() - t, 1), "cells": health.cells,
                         "not_timed": health.not_timed, "unreliable": health.unreliable, "layers": len(work.prof.layers),
                         "groups": len(groups), "tokens": work.tokens}
    rec.data["excluded"] = {c: sum(c in why for why in excluded.values()) for c in cand_names}
    rec.write()

    # (2) plans as the search ships them
    def group_us(g: Any, c: str) -> float:
        if len(g.fqns) > 1 and search_space.get(c).fusable and cost.fusion_pays(g.fqns, c):
            return cost.fused_us[tuple(g.fqns)][c]
        return sum(cost.layer_us[f].get(c, math.inf) for f in g.fqns)

    plans: dict[str, autoao.Plan] = {}
    for c in cand_names:
        if c in (BASELINE, "fp32_compute"):
            continue
        p = bench.shipped(uniform_params(groups, c), uniform=c)
        if p.layers:
            plans[f"uniform {c}"] = p
    ceiling_params = {g.name: min(g.choices, key=lambda c: group_us(g, c)) for g in groups}
    plans["ceiling"] = bench.shipped(ceiling_params, ceiling=True)
    for pname, p in plans.items():
        save_plan(args.save_plans, pname, p)

    # (3) accuracies (or a previous run's, for the same composition: same weights, kernels and task)
    earlier = json.loads(args.accuracies_from.read_text())["plans"] if args.accuracies_from else {}

    def scored(pname: str, m: nn.Module, composition: dict[str, int]) -> dict[str, Any]:
        old = earlier.get(pname, {})
        if old.get("accuracy") is not None and old.get("composition", {}) == composition:
            return {"accuracy": old["accuracy"], "reused": str(args.accuracies_from)}
        t = time.perf_counter()
        return {"accuracy": accuracy(m), "eval_s": time.perf_counter() - t}

    row = scored("unchanged", model, {})
    base_acc = row["accuracy"]
    rec.data["plans"]["unchanged"] = {**row, "drop_points": 0.0 if base_acc is not None else None, "composition": {}}
    rec.write()
    applied: dict[str, nn.Module] = {}
    for pname, p in plans.items():
        try:
            q = autoao.apply(copy.deepcopy(model), p, calibration=work.prof.calibration)
            row = scored(pname, q, p.summary())
            applied[pname] = q
            acc = row["accuracy"]
            rec.data["plans"][pname] = {"composition": p.summary(), "fusions": len(p.fusions), **row,
                                        "drop_points": None if acc is None else 100 * (base_acc - acc)}
        except Exception as e:  # noqa: BLE001 - one plan failing is a row
            rec.data["errors"].append(f"{pname}: {type(e).__name__}: {e}"[:400])
        rec.write()
    if "ceiling" in applied:
        rec.data["plans"]["ceiling"]["params"] = {g: c for g, c in ceiling_params.items() if c != BASELINE}

    # (4) phase A: the unchanged model, the uniform plans within the largest budget, the ceiling
    sides = Sides(examples, cuda)
    try:
        sides.add("unchanged", model)
        for pname, q in applied.items():
            if pname == "ceiling" or pname in uniform_sides(rec.data["plans"], plans, cost, budgets, args.uniform_sides):
                sides.add(pname, q)
        rec.data["phase_a"] = sides.rounds(args.rounds)
    except Exception as e:  # noqa: BLE001
        rec.data["errors"].append(f"phase A: {type(e).__name__}: {e}"[:800])
    predict = cost.with_rest_from(rec.data["phase_a"]["sides"]["unchanged"]["median_us"]) if rec.data["phase_a"] else None
    for pname, p in plans.items():
        if predict is not None and pname in rec.data["plans"]:
            rec.data["plans"][pname]["predicted_speedup"] = predict.predict(autoao.Plan()) / predict.predict(p)
    rec.write()
    print(render(rec.data), flush=True)

    # (5) searches
    workload = None if args.search_workload == "none" else (
        lambda m: generate(m, prompt[:, :32], 32, args.search_workload))
    if args.search_cache:
        os.environ["AUTOAO_CACHE_DIR"] = str(args.search_cache)
    for drop in [] if args.no_search else budgets:
        work_dir = (args.search_dir or args.out) / f"search-{drop:g}"
        shutil.rmtree(work_dir, ignore_errors=True)
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        try:
            res = autoao.optimize(m, examples, budget=args.search_budget, accuracy=task,
                                  tokenizer=tok, max_accuracy_drop=drop, candidates=cand_names, eval_inputs=held,
                                  out_dir=work_dir, progress=True, workload=workload)
        except Exception as e:  # noqa: BLE001
            rec.data["errors"].append(f"search {drop}: {type(e).__name__}: {e}"[:800])
            rec.write()
            continue
        r = search_record(res, time.perf_counter() - t0)
        t = time.perf_counter()
        acc = accuracy(res.model)
        r.update({"budget": drop, "accuracy": acc, "drop_points": None if acc is None else 100 * (base_acc - acc),
                  "full_task_s": time.perf_counter() - t, "out_dir": str(work_dir)})
        keep_small(work_dir)
        rec.data["searched"].append(r)
        pname = f"searched {100 * drop:g} points"
        rec.data["plans"][pname] = {"composition": res.plan.summary(), "fusions": len(res.plan.fusions),
                                    "accuracy": acc, "drop_points": r["drop_points"]}
        if predict is not None:
            rec.data["plans"][pname]["predicted_speedup"] = predict.predict(autoao.Plan()) / predict.predict(res.plan)
        save_plan(args.save_plans, pname, res.plan)
        if res.plan.layers:
            try:
                sides.add(pname, res.model)
            except Exception as e:  # noqa: BLE001
                rec.data["errors"].append(f"capture {pname}: {type(e).__name__}: {e}"[:800])
        rec.write()
        del m
        gc.collect()

    # (6) phase B: every side again, the searched plans among them
    if any(k.startswith("searched") for k in sides.models):
        try:
            rec.data["phase_b"] = sides.rounds(args.rounds)
        except Exception as e:  # noqa: BLE001
            rec.data["errors"].append(f"phase B: {type(e).__name__}: {e}"[:800])
    if args.workload == "decode":  # the hook held the step in place: one slot written past the prompt
        cache = next(v for k, v in examples[0].items() if k in ("past_key_values", "cache"))
        rec.data["cache_length_after"] = sorted({int(layer.cumulative_length) for layer in cache.layers})
    verdicts(rec.data, budgets)
    rec.data["wall_s"] = time.perf_counter() - t_start
    rec.write()
    print(render(rec.data), flush=True)
    print(f"wrote {args.out / 'ceiling.md'} in {rec.data['wall_s']:.0f} s")


def verdicts(d: dict[str, Any], budgets: list[float]) -> None:
    """Per budget: the best uniform within it, the ceiling and the searched plan, each over the best
    uniform (from the last phase measured)."""
    phase = d.get("phase_b") or d.get("phase_a")
    if not phase:
        return
    sides = phase["sides"]
    out = []
    for drop in budgets or [0.0]:
        within = [(k, s["speedup"]) for k, s in sides.items() if k == "unchanged" or (
            k.startswith("uniform") and d["plans"][k]["drop_points"] is not None
            and d["plans"][k]["drop_points"] <= 100 * drop + 1e-9)]
        if d["synthetic"]:  # no accuracy: every uniform plan counts
            within = [(k, s["speedup"]) for k, s in sides.items() if k == "unchanged" or k.startswith("uniform")]
        best = max(within, key=lambda kv: kv[1])
        ceil = sides.get("ceiling", {}).get("speedup")
        searched = sides.get(f"searched {100 * drop:g} points", {}).get("speedup")
        line = (f"At {100 * drop:g} points: best uniform within the budget {best[0]} {best[1]:.3f}x; ceiling "
                f"{ceil:.3f}x = {ceil / best[1]:.3f} of the best uniform" if ceil else "no ceiling measured")
        if searched:
            line += f"; searched {searched:.3f}x = {searched / best[1]:.3f} of the best uniform"
        elif any(r["budget"] == drop for r in d["searched"]):
            line += "; the search kept the model as it came (1.000x)"
        out.append(line)
    d["verdicts"] = out


if __name__ == "__main__":
    main()
