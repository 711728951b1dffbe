"""The CPU's answer to `quantize_dynamic`: SmolLM2-135M on the demo's workload, variants interleaved.

    python benchmarks/cpu_bench.py --out benchmarks/results/2026-12-01-cpu/cpu-kernels

In one process: the demo model (`autoao.models.load("smollm2-135m")`, bf16 as it comes), its
workload as `autoao search` times it (one 256-token prefill, then 32 one-token forwards), and for
each variant the wall time of that workload, variants run in turn (ABAB...) for several rounds
after a warm-up decode step each, so that a busy machine slows all of them alike. Variants: bf16, an fp32
copy, `torch.ao.quantization.quantize_dynamic(fp32 copy, {nn.Linear}, torch.qint8)`, and uniform
autoao plans on the kernels or routes that autoao's own timing (`measure_latencies`, the search's
cost model input) chose per layer shape for this workload; plus the plan that takes, per layer, the
candidate timing found fastest (speed only: no accuracy is checked here).

--plan NAME=DIR/plan.json (repeatable) adds a saved plan, e.g. the one `autoao search` chose at a
given --max-accuracy-drop, as a variant; NAME=DIR/model (a search's saved model: plan.json and
model.safetensors) loads its weights as saved, which a calibrated plan (GPTQ, AWQ) needs.
--accuracy scores every variant on lm-eval autoao_facts (acc; per question agreement with bf16),
after the timing rounds so that it disturbs none.

Writes cpu_bench.json (everything) and cpu_bench.md (the table) to --out. Bounded: --seconds
(default 330) covers loading, timing and rounds; rounds stop when the next would not fit (at least
one runs); the files are rewritten after every round. --cache reuses an autoao timing cache, e.g. one `autoao kernels` filled for these shapes:

    autoao kernels --shapes 192x576,576x576,1536x576,576x1536,49152x576 --tokens 1,256 \
        --candidates "bf16,fp32_compute,int8_dyn,int8_dyn(act=tensor),int8_wo,int4_wo(group_size=64)" \
        --cache-dir /tmp/bc --all-kernels
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import autoao
import autoao.models
from autoao import search_space
from autoao.common import call_model
from autoao.evaluators.cache import TimingCache
from autoao.evaluators.timing import device_name, measure_latencies, workload_us
from autoao.kernels import cpu_isa, describe_route
from autoao.plan import Plan, layer_specs

PLANS = ["fp32_compute", "int8_dyn", "int8_dyn(act=tensor)", "int8_wo", "int4_wo(group_size=64)"]
PREFILL, DECODE = 256, 32


def workload(model: nn.Module, ids: torch.Tensor) -> None:
    """One prefill of PREFILL tokens, then DECODE one-token forwards (the demo's timed examples)."""
    with torch.no_grad():
        call_model(model, ids)
        for i in range(DECODE):
            call_model(model, ids[:, i:i + 1])


def demo() -> tuple[nn.Module, Any, torch.Tensor, dict[str, tuple[int, int]]]:
    """The demo model (bf16, as it comes), its tokenizer, PREFILL-token input ids [1, PREFILL] and
    each layer's (K, N) by FQN."""
    torch.manual_seed(0)
    bf16, tok = autoao.models.load("smollm2-135m")
    ids = autoao.models.text_inputs(tok, seq_len=PREFILL, n_seqs=1)[0]
    return bf16, tok, ids, {fqn: (s.in_features, s.out_features) for fqn, s in layer_specs(bf16).items()}


def demo_timings(shapes: dict[str, tuple[int, int]], names: list[str], seconds: float, cache: Path | None = None):
    """autoao's own layer timing of bf16 and `names` at the demo's layer shapes and token counts,
    as the search runs it, within about `seconds`; `cache`: an autoao timing cache (sqlite) to read
    and fill (default a fresh one: this machine, now)."""
    unique = sorted({(n, k) for k, n in shapes.values()})
    with tempfile.TemporaryDirectory() as tmp:
        return measure_latencies(unique, [1, PREFILL], [search_space.get(c) for c in ["bf16", *names]],
                                 device="cpu", dtype=torch.bfloat16, cache=TimingCache(cache or Path(tmp) / "t.sqlite"),
                                 progress=False, calls={s: {PREFILL: 1, 1: DECODE} for s in unique},
                                 deadline=time.perf_counter() + seconds)


def timed_plan(model: nn.Module, name: str, table, shapes: dict[str, tuple[int, int]]) -> Plan:
    plan = Plan.uniform(model, name)
    plan.kernels = {}
    for fqn in plan.layers:
        kern = table.kernel_for(name, *shapes[fqn])
        if kern is not None:
            plan.kernels[fqn] = kern
    return plan


def fastest_plan(model: nn.Module, table, shapes, calls) -> Plan:
    """Per layer, the non-emulated candidate with the least workload time (bf16 where none beats it)."""
    layers, kernels = {}, {}
    owner: dict[int, str] = {}
    for fqn, (k, n) in shapes.items():
        w = id(model.get_submodule(fqn).weight)
        if w in owner:
            continue
        owner[w] = fqn
        best, best_us = "bf16", workload_us({m: table.get("bf16", m, k, n) for m in calls}, calls)
        for name in PLANS:
            ts = {m: table.find(name, m, k, n) for m in calls}
            if any(t is None or not t.ok or t.emulated for t in ts.values()):
                continue
            us = workload_us(ts, calls)  # type: ignore[arg-type]
            if us < best_us:
                best, best_us = name, us
        if best != "bf16":
            layers[fqn] = search_space.get(best)
            kern = table.kernel_for(best, k, n)
            if kern is not None:
                kernels[fqn] = kern
    return Plan.for_model(model, layers, kernels)


def torchao_variants(bf16: nn.Module) -> dict[str, nn.Module]:
    """torchao's int8 configs, each applied by quantize_ to a bf16 copy (every nn.Linear, the tied
    lm_head included, as quantize_ does by default)."""
    import torchao
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    out = {}
    for name, config in (("Int8WeightOnlyConfig", Int8WeightOnlyConfig()),
                         ("Int8DynamicActivationInt8WeightConfig", Int8DynamicActivationInt8WeightConfig())):
        m = copy.deepcopy(bf16)
        m.config.tie_word_embeddings = False  # the quantized lm_head is its own tensor now
        quantize_(m, config)
        out[f"torchao {torchao.__version__} {name}"] = m
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seconds", type=float, default=330.0, help="wall-clock bound for the whole run")
    ap.add_argument("--timing-seconds", type=float, default=100.0, help="of which, for autoao's layer timing")
    ap.add_argument("--max-rounds", type=int, default=7)
    ap.add_argument("--cache", type=Path, help="an autoao timing cache (sqlite) to read and fill")
    ap.add_argument("--threads", type=int, help="torch threads (default torch's). On a 2-core machine shared "
                    "with other jobs, 2 threads spin at each parallel region's barrier for a descheduled peer: "
                    "a bf16 workload measured 87 s instead of ~1.5 s there")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=PATH",
                    help="a saved plan.json, or a saved model's folder, to run as a variant (repeatable)")
    ap.add_argument("--accuracy", action="store_true", help="score each variant on lm-eval autoao_facts after timing")
    ap.add_argument("--torchao", action="store_true", help="add torchao's Int8WeightOnlyConfig and "
                    "Int8DynamicActivationInt8WeightConfig (quantize_ on a bf16 copy) as variants; needs torchao")
    args = ap.parse_args()
    saved = {}
    for item in args.plan:
        name, sep, path = item.partition("=")
        if not sep or not (Path(path).is_file() or (Path(path) / "model.safetensors").is_file()):
            ap.error(f"--plan {item!r}: expected NAME=PATH to an existing plan.json or saved model folder")
        saved[name] = Path(path)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_before = os.getloadavg()

    def say(what: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f} s] {what}", file=sys.stderr, flush=True)
    bf16, tok, ids, shapes = demo()  # shapes: fqn -> (K, N)
    calls = {PREFILL: 1, 1: DECODE}
    unique = sorted({(n, k) for k, n in shapes.values()})
    table = demo_timings(shapes, PLANS, args.timing_seconds, args.cache)
    say(f"timed {table.measured} cells in {table.seconds:.0f} s")
    routes = {name: {f"{n}x{k}": table.kernel_for(name, k, n) for n, k in unique} for name in PLANS}
    layer_us = {name: {f"{n}x{k}": {m: table.get(name, m, k, n).median_us for m in calls} for n, k in unique}
                for name in ["bf16", *PLANS]}

    variants: dict[str, nn.Module] = {"bf16 (as it came)": bf16}
    fp32 = copy.deepcopy(bf16).float()
    variants["fp32"] = fp32
    qd = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32), {nn.Linear}, dtype=torch.qint8)
    # its lm_head is a quantized copy of the tied embedding: lm-eval's HFLM would tie it back
    # (tie_weights sets a `weight` that the quantized module only has as a method)
    qd.config.tie_word_embeddings = False
    variants["quantize_dynamic (fp32, qint8)"] = qd
    if args.torchao:
        variants.update(torchao_variants(bf16))
    plans = {name: timed_plan(bf16, name, table, shapes) for name in PLANS}
    plans["autoao fastest per layer (speed only)"] = fastest_plan(bf16, table, shapes, calls)
    for name, plan in plans.items():
        variants[f"autoao {name}" if not name.startswith("autoao") else name] = autoao.apply(copy.deepcopy(bf16), plan)
        say(f"applied {name}")
    for name, path in saved.items():
        if path.is_dir():  # the weights as the search saved them (calibrated fits included)
            variants[name] = autoao.load(copy.deepcopy(bf16), path)
            plans[name] = Plan.load(path / "plan.json")
        else:
            plans[name] = Plan.load(path)
            variants[name] = autoao.apply(copy.deepcopy(bf16), plans[name])
        say(f"applied {name} ({path})")

    say(f"built {len(variants)} variants")
    with torch.no_grad():  # warm-up: a decode step each (oneDNN primitive caches, allocations)
        for m in variants.values():
            call_model(m, ids[:, :1])
    say("warmed up")
    samples: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    info = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": device_name(torch.device("cpu")), "cpu_features": cpu_isa.describe_features(),
        "isa": {lib: cpu_isa.isa_of(lib) for lib in ("bf16_mm", "fp32_mm", "fbgemm", "onednn_int8", "aten")},
        "versions": {"torch": torch.__version__, "autoao": autoao.__version__,
                     **({"torchao": __import__("torchao").__version__} if args.torchao else {}),
                     "transformers": __import__("transformers").__version__, "python": sys.version.split()[0]},
        "load_average_before": load_before, "threads": torch.get_num_threads(),
        "workload": f"1 x {PREFILL}-token prefill + {DECODE} x 1-token forwards, eager, no KV cache",
        "timing_seconds": table.seconds, "timing_cells_measured": table.measured,
        "timing_cells_not_timed": sum(not r.timing.ok and "not timed" in (r.timing.error or "") for r in table.rows),
        "routes": routes, "layer_us": layer_us, "plan_layers": {n: p.summary() for n, p in plans.items()},
    }
    rounds = 0
    while rounds < args.max_rounds:
        t_round = time.perf_counter()
        for v, m in variants.items():
            w0, c0 = time.perf_counter(), time.process_time()
            workload(m, ids)
            samples[v].append((time.perf_counter() - w0) * 1e3)
            cpu[v].append((time.process_time() - c0) * 1e3)
            say(f"  {v}: {samples[v][-1]:.0f} ms")
        rounds += 1
        say(f"round {rounds}: {time.perf_counter() - t_round:.1f} s")
        write(args.out, info, samples, cpu, rounds, time.perf_counter() - t_start)  # kept if a later round is cut off
        if time.perf_counter() - t_start + (time.perf_counter() - t_round) > args.seconds:
            break  # the next round would not fit
    if args.accuracy:
        from autoao.evaluators import lmeval

        acc: dict[str, dict] = {}
        for v, m in variants.items():
            r = lmeval.evaluate(m, tok, ["autoao_facts"], batch_size=8)
            acc[v] = {"acc": r.metrics["autoao_facts"]["acc"], "stderr": r.metrics["autoao_facts"].get("acc_stderr"),
                      "seconds": round(r.seconds, 1)}
            say(f"  {v}: autoao_facts {acc[v]['acc']:.4f}")
        data = json.loads((args.out / "cpu_bench.json").read_text())
        for row in data["rows"]:
            row["autoao_facts"] = acc[row["variant"]]
        (args.out / "cpu_bench.json").write_text(json.dumps(data, indent=1))
        (args.out / "cpu_bench.md").write_text(markdown(data))
    print(markdown(json.loads((args.out / "cpu_bench.json").read_text())))
    return 0


