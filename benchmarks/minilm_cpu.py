"""minilm-l6 on this CPU: the bundled autoao_pairs task under fp32 and uniform plans, then autoao's
searched plan at 0.5 and 1 point budgets, with its end-to-end speed-up measured against fp32.

    python benchmarks/minilm_cpu.py --out benchmarks/results/2026-12-01-cpu/minilm --part uniform   # ~5 min
    python benchmarks/minilm_cpu.py --out benchmarks/results/2026-12-01-cpu/minilm --part search    # ~5 min

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
SEARCH_CANDIDATES = ["int8_dyn"]  # the one quantized candidate with a fast fp32 CPU kernel here


def reference_paths(model: torch.nn.Module) -> None:
    """Every quantized module computes through its float32 reference (same numbers, no kernel)."""
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.forward = m.reference  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", choices=["uniform", "search"], required=True,
                    help="uniform plans' accuracy (minilm_uniform.json) or the searches (minilm_search.json)")
    ap.add_argument("--search-budget", default="150s")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, tok = models.load("minilm-l6")
    work = models.workload("minilm-l6", tok)
    task = work["accuracy"]
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
    for drop in (0.005, 0.01) if args.part == "search" else ():
        m = copy.deepcopy(model)
        r = autoao.optimize(m, work["example_inputs"], budget=args.search_budget, accuracy=task,
                            max_accuracy_drop=drop, candidates=SEARCH_CANDIDATES, eval_inputs=work["eval_inputs"],
                            out_dir=out / f"search-{drop}", progress=False)
        s = r.summary
        searches.append({"max_accuracy_drop": drop, "plan": r.plan.summary() or "all fp32",
                         "accuracy": s.accuracy.accuracy if s.accuracy else base,
                         "drop_points": 100 * s.accuracy.drop if s.accuracy else 0.0,
                         "speedup_measured": s.speedup.measured, "speedup_range": s.speedup_range,
                         "speedup_predicted": s.speedup.predicted, "rounds": s.rounds, "trials": s.trials,
                         "seconds": s.seconds, "decisions": [autoao.runfiles.describe(d) for d in s.decisions]})
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


if __name__ == "__main__":
    main()
