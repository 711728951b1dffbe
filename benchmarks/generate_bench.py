"""What a user sees in transformers' `generate()`: a built-in model as it came against a run's plan,
timed side by side, next to the forward-pass speed-up the run reported.

    python benchmarks/generate_bench.py --run RUN_DIR --out DIR [--modes eager,compiled] [--rounds 5]
    python benchmarks/generate_bench.py --run RUN_DIR --plan "uniform fp8_wo=PLAN.json" --device cuda --out DIR
    python benchmarks/generate_bench.py --synthetic llama-1b --device cuda --out DIR --modes eager,compiled
    python benchmarks/generate_bench.py --paired DIR/generate.json [...] [--forward 1.454]

--run: an `autoao search` output folder of the built-in --model (default the demo's; its plan.json
is applied to a fresh copy, with calibration from the bundled text for GPTQ / AWQ / SmoothQuant);
each --plan NAME=PATH (repeatable, e.g. the best uniform plan h200_ceiling.py --save-plans wrote)
is applied the same way and timed as one more side.
--synthetic: a random-init transformers Llama (SYNTHETIC's shapes, bf16) searched here first with
`autoao.optimize` on one decode step (--budget, --candidates), the returned model benchmarked;
with --workload eager|compiled, optimize is also given that generate() as its `workload`, so it
ships the plan only if faster there, and generate.json keeps what it measured (optimize_workload);
each --plan (made on the real model's layer names) is applied to it as one more side, and
--no-search leaves only those; --narrow adds the same model NARROW times narrower, as it came and
with each --plan (narrow_sides: how much of a token is the device's work on this host).
For each mode, --rounds rounds, the models alternating (ABC ABC ...), each round one
greedy `generate()` of --new-tokens tokens (min = max, so both produce the same count) after a
--prompt-tokens prompt of held-out text, KV cache on:

    eager      the models as they are
    compiled   generate(cache_implementation="static"), which transformers compiles on CUDA (the
               way its docs tell users to speed up decoding; on a CPU it does not compile, and the
               table says "static cache, not compiled"); the first call of each model is not timed
    compiled-own   the same, but each model compiles a function of its own (own_compiled_call):
               transformers' compiled method is one code object, so the side-by-side models
               otherwise share one dynamo cache

Per mode and plan: the median tokens/s of each side, the plan's ratio to the model as it came with
the per-round range, and how many of the plan's generated tokens equal the unchanged model's (positionwise, all rounds' prompts). Runs on
the device the model is loaded to (--device). Next to it, the same count for the unchanged model's
float32 twin: its noise floor. With --profile, one more generate() per side and mode under
torch.profiler: wall and device (kernel) ms a token and the host ranges that say where a compiled
step's time outside its kernels goes (dynamo's cache lookups, compiled regions, CUDA graph and
kernel launches, device syncs). Writes DIR/generate.json and DIR/generate.md.
--paired: reads generate.json files this script wrote and prints each plan's speed-up as autoao
reads a paired comparison (autoao.clock.paired_speedup: the geometric mean of the rounds' ratios,
one-sided 95% bounds), with --forward its share of that forward-pass speed-up; measures nothing.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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

BASE = "as it came"  # the side every plan's ratio is read against


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, mode: str) -> tuple[torch.Tensor, float]:
    """(the new tokens [1, new_tokens], seconds) of one greedy generate()."""
    extra = {"cache_implementation": "static"} if mode.startswith("compiled") else {}
    sync(ids.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **extra)
    sync(ids.device)
    return out[:, ids.shape[1]:].cpu(), time.perf_counter() - t0


def own_compiled_call(model: torch.nn.Module):
    """A `get_compiled_call` for `model` alone. transformers compiles `self.__call__`, whose code is
    the same for every model, so side-by-side models share one dynamo cache and each call may check
    the other models' guards first; a function built here has its own code object, so its own cache."""
    scope: dict[str, object] = {}
    exec("def call(*args, **kwargs):\n    return model(*args, **kwargs)\n", {"model": model}, scope)
    compiled: dict[str, object] = {}

    def get(config=None):
        if "fn" not in compiled:
            compiled["fn"] = torch.compile(scope["call"], **(config or model._default_compile_config()).to_dict())
        return compiled["fn"]
    return get


