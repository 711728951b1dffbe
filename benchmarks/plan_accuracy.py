"""Does a plan's task score depend on its kernels? SmolLM2's autoao_facts under one saved plan, as
it ships and with its kernels or families changed.

    python benchmarks/plan_accuracy.py --plan OUT/plan.json --out benchmarks/results/<date>/kernels-move-accuracy

Variants of the plan (every one applied to a fresh bf16 copy of the demo model, scored on all of
autoao_facts with lm-eval, batch size 8, as the search's tier 2 scores):
- "as shipped": the plan file as `autoao search` wrote it (fused groups, each layer's timed kernel
  route, e.g. int8pack for 16 rows or fewer and dequantize + one bf16 matmul above);
- "default kernels, no fusions": the same candidates on each module's default kernel (what trial
  modules run), layer by layer;
- "FAMILY only, as shipped" / "FAMILY only, default kernels": the plan's layers of one candidate
  family alone.
Writes plan_accuracy.json (and prints each row).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import time
import warnings
from pathlib import Path

import torch

import autoao
import autoao.models
from autoao.evaluators import lmeval
from autoao.plan import Plan


def variant(path: Path, family: str | None, shipped: bool) -> Plan:
    plan = Plan.load(path)
    if family is not None:
        for fqn in [f for f, c in plan.layers.items() if c.family != family]:
            plan.layers.pop(fqn)
            plan.kernels.pop(fqn, None)
        plan.fusions = [g for g in plan.fusions if all(f in plan.layers for f in g)]
    if not shipped:
        plan.kernels.clear()
        plan.fusions.clear()
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path, help="a plan.json that autoao search wrote for smollm2-135m")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    t0 = time.perf_counter()
    bf16, tok = autoao.models.load("smollm2-135m")
    families = sorted({c.family for c in Plan.load(args.plan).layers.values()})
    cases = [("as shipped", None, True), ("default kernels, no fusions", None, False)]
    cases += [(f"{fam} only, {'as shipped' if s else 'default kernels'}", fam, s) for fam in families for s in (True, False)]
    rows = [{"variant": "bf16", "layers": 0, "acc": lmeval.evaluate(bf16, tok, ["autoao_facts"], batch_size=8)
             .metrics["autoao_facts"]["acc"]}]
    print(rows[-1], flush=True)
    for label, family, shipped in cases:
        plan = variant(args.plan, family, shipped)
        model = autoao.apply(copy.deepcopy(bf16), plan)
        acc = lmeval.evaluate(model, tok, ["autoao_facts"], batch_size=8).metrics["autoao_facts"]["acc"]
        rows.append({"variant": label, "layers": len(plan.layers), "kernels": sorted(set(plan.kernels.values())),
                     "fusions": len(plan.fusions), "acc": acc, "points_vs_bf16": 100 * (acc - rows[0]["acc"])})
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"command": f"python benchmarks/plan_accuracy.py --plan {args.plan} --out {args.out}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows,
              "wall_s": time.perf_counter() - t0}
    (args.out / "plan_accuracy.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
