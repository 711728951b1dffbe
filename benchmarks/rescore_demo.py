"""Is every plan the demo shipped within its budget on the whole task? Each run's plan.json applied
to a fresh bf16 copy of the demo model and scored on all of autoao_facts in three whole-task lm-eval runs
(MODES: one forward per document, as the tier-2 judge scores, and one request per forward: a
document's score then depends on it alone; and batch size 8, where its batch-mates move it), next
to the model as it came on all of it scored the same way;
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


# how a whole-task run batches the requests: as the tier-2 judge does (one forward per document;
# before that, one request per forward) and as lm-eval does by default (8 requests of several documents)
MODES = {"per document": {"per_document": True}, "batch 1": {"batch_size": 1}, "batch 8": {"batch_size": 8}}


def score(model: torch.nn.Module, tok, modes: list[str]) -> tuple[dict[str, float], int]:
    accs, n = {}, 0
    for mode, kwargs in ((m, MODES[m]) for m in modes):
        r = lmeval.evaluate(model, tok, ["autoao_facts"], **kwargs)
        accs[mode], n = r.metrics["autoao_facts"]["acc"], r.samples["autoao_facts"]
    return accs, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, action="append",
                    help="a glob of `autoao search` output folders (repeatable); a plan shipped by several "
                         "runs is scored once")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    args = ap.parse_args()
    modes = args.modes.split(",")
    t0 = time.perf_counter()
    bf16, tok = autoao.models.load("smollm2-135m")
    base, n = score(bf16, tok, modes)
    calib = profile(bf16, autoao.models.text_inputs(tok, seq_len=256)).calibration
    rows, scored = [], {}
    for run in sorted(Path(p) for pattern in args.runs for p in glob.glob(pattern)):
        if not (run / "summary.json").is_file():
            continue
        s = json.loads((run / "summary.json").read_text())
        plan = Plan.load(run / "plan.json")
        name = {"autoao-report": f"{run.parent.parent.name}/{run.parent.name}",
                "first": f"{run.parent.parent.name}/{run.parent.name} (first)"}.get(run.name, run.name)
        row = {"run": name, "layers": len(plan.layers), "max_drop": s["max_accuracy_drop"],
               "shipped_verdicts": [f"{v['status']}: {v['drop']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}] on {v['n']} "
                                    f"{v['unit']} ({v['judge']})" for v in s.get("verdicts", [])]}
        key = json.dumps(sorted((f, c.name) for f, c in plan.layers.items()))
        if key not in scored:
            scored[key] = (score(autoao.apply(copy.deepcopy(bf16), plan, calibration=calib), tok, modes)[0]
                           if plan.layers else base)
        acc = scored[key]
        row["acc"], row["drop"] = acc, {m: base[m] - acc[m] for m in modes}
        row["within"] = {m: row["drop"][m] <= s["max_accuracy_drop"] for m in modes}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = " ".join(f"--runs '{r}'" for r in args.runs)
    result = {"command": f"python benchmarks/rescore_demo.py {runs} --modes {args.modes} --out {args.out}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "bf16_acc": base, "documents": n, "rows": rows, "plans_scored": len(scored),
              "wall_s": round(time.perf_counter() - t0, 1)}
    (args.out / "rescore.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Shipped demo plans re-scored on all {n} autoao_facts documents", "",
             f"command: `{result['command']}`; date {result['date']}; torch {result['torch']}; bf16 acc "
             + ", ".join(f"{base[m]:.4f} ({m})" for m in modes), "",
             "| run | layers changed | " + " | ".join(f"drop ({m})" for m in modes) + " | within max drop (each) "
             "| verdicts it shipped on |", "|---|---|" + "---|" * len(modes) + "---|---|"]
    lines += [f"| {r['run']} | {r['layers']} | " + " | ".join(f"{r['drop'][m]:+.4f}" for m in modes) + " | "
              + ", ".join("yes" if r["within"][m] else "NO" for m in modes)
              + f" | {'; '.join(r['shipped_verdicts']) or 'the model as it came'} |" for r in rows]
    (args.out / "rescore.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
