"""Is every plan the demo shipped within its budget on the whole task? Each run's plan.json applied
to a fresh bf16 copy of the demo model and scored on all of autoao_facts (one lm-eval run at batch
size 1, as the tier-2 judge scores: each document's score then depends on it alone; and at batch
size 8, where a document's batch-mates move its score), next to the model as it came on all of it;
the drop against the run's max_accuracy_drop and against the verdict the run shipped on.

    python benchmarks/rescore_demo.py --runs 'benchmarks/results/<date>-cpu/budget/5m-*' --out DIR

Writes DIR/rescore.json and DIR/rescore.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import glob
import json
import time
from pathlib import Path

import torch

import autoao
import autoao.models
from autoao.evaluators import lmeval
from autoao.plan import Plan
from autoao.profile import profile


def score(model: torch.nn.Module, tok, batch_size: int) -> tuple[float, int]:
    r = lmeval.evaluate(model, tok, ["autoao_facts"], batch_size=batch_size)
    return r.metrics["autoao_facts"]["acc"], r.samples["autoao_facts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="a glob of `autoao search` output folders")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    bf16, tok = autoao.models.load("smollm2-135m")
    base, n = score(bf16, tok, 1)
    base8, _ = score(bf16, tok, 8)
    calib = profile(bf16, autoao.models.text_inputs(tok, seq_len=256)).calibration
    rows = []
    for run in sorted(Path(p) for p in glob.glob(args.runs)):
        if not (run / "summary.json").is_file():
            continue
        s = json.loads((run / "summary.json").read_text())
        plan = Plan.load(run / "plan.json")
        row = {"run": run.name, "layers": len(plan.layers), "max_drop": s["max_accuracy_drop"],
               "shipped_verdicts": [f"{v['status']}: {v['drop']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}] on {v['n']} "
                                    f"{v['unit']} ({v['judge']})" for v in s.get("verdicts", [])]}
        if plan.layers:
            model = autoao.apply(copy.deepcopy(bf16), plan, calibration=calib)
            acc, _ = score(model, tok, 1)
            acc8, _ = score(model, tok, 8)
            row.update(acc=acc, drop=base - acc, within=base - acc <= s["max_accuracy_drop"], acc_b8=acc8,
                       drop_b8=base8 - acc8)
        else:
            row.update(acc=base, drop=0.0, within=True, acc_b8=base8, drop_b8=0.0, note="the model as it came")
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"command": f"python benchmarks/rescore_demo.py --runs '{args.runs}' --out {args.out}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "bf16_acc": base, "bf16_acc_batch8": base8, "documents": n, "rows": rows,
              "wall_s": round(time.perf_counter() - t0, 1)}
    (args.out / "rescore.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Shipped demo plans re-scored on all {n} autoao_facts documents", "",
             f"command: `{result['command']}`; date {result['date']}; torch {result['torch']}; bf16 acc {base:.4f} "
             f"at batch 1 ({base8:.4f} at batch 8)", "",
             "| run | layers changed | full-task acc (batch 1) | drop | within max drop | drop at batch 8 | verdicts it "
             "shipped on |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['layers']} | {r['acc']:.4f} | {r['drop']:+.4f} | {'yes' if r['within'] else 'NO'} | "
              f"{r['drop_b8']:+.4f} | {'; '.join(r['shipped_verdicts']) or r.get('note', '')} |" for r in rows]
    (args.out / "rescore.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