def write(out: Path, info: dict, samples: dict[str, list[float]], cpu: dict[str, list[float]], rounds: int,
          wall: float) -> None:
    base_name = next(iter(samples))  # bf16, the model as it came
    base = statistics.median(samples[base_name])
    rows = []
    for v, s in samples.items():
        paired = [b / x for b, x in zip(samples[base_name], s)]  # same round: bf16 / variant
        rows.append({"variant": v, "median_ms": statistics.median(s), "min_ms": min(s), "max_ms": max(s),
                     "cpu_ms_median": statistics.median(cpu[v]), "speedup_vs_bf16": base / statistics.median(s),
                     "paired_speedup_min": min(paired), "paired_speedup_max": max(paired), "samples_ms": s})
    result = {**info, "load_average_after": os.getloadavg(), "rounds": rounds, "rows": rows, "wall_seconds": wall}
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_bench.json").write_text(json.dumps(result, indent=1))
    (out / "cpu_bench.md").write_text(markdown(result))


def markdown(r: dict) -> str:
    lines = [f"# SmolLM2-135M on the CPU: demo workload, variants interleaved ({r['date']})", "",
             f"- command: `{r['command']}`",
             f"- CPU: {r['cpu']}; features: {r['cpu_features']}",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()),
             f"- workload: {r['workload']}; {r['rounds']} round(s) after a warm-up decode step each; "
             f"{r['wall_seconds']:.0f} s wall in all",
             f"- load average (1/5/15 min) before {tuple(round(x, 2) for x in r['load_average_before'])}, after "
             f"{tuple(round(x, 2) for x in r['load_average_after'])} on 2 cores shared with other work: "
             "absolute times are noisy, compare within a round (paired columns)",
             f"- layer timing (autoao's measure_latencies): {r['timing_cells_measured']} cells measured in "
             f"{r['timing_seconds']:.0f} s, the rest from the cache; {r['timing_cells_not_timed']} not timed", "",
             "| variant | median ms | min-max ms | speed-up vs bf16 (medians) | paired speed-up min-max | autoao_facts acc |",
             "|---|---|---|---|---|---|"]
    base_acc = r["rows"][0].get("autoao_facts", {}).get("acc")
    for row in r["rows"]:
        a = row.get("autoao_facts")
        acc = (f"{a['acc']:.4f} ({100 * (a['acc'] - base_acc):+.1f} points)" if a and base_acc is not None else "")
        lines.append(f"| {row['variant']} | {row['median_ms']:.0f} | {row['min_ms']:.0f}-{row['max_ms']:.0f} | "
                     f"{row['speedup_vs_bf16']:.2f}x | {row['paired_speedup_min']:.2f}-{row['paired_speedup_max']:.2f}x | {acc} |")
    lines += ["", "Kernels timing chose per shape (N x K) for this workload:", "",
              "| candidate | " + " | ".join(next(iter(r["routes"].values()))) + " |",
              "|---|" + "---|" * len(next(iter(r["routes"].values())))]
    for name, by_shape in r["routes"].items():
        lines.append(f"| {name} | " + " | ".join(describe_route(k) if k else "(one kernel)" for k in by_shape.values()) + " |")
    lines += ["", "Plans' layers: " + "; ".join(f"{n}: {s}" for n, s in r["plan_layers"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
