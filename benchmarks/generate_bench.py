"""What a user sees in transformers' `generate()`: a built-in model as it came against a run's plan,
timed side by side, next to the forward-pass speed-up the run reported.

    python benchmarks/generate_bench.py --run RUN_DIR --out DIR [--modes eager,compiled] [--rounds 5]

RUN_DIR: an `autoao search` output folder of the built-in --model (default the demo's; its
plan.json is applied to a fresh copy, with calibration from the bundled text for GPTQ / AWQ /
SmoothQuant). For each mode, --rounds rounds, the two models alternating (ABAB...), each round one
greedy `generate()` of --new-tokens tokens (min = max, so both produce the same count) after a
--prompt-tokens prompt of held-out text, KV cache on:

    eager      the models as they are
    compiled   generate(cache_implementation="static"), which transformers compiles on CUDA (the
               way its docs tell users to speed up decoding; on a CPU it does not compile, and the
               table says "static cache, not compiled"); the first call of each model is not timed

Per mode: the median tokens/s of each side, their ratio with the per-round range, and how many of
the plan's generated tokens equal the unchanged model's (positionwise, all rounds' prompts). Runs on
the device the model is loaded to (--device). Next to it, the same count for the unchanged model's
float32 twin: its noise floor. Writes DIR/generate.json and DIR/generate.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import autoao
import autoao.models
from autoao.plan import Plan
from autoao.profile import profile


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, mode: str) -> tuple[torch.Tensor, float]:
    """(the new tokens [1, new_tokens], seconds) of one greedy generate()."""
    extra = {"cache_implementation": "static"} if mode == "compiled" else {}
    sync(ids.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **extra)
    sync(ids.device)
    return out[:, ids.shape[1]:].cpu(), time.perf_counter() - t0


def side_by_side(models: dict[str, torch.nn.Module], prompts: list[torch.Tensor], new_tokens: int, mode: str
                 ) -> dict[str, object]:
    """Interleaved rounds of generate() on each model; tokens/s per round and the tokens each made."""
    for m in models.values():  # warm-up (compiles in the compiled mode)
        generate(m, prompts[0], new_tokens, mode)
    speed: dict[str, list[float]] = {k: [] for k in models}
    tokens: dict[str, list[torch.Tensor]] = {k: [] for k in models}
    for ids in prompts:
        for name, m in models.items():
            out, seconds = generate(m, ids, new_tokens, mode)
            speed[name].append(new_tokens / seconds)
            tokens[name].append(out)
    ratios = [p / b for p, b in zip(speed["plan"], speed["as it came"])]
    same = sum(int((a == b).sum()) for a, b in zip(tokens["plan"], tokens["as it came"]))
    return {"tokens_per_s": {k: statistics.median(v) for k, v in speed.items()}, "rounds": speed,
            "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
            "greedy_equal": same, "greedy_tokens": new_tokens * len(prompts), "tokens": tokens["as it came"]}


def noise_floor(base: torch.nn.Module, prompts: list[torch.Tensor], reference: list[torch.Tensor], new_tokens: int) -> int:
    """How many of the unchanged model's greedy tokens its float32 twin reproduces (untimed): the
    agreement a plan is read against, since one changed token changes the rest of a continuation."""
    twin = copy.deepcopy(base).float()
    return sum(int((generate(twin, ids, new_tokens, "eager")[0] == ref).sum()) for ids, ref in zip(prompts, reference))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="smollm2-135m", help="the built-in model the run searched")
    args = ap.parse_args()
    summary = json.loads((args.run / "summary.json").read_text())
    name = args.model
    base, tok = autoao.models.load(name, device=args.device)
    plan = Plan.load(args.run / "plan.json")
    calib = profile(base, autoao.models.text_inputs(tok, seq_len=256)).calibration if plan.layers else None
    models = {"as it came": base, "plan": autoao.apply(copy.deepcopy(base), plan, calibration=calib)}
    prompts = [p.to(args.device) for p in
               autoao.models.text_inputs(tok, seq_len=args.prompt_tokens, n_seqs=args.rounds, held_out=True)]
    rows = {mode: side_by_side(models, prompts, args.new_tokens, mode) for mode in args.modes.split(",")}
    first = next(iter(rows.values()))
    floor = noise_floor(base, prompts, first.pop("tokens"), args.new_tokens)
    for r in rows.values():
        r.pop("tokens", None)
    result = {"command": " ".join(["python", *sys.argv]), "model": name, "plan": plan.summary(),
              "forward_speedup_reported": summary["speedup"]["measured"],
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "modes": rows,
              "float32_twin_greedy_equal": floor}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generate.json").write_text(json.dumps(result, indent=1))
    lines = [f"# generate(): {name}, as it came vs {plan.summary() or 'unchanged'}", "",
             f"`{result['command']}`; {result['date']}; torch {result['torch']}; {result['threads']} threads; "
             f"forward-pass speed-up the run reported: {result['forward_speedup_reported']:.3f}x", "",
             "| mode | as it came tok/s | plan tok/s | plan / as it came (per-round range) | greedy tokens equal |",
             "|---|---|---|---|---|"]
    for mode, r in rows.items():
        t = r["tokens_per_s"]
        shown = "static cache, not compiled" if mode == "compiled" and args.device == "cpu" else mode
        lines.append(f"| {shown} | {t['as it came']:.1f} | {t['plan']:.1f} | {r['ratio']:.3f}x "
                     f"({r['ratio_range'][0]:.3f}-{r['ratio_range'][1]:.3f}) | {r['greedy_equal']} of {r['greedy_tokens']} |")
    lines += ["", f"The float32 twin of the model as it came reproduces {floor} of its "
              f"{first['greedy_tokens']} greedy tokens (eager): the noise floor of the last column."]
    (args.out / "generate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
