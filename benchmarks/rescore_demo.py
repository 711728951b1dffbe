"""Is every plan the demo shipped within its budget on the whole task? Each run's plan.json applied
to a fresh bf16 copy of the demo model and scored on all of autoao_facts (one lm-eval run, batch
size 8), next to the model as it came on all of it; the drop against the run's max_accuracy_drop
and against the verdict the run shipped on.

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


def score(model: torch.nn.Module, tok) -> tuple[float, int]:
    r = lmeval.evaluate(model, tok, ["autoao_facts"], batch_size=8)
    return r.metrics["autoao_facts"]["acc"], r.samples["autoao_facts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="a glob of `autoao search` output folders")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    bf16, tok = autoao.models.load("smollm2-135m")
    base, n = score(bf16, tok)
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
            acc, _ = score(autoao.apply(copy.deepcopy(bf16), plan, calibration=calib), tok)
            row.update(acc=acc, drop=base - acc, within=base - acc <= s["max_accuracy_drop"])
        else:
            row.update(acc=base, drop=0.0, within=True, note="the model as it came")
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"command": f"python benchmarks/rescore_demo.py --runs '{args.runs}' --out {args.out}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "bf16_acc": base, "documents": n, "rows": rows,
              "wall_s": round(time.perf_counter() - t0, 1)}
    (args.out / "rescore.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Shipped demo plans re-scored on all {n} autoao_facts documents", "",
             f"command: `{result['command']}`; date {result['date']}; torch {result['torch']}; bf16 acc {base:.4f}", "",
             "| run | layers changed | full-task acc | drop | within max drop | verdicts it shipped on |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['layers']} | {r['acc']:.4f} | {r['drop']:+.4f} | {'yes' if r['within'] else 'NO'} | "
              f"{'; '.join(r['shipped_verdicts']) or r.get('note', '')} |" for r in rows]
    (args.out / "rescore.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