def side_by_side(models: dict[str, torch.nn.Module], prompts: list[torch.Tensor], new_tokens: int, mode: str
                 ) -> dict[str, object]:
    """Interleaved rounds of generate() on each model; per plan (every side but "as it came"): its
    tokens/s, ratio to the model as it came with the per-round range, and greedy tokens equal."""
    for m in models.values():  # compiled-own: each model compiles a function of its own; else transformers'
        if mode == "compiled-own":
            m.get_compiled_call = own_compiled_call(m)
        else:
            m.__dict__.pop("get_compiled_call", None)
    for m in models.values():  # warm-up (compiles in the compiled mode)
        generate(m, prompts[0], new_tokens, mode)
    speed: dict[str, list[float]] = {k: [] for k in models}
    tokens: dict[str, list[torch.Tensor]] = {k: [] for k in models}
    for ids in prompts:
        for name, m in models.items():
            out, seconds = generate(m, ids, new_tokens, mode)
            speed[name].append(new_tokens / seconds)
            tokens[name].append(out)
    base = speed[BASE]
    plans = {}
    for name in models:
        if name == BASE:
            continue
        ratios = [p / b for p, b in zip(speed[name], base)]
        plans[name] = {"tokens_per_s": statistics.median(speed[name]), "ratio": statistics.median(ratios),
                       "ratio_range": [min(ratios), max(ratios)],
                       "greedy_equal": sum(int((a == b).sum()) for a, b in zip(tokens[name], tokens[BASE]))}
    return {"tokens_per_s": statistics.median(base), "rounds": speed, "plans": plans,
            "greedy_tokens": new_tokens * len(prompts), "tokens": tokens[BASE]}


# host-side ranges of one generate() whose time says where a compiled step's time outside its
# kernels goes (their names as torch.profiler records them in torch 2.11)
HOST_RANGES = {"dynamo cache lookups": "TorchDynamo Cache Lookup", "compiled regions": "Torch-Compiled Region",
               "CUDA graph launches": "cudaGraphLaunch", "kernel launches": "cudaLaunchKernel",
               "device syncs": "aten::_local_scalar_dense"}


