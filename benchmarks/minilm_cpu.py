"""minilm-l6 on this CPU: the bundled autoao_pairs task under fp32 and uniform plans, then autoao's
searched plan at 0.5, 1 and 2 point budgets, with its end-to-end speed-up measured against fp32.

    python benchmarks/minilm_cpu.py --out benchmarks/results/2026-12-01-cpu/minilm --part uniform   # ~5 min
    python benchmarks/minilm_cpu.py --out benchmarks/results/2026-12-01-cpu/minilm --part search    # ~8 min
    python benchmarks/minilm_cpu.py --out benchmarks/results/2026-12-02-epyc/minilm --part speed     # ~2 min
    python benchmarks/minilm_cpu.py --out DIR --part search --search-budget 120s \
        --candidates "int8_dyn;int8_dyn(act=tensor);int8_dyn(algorithm=smoothquant);int8_dyn(act=tensor, algorithm=smoothquant)"

`speed`: fp32, `torch.ao.quantization.quantize_dynamic(fp32, {nn.Linear}, qint8)` and the uniform
plans of the candidates with a fast fp32 CPU kernel (FAST), run on their kernels: each variant's
autoao_pairs score, then the example batch timed with every variant in turn, one run each a
round (`--rounds`), and each variant's speed-up over fp32 per round (minilm_speed.json).

Uniform plans: every linear layer of the encoder the candidate supports (the others stay fp32).
Their accuracy is computed through each quantized module's float32 `reference` path: the same
numbers as its kernel (to the SQNR bound the candidate tests hold it to), at a speed that fits the
bound; several have no fast fp32 CPU kernel (int8_wo and int4 ran one 32-sentence batch in 47 s and
over 60 s on a loaded 2-core machine), and fp8 is emulated on the CPU anyway: accuracy only.
The searches run `autoao.optimize` as `autoao search --model minilm-l6` does (its example batch,
held-out inputs and task), with int8_dyn, the one candidate with a fast fp32 CPU kernel here, and a time budget each.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import shutil
import time
from pathlib import Path

import torch

import autoao
import autoao.models as models
from autoao.kernels._base import QuantizedLinear

UNIFORM = ["int8_dyn", "int8_wo", "int4_wo(group_size=32)", "fp8_dyn(granularity=row)"]
# the candidates with a fast CPU kernel for an fp32 model: per-token int8 through torch._int_mm,
# per-tensor int8 through fbgemm / oneDNN's prepacked dynamic linear (quantize_dynamic's kernel),
# and the weights cast to bf16 (one bf16 matmul: AMX where the CPU has it)
FAST = ["int8_dyn", "int8_dyn(act=tensor)", "bf16_compute"]
SEARCH_CANDIDATES = FAST


def reference_paths(model: torch.nn.Module) -> None:
    """Every quantized module computes through its float32 reference (same numbers, no kernel)."""
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.forward = m.reference  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", choices=["uniform", "search", "speed"], required=True,
                    help="uniform plans' accuracy (minilm_uniform.json), the searches (minilm_search.json) "
                    "or the fast plans' speed and accuracy against quantize_dynamic (minilm_speed.json)")
    ap.add_argument("--search-budget", default="150s")
    ap.add_argument("--candidates", default=";".join(SEARCH_CANDIDATES),
                    help="--part search: ';'-separated candidates (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=7, help="--part speed: interleaved rounds")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=DIR",
                    help="--part speed: also a model folder `autoao search` saved (DIR/model), as row NAME")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, tok = models.load("minilm-l6")
    work = models.encoder_inputs("minilm-l6", tok)
    task = work["accuracy"]
    if args.part == "speed":
        return speed(model, work, args.rounds, out, t0, args.plan)
    rows = []
    t = time.perf_counter()
    base = task(model)
    rows.append({"plan": "fp32", **task.last_metrics, "eval_s": time.perf_counter() - t})
    print(rows[-1], flush=True)
    for name in UNIFORM if args.part == "uniform" else []:
        q = copy.deepcopy(model)
        autoao.apply(q, autoao.Plan.uniform(q, name))
        reference_paths(q)
        t = time.perf_counter()
        value = task(q)
        rows.append({"plan": f"uniform {name}", **task.last_metrics, "drop_points": 100 * (base - value),
                     "eval_s": time.perf_counter() - t})
        print(rows[-1], flush=True)
    searches = []
    for drop in (0.005, 0.01, 0.02) if args.part == "search" else ():
        m = copy.deepcopy(model)
        r = autoao.optimize(m, work["example_inputs"], budget=args.search_budget, accuracy=task,
                            max_accuracy_drop=drop, candidates=args.candidates.split(";"), eval_inputs=work["eval_inputs"],
                            out_dir=out / f"search-{drop}", progress=False)
        s = r.summary
        searches.append({"max_accuracy_drop": drop, "plan": r.plan.summary() or "all fp32",
                         "accuracy": s.accuracy.accuracy if s.accuracy else base,
                         "drop_points": 100 * s.accuracy.drop if s.accuracy else 0.0,
                         "speedup_measured": s.speedup.measured, "speedup_range": s.speedup_range,
                         "speedup_predicted": s.speedup.predicted, "rounds": s.rounds, "trials": s.trials,
                         "seconds": s.seconds, "decisions": s.notes})
        print(searches[-1], flush=True)
        for f in ("model", "study.db"):  # weights and the study stay out of the repository
            p = out / f"search-{drop}" / f
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    result = {"date": datetime.date.today().isoformat(), "cpu": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "uniform": rows,
              "searched": searches, "wall_s": time.perf_counter() - t0}
    path = out / f"minilm_{args.part}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path} in {result['wall_s']:.0f} s")


def speed(model: torch.nn.Module, work: dict, rounds: int, out: Path, t0: float, plans: list[str] = ()) -> None:
    """fp32, quantize_dynamic, the FAST uniform plans and the saved `plans` (NAME=DIR): accuracy,
    then interleaved rounds."""
    import statistics
    import warnings

    from autoao.common import call_model

    task, batch = work["accuracy"], work["example_inputs"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        variants = {"fp32": model,
                    "quantize_dynamic (fp32, qint8)": torch.ao.quantization.quantize_dynamic(
                        copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)}
    for name in FAST:
        variants[f"autoao uniform {name}"] = autoao.apply(copy.deepcopy(model), autoao.Plan.uniform(model, name))
    for spec in plans:
        name, _, folder = spec.partition("=")
        variants[name] = autoao.load(copy.deepcopy(model), Path(folder))
    base = task(model)
    rows = {}
    for name, m in variants.items():
        value = task(m)
        rows[name] = {"variant": name, "autoao_pairs": value, "drop_points": 100 * (base - value), "ms": []}
        print(rows[name], flush=True)
    with torch.no_grad():
        for m in variants.values():  # warm: oneDNN / fbgemm primitives, allocations
            call_model(m, batch)
        for _ in range(rounds):
            for name, m in variants.items():
                t = time.perf_counter()
                call_model(m, batch)
                rows[name]["ms"].append((time.perf_counter() - t) * 1e3)
    for row in rows.values():
        ratios = [f / x for f, x in zip(rows["fp32"]["ms"], row["ms"])]
        row.update(median_ms=statistics.median(row["ms"]), speedup_median=statistics.median(ratios),
                   speedup_min=min(ratios), speedup_max=max(ratios))
        print(row["variant"], f"{row['median_ms']:.1f} ms", f"{row['speedup_median']:.2f}x "
              f"({row['speedup_min']:.2f}-{row['speedup_max']:.2f})", f"pairs {row['autoao_pairs']:.4f}", flush=True)
    from autoao.evaluators.timing import device_name

    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cpu": device_name(torch.device("cpu")), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "batch": "the search's example batch: 32 sentences", "rounds": rounds, "rows": list(rows.values()),
              "wall_s": time.perf_counter() - t0}
    (out / "minilm_speed.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out / 'minilm_speed.json'} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