def profiled(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, mode: str) -> dict[str, object]:
    """One generate() (after the timed rounds, so warm) under torch.profiler, per generated token:
    wall ms, the device's kernel ms, and the count and host ms of each HOST_RANGES range."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ids.is_cuda else [])
    with profile(activities=activities) as prof:
        _, seconds = generate(model, ids, new_tokens, mode)
    events = prof.key_averages()
    out: dict[str, object] = {"wall_ms": 1e3 * seconds / new_tokens,
                              "device_ms": sum(e.self_device_time_total for e in events) / 1e3 / new_tokens}
    for label, name in HOST_RANGES.items():
        hits = [e for e in events if e.key.startswith(name)]  # "Torch-Compiled Region: 0/1" names its entry
        out[label] = {"count": sum(e.count for e in hits) / new_tokens,
                      "host_ms": sum(e.cpu_time_total for e in hits) / 1e3 / new_tokens}
    return out


def noise_floor(base: torch.nn.Module, prompts: list[torch.Tensor], reference: list[torch.Tensor], new_tokens: int) -> int:
    """How many of the unchanged model's greedy tokens its float32 twin reproduces (untimed): the
    agreement a plan is read against, since one changed token changes the rest of a continuation."""
    twin = copy.deepcopy(base).float()
    return sum(int((generate(twin, ids, new_tokens, "eager")[0] == ref).sum()) for ids, ref in zip(prompts, reference))


# random-init transformers Llamas of real models' shapes (speed only), for --synthetic here and in
# h200_ceiling.py: Llama-3.2-1B-like (hidden 2048, 16 layers, ffn 8192), SmolLM2-135M's, and a tiny
# one that runs anywhere (the scripts' own checks)
SYNTHETIC = {"llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048),
             "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                  tie_word_embeddings=True, rms_norm_eps=1e-5),
             "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)}


NARROW = 4  # --narrow: hidden and intermediate sizes divided by this (SmolLM2: 576 -> 144, head_dim 16)


def from_run(args: argparse.Namespace) -> tuple[dict[str, torch.nn.Module], list[torch.Tensor], float | None]:
    """The built-in --model as it came, with --run's plan ("plan") and with each --plan; held-out text
    prompts; the forward speed-up --run reported (None without --run)."""
    base, tok = autoao.models.load(args.model, device=args.device)
    named = [("plan", args.run / "plan.json")] if args.run else []
    named += plan_specs(args)
    sides = plan_sides(base, named, lambda: [t.to(args.device) for t in autoao.models.text_inputs(tok, seq_len=256)])
    prompts = [p.to(args.device) for p in
               autoao.models.text_inputs(tok, seq_len=args.prompt_tokens, n_seqs=args.rounds, held_out=True)]
    reported = json.loads((args.run / "summary.json").read_text())["speedup"]["measured"] if args.run else None
    return {BASE: base, **sides}, prompts, reported


def synthetic_model(name: str, device: str | torch.device) -> torch.nn.Module:
    """The random-init SYNTHETIC[name] Llama in bf16, eval mode, seeded: the same weights each call."""
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SYNTHETIC[name])).to(torch.bfloat16).eval()


def from_search(args: argparse.Namespace) -> tuple[dict[str, torch.nn.Module], list[torch.Tensor], float | None]:
    """A random-init --synthetic Llama (bf16) as it came, as `autoao.optimize` returns it (unless
    --no-search; searched on one decode step with --candidates for --budget, a speed search: random
    weights carry no accuracy, so max_accuracy_drop=1.0) and with each --plan applied; random prompts."""
    base = synthetic_model(args.synthetic, args.device)
    config = base.config
    one = torch.tensor([[17]], device=args.device)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, config.vocab_size, (1, args.prompt_tokens), generator=gen).to(args.device)
               for _ in range(args.rounds)]
    models: dict[str, torch.nn.Module] = {BASE: base}
    reported = None
    if not args.no_search:
        # --workload MODE: optimize times generate() in that mode itself and ships only if faster there
        workload = None if args.workload == "none" else (
            lambda m: generate(m, prompts[0], args.new_tokens, args.workload))
        res = autoao.optimize(copy.deepcopy(base), (one,), budget=args.budget, max_accuracy_drop=1.0,
                              candidates=args.candidates.split(","), out_dir=args.out / "search", progress=True,
                              workload=workload)
        args.searched_workload = dataclasses.asdict(res.summary.workload) if res.summary.workload else None
        args.search_decisions = [d.describe() for d in res.summary.decisions]  # a refusal's numbers are here
        models["plan"], reported = res.model, res.summary.speedup.measured
    # plans made on the real model's layer names apply to its random-init twin
    def calibration() -> list[torch.Tensor]:
        return [torch.randint(0, config.vocab_size, (1, 256), generator=gen).to(args.device) for _ in range(4)]

    models.update(plan_sides(base, plan_specs(args), calibration))
    if args.narrow:
        models.update(narrow_sides(args, config, calibration))
    return models, prompts, reported


def narrow_sides(args: argparse.Namespace, config, calibration) -> dict[str, torch.nn.Module]:
    """--narrow: the same architecture with hidden and intermediate sizes cut NARROW times (the
    same modules, heads, vocabulary, kernel count and so the same host work a token: transformers'
    loop, dynamo's guards, the graph's launch), as it came and with each --plan. Its linear layers
    and attention cost next to nothing on the device, so its tokens/s over the full model's says how
    much of a token is the device's work on this host: where "narrow, as it came" runs about as
    fast as the full model, the host sets the pace and no plan that keeps the kernel count can make
    the token much faster (a fused plan launches fewer kernels, so it can exceed that)."""
    import transformers

    shape = {k: getattr(config, k) // NARROW for k in ("hidden_size", "intermediate_size")}
    shape["head_dim"] = shape["hidden_size"] // config.num_attention_heads  # else to_dict() keeps the full one
    with torch.device(args.device):
        narrow = transformers.LlamaForCausalLM(config.__class__(**{**config.to_dict(), **shape}))
        narrow = narrow.to(torch.bfloat16).eval()
    sides = {"narrow, as it came": narrow, **plan_sides(narrow, plan_specs(args), calibration)}
    return {(k if k.startswith("narrow") else f"narrow, {k}"): m for k, m in sides.items()}


def plan_specs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    return [(spec.split("=", 1)[0], Path(spec.split("=", 1)[1])) for spec in args.plan]


def plan_sides(base: torch.nn.Module, named: list[tuple[str, Path]], calibration_inputs) -> dict[str, torch.nn.Module]:
    """Each named plan.json applied to a copy of `base`; calibrated (GPTQ / AWQ / SmoothQuant) on the
    profile of `calibration_inputs()`, called only where a plan changes a layer."""
    plans = {name: Plan.load(path) for name, path in named}
    calib = profile(base, calibration_inputs()).calibration if any(p.layers for p in plans.values()) else None
    return {name: autoao.apply(copy.deepcopy(base), p, calibration=calib) for name, p in plans.items()}


def write(args: argparse.Namespace, result: dict, rows: dict, floor: int) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generate.json").write_text(json.dumps(result, indent=1))
    reported = result["forward_speedup_reported"]
    lines = [f"# generate(): {result['model']}, as it came vs {', '.join(result['plans']) or 'unchanged'}", "",
             f"`{result['command']}`; {result['date']}; {result.get('device', '')}; torch {result['torch']}, "
             f"transformers {result.get('transformers', '')}; {result['threads']} threads"
             + (f"; forward-pass speed-up the run reported for \"plan\": {reported:.3f}x" if reported else ""), "",
             "| mode | plan | as it came tok/s | plan tok/s | plan / as it came (per-round range) | greedy tokens equal |",
             "|---|---|---|---|---|---|"]
    for mode, r in rows.items():
        shown = "static cache, not compiled" if mode.startswith("compiled") and args.device == "cpu" else mode
        for name, p in r["plans"].items():
            lines.append(f"| {shown} | {name} | {r['tokens_per_s']:.1f} | {p['tokens_per_s']:.1f} | {p['ratio']:.3f}x "
                         f"({p['ratio_range'][0]:.3f}-{p['ratio_range'][1]:.3f}) | {p['greedy_equal']} of {r['greedy_tokens']} |")
    lines += [f"| {mode} | failed: {err} | | | | |" for mode, err in result.get("errors", {}).items()]
    for mode, r in rows.items():
        if "profile" in r:
            lines += ["", f"Profiled, {mode}, per generated token (one generate() a side after the rounds):", "",
                      "| side | wall ms | device ms | " + " | ".join(f"{k} (n, host ms)" for k in HOST_RANGES) + " |",
                      "|---|---|---|" + "---|" * len(HOST_RANGES)]
            for side, p in r["profile"].items():
                lines.append(f"| {side} | {p['wall_ms']:.3f} | {p['device_ms']:.3f} | " + " | ".join(
                    f"{p[k]['count']:.1f}, {p[k]['host_ms']:.3f}" for k in HOST_RANGES) + " |")
    lines += ["", "Plans: " + "; ".join(f"{k}: {v}" for k, v in result["plans"].items()), "",
              f"The float32 twin of the model as it came reproduces {floor} of its "
              f"{next(iter(rows.values()))['greedy_tokens']} greedy tokens (eager): the noise floor of the last column."]
    (args.out / "generate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def paired(files: list[Path], forward: float | None) -> None:
    """Each plan's paired speed-up over the model as it came in the rounds of `files` (generate.json)."""
    from autoao.clock import paired_speedup

    for path in files:
        result = json.loads(path.read_text())
        for mode, row in result["modes"].items():
            base = [1 / s for s in row["rounds"][BASE]]  # seconds a token, per round
            for side, speeds in row["rounds"].items():
                if side == BASE:
                    continue
                p = paired_speedup(base, [1 / s for s in speeds])
                share = (f"; {p.estimate / forward:.1%} ({p.low / forward:.1%} to "
                         f"{p.high / forward:.1%}) of {forward}x" if forward else "")
                print(f"{path}: {mode}, {side}: {p.estimate:.3f}x ({p.low:.3f} to {p.high:.3f}), {p.rounds} rounds{share}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, help="an `autoao search` output folder of the built-in --model")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=PATH",
                    help="one more side: a plan.json of the built-in --model, or of the model --synthetic copies "
                    "(repeatable; needs --run, --plan-only or --synthetic)")
    source.add_argument("--plan-only", action="store_true", help="only the --plan sides (no --run)")
    source.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="search a random-init Llama here first")
    source.add_argument("--paired", nargs="+", type=Path, metavar="GENERATE_JSON",
                        help="read these generate.json files with autoao's paired statistic (measures nothing)")
    ap.add_argument("--forward", type=float, help="--paired: the forward-pass speed-up each plan's share is read against")
    ap.add_argument("--no-search", action="store_true", help="--synthetic: only its --plan sides, no search")
    ap.add_argument("--out", type=Path, help="the folder generate.json and generate.md go to (not with --paired)")
    ap.add_argument("--modes", default="eager", help="comma-separated: eager, compiled, compiled-own")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="smollm2-135m", help="the built-in model the run searched")
    ap.add_argument("--budget", default="3m", help="--synthetic: optimize's budget")
    ap.add_argument("--candidates", default="bf16,int4_wo(group_size=128)", help="--synthetic: its candidates")
    ap.add_argument("--profile", action="store_true", help="after each mode's rounds, one generate() per side "
                    "under torch.profiler: wall and device ms a token, dynamo lookups, graph and kernel launches, syncs")
    ap.add_argument("--narrow", action="store_true", help=f"--synthetic: also {NARROW}x narrower sides (narrow_sides)")
    ap.add_argument("--workload", default="none", choices=["none", "eager", "compiled"],
                    help="--synthetic: pass optimize a generate() workload in this mode (it then ships only if faster there)")
    args = ap.parse_args()
    if args.paired:
        return paired(args.paired, args.forward)
    if args.out is None:
        ap.error("--out is required (but with --paired)")
    if any("=" not in spec for spec in args.plan) or ((args.plan_only or args.no_search) and not args.plan):
        ap.error("--plan takes NAME=PATH; --plan-only and --no-search need at least one --plan")
    if args.no_search and not args.synthetic:
        ap.error("--no-search goes with --synthetic")
    models, prompts, reported = from_search(args) if args.synthetic else from_run(args)
    rows, errors = {}, {}
    for mode in args.modes.split(","):  # a mode that fails is recorded; the others still run
        try:
            rows[mode] = side_by_side(models, prompts, args.new_tokens, mode)
            if args.profile:
                rows[mode]["profile"] = {k: profiled(m, prompts[0], args.new_tokens, mode) for k, m in models.items()}
            print(mode, json.dumps({k: v for k, v in rows[mode].items() if k != "tokens"}), flush=True)
        except Exception as e:  # noqa: BLE001
            errors[mode] = f"{type(e).__name__}: {e}"[:1000]
            print(f"{mode} failed: {errors[mode]}", flush=True)
    if not rows:
        raise SystemExit(f"every mode failed: {errors}")
    floor = noise_floor(models[BASE], prompts, next(iter(rows.values()))["tokens"], args.new_tokens)
    for r in rows.values():
        r.pop("tokens")
    import transformers

    result = {"command": " ".join(["python", *sys.argv]), "model": args.synthetic or args.model,
              "plans": {k: autoao.plan_of(m).summary() for k, m in models.items() if k != BASE},
              "forward_speedup_reported": reported,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "autoao_from": str(Path(autoao.__file__).parent),
              "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else
              (platform.processor() or platform.machine()),
              "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "modes": rows, "errors": errors, "float32_twin_greedy_equal": floor,
              "optimize_workload": getattr(args, "searched_workload", None),
              "optimize_decisions": getattr(args, "search_decisions", None)}
    write(args, result, rows, floor)


if __name__ == "__main__":
    main()
