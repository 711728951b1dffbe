"""What does `autoao search --budget B` ship, and when, on a quiet machine and next to a busy one?

    python benchmarks/budget_bench.py --budgets 5m --runs 5 --loaded-runs 3 --out benchmarks/results/<date>-cpu/anytime
    python benchmarks/budget_bench.py --budgets default --then default,90s --runs 3 --loaded-runs 0 --out ...
    python benchmarks/budget_bench.py --budgets 90s --runs 1 --model minilm-l6 --out ...

Each run is the README's main job as a whole process: `autoao search` (plus `--budget B` unless B is
`default`, plus `--model M` if given), in a folder of its own whose default `--out` it writes, with
a fresh `AUTOAO_CACHE_DIR` (the built-in model's one-off conversion included, as on a fresh
machine). `--then B2,B3`: after each run, runs of those budgets on the same cache (timings and the
unmodified model's side of the judges warm), each in a folder of its own (rows `<run>-then-<i>`).
`--again`: after each run, the same command once more in the same folder: it continues from what the
first verified (row `<run>-again`; its files replace the first's, which are copied to `<run>/first/`). Loaded runs start a competing process that keeps
`--hog-cores` cores busy (whole cores spin, the fraction duty-cycles), stopped after the run.

Per run: wall time against the rule (budget + max(10%, 15 s)), whether a plan shipped, its measured
speed-up and 95% lower bound, the plan, its verdicts, the seconds spent verifying plans, and the
anytime curve (when each better plan was verified). The last line counts the runs that shipped.
Writes budget.md, budget.csv and each run's stdout/stderr and small run files under --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
KEEP = ("summary.json", "plan.json", "anytime.json", "pareto.json", "report_curve.csv", "report_stages.csv",
        "report_trials.csv", "report_verdicts.csv")  # the rest (the model, the page, the study) is rebuilt or large


def hog(duty: float, seconds: float) -> None:
    """Spin for `duty` of every 10 ms, for `seconds`."""
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.01 * duty:
            pass
        time.sleep(0.01 * (1 - duty))


def start_hogs(cores: float, seconds: float) -> list[mp.Process]:
    duties = [1.0] * int(cores) + ([cores - int(cores)] if cores > int(cores) else [])
    procs = [mp.Process(target=hog, args=(d, seconds), daemon=True) for d in duties]
    for p in procs:
        p.start()
    return procs


def seconds_of(budget: str) -> float:
    from autoao.types import Budget

    return Budget.parse("5m" if budget == "default" else budget).seconds or 0.0


def command(budget: str, model: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "autoao.cli", "search"]
    cmd += [] if budget == "default" else ["--budget", budget]
    return cmd + ([] if model is None else ["--model", model])


def run_one(budget: str, model: str | None, loaded: bool, folder: Path, cache: Path, hog_cores: float,
            clean: bool = True) -> dict:
    """One `autoao search` in `folder` on the cache `cache`; its row. `clean`: afterwards drop the run
    files not in KEEP (the saved model, the page, the study)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, AUTOAO_CACHE_DIR=str(cache))
    hogs = start_hogs(hog_cores, 4 * seconds_of(budget) + 120) if loaded else []
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command(budget, model), cwd=folder, env=env, capture_output=True, text=True)
    finally:
        for p in hogs:
            p.terminate()
    wall = time.perf_counter() - t0
    limit = seconds_of(budget) + max(0.1 * seconds_of(budget), 15.0)
    row = {"run": folder.name, "budget": budget, "loaded": loaded, "wall_s": round(wall, 1), "limit_s": limit,
           "within": wall <= limit, "rc": proc.returncode}
    (folder / "stdout.txt").write_text(proc.stdout)
    (folder / "stderr.txt").write_text(proc.stderr)
    out = folder / "autoao-report"
    if (out / "summary.json").is_file():
        row.update(summarize(json.loads((out / "summary.json").read_text())))
    if clean:
        drop_bulk(out)
    return row


def drop_bulk(out: Path) -> None:
    for f in out.glob("*"):
        if f.name not in KEEP:
            shutil.rmtree(f) if f.is_dir() else f.unlink()


def summarize(s: dict) -> dict:
    """A run's row from its summary.json."""
    counts: dict[str, int] = {}
    for cand in s["plan"].values():
        counts[cand] = counts.get(cand, 0) + 1
    stages = {x["name"]: x["spent_s"] for x in s.get("stages", [])}
    return {"shipped": bool(s["plan"]), "measured": round(s["speedup"]["measured"] or 1.0, 3),
            "bound": round(s.get("speedup_bound", 1.0), 3), "rounds": s.get("rounds", 0), "trials": s["trials"],
            "plan": ", ".join(f"{c} x{n}" for c, n in sorted(counts.items(), key=lambda cn: -cn[1])) or "unchanged",
            "verdicts": [f"{v['judge']} {v['status']} {v['drop']:+.4f} on {v['n']} {v['unit']}"
                         for v in s.get("verdicts", [])],
            "verifying_s": round(stages.get("verifying plans", 0.0), 1),
            "curve": [(p["seconds"], round(p["speedup"], 3)) for p in s.get("curve", [])],
            "decisions": [d["kind"] for d in s.get("decisions", [])], "device": s["device"],
            "stages": {k: round(v, 1) for k, v in stages.items()}}


def table(header: str, rows: list[dict]) -> str:
    lines = [header, "| run | machine | wall s | limit s | within | shipped | measured | at least (95%) | plan | "
             "verifying s | curve (s: x) | verdicts | decisions |", "|" + "---|" * 13]
    for r in rows:
        curve = " -> ".join(f"{s:.0f}: {x:.2f}" for s, x in r.get("curve", []))
        lines.append(f"| {r['run']} | {'loaded' if r['loaded'] else 'quiet'} | {r['wall_s']} | {r['limit_s']:.0f} | "
                     f"{'yes' if r['within'] else 'NO'} | {'yes' if r.get('shipped') else 'no'} | "
                     f"{r.get('measured', '-')} | {r.get('bound', '-')} | {r.get('plan', 'rc=' + str(r['rc']))} | "
                     f"{r.get('verifying_s', '-')} | {curve} | {'; '.join(r.get('verdicts', []))} | "
                     f"{', '.join(r.get('decisions', []))} |")
    for label, group in (("cold", [r for r in rows if "-then-" not in r["run"] and not r["run"].endswith("-again")]),
                         ("again", [r for r in rows if r["run"].endswith("-again")]),
                         *((f"then-{i}", [r for r in rows if r["run"].endswith(f"-then-{i}")]) for i in range(1, 9))):
        if group:
            lines.append(f"\n{label}: shipped a plan in {sum(bool(r.get('shipped')) for r in group)} of {len(group)} "
                         f"runs; within the wall-time rule: {sum(r['within'] for r in group)} of {len(group)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="default", help="comma-separated: 90s, 5m, ... or default (no --budget flag)")
    ap.add_argument("--runs", type=int, default=3, help="quiet runs per budget")
    ap.add_argument("--loaded-runs", type=int, default=None, help="loaded runs per budget (default: --runs)")
    ap.add_argument("--hog-cores", type=float, default=1.0, help="cores the competing process keeps busy")
    ap.add_argument("--model", default=None, help="--model for the search (default: the demo)")
    ap.add_argument("--then", default="", help="comma-separated budgets run after each run on its cache")
    ap.add_argument("--again", action="store_true", help="the same command again in the same folder after each run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    loaded_runs = args.runs if args.loaded_runs is None else args.loaded_runs
    header = (f"# autoao search: what a budget ships\n\ncommand: `python benchmarks/budget_bench.py "
              f"{' '.join(sys.argv[1:])}`\ndate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
              f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch "
              f"{torch.__version__}, python {platform.python_version()}\nrule: wall <= budget + max(10%, 15 s); "
              f"loaded = a competing process keeping {args.hog_cores:g} cores busy; each run on a fresh cache"
              f"{', then ' + args.then + ' on it' if args.then else ''}\n")
    rows: list[dict] = []
    for budget in args.budgets.split(","):
        plan = [(False, i) for i in range(args.runs)] + [(True, i) for i in range(loaded_runs)]
        for loaded, i in sorted(plan, key=lambda li: (li[1], li[0])):  # quiet and loaded alternate
            tag = f"{budget}-{'loaded' if loaded else 'quiet'}-{i}"
            cache = args.out / ".cache" / tag
            shutil.rmtree(cache, ignore_errors=True)
            rows.append(run_one(budget, args.model, loaded, args.out / tag, cache, args.hog_cores, clean=not args.again))
            if args.again:  # the first run's files kept apart, then the same command where it ran
                print(json.dumps(rows[-1]), flush=True)
                first = args.out / tag / "first"
                shutil.copytree(args.out / tag / "autoao-report", first)
                drop_bulk(first)
                for name in ("stdout.txt", "stderr.txt"):
                    shutil.copy(args.out / tag / name, first / name)
                rows.append({**run_one(budget, args.model, loaded, args.out / tag, cache, args.hog_cores),
                             "run": f"{tag}-again"})
            for j, then in enumerate(b for b in args.then.split(",") if b):
                print(json.dumps(rows[-1]), flush=True)
                rows.append(run_one(then, args.model, loaded, args.out / f"{tag}-then-{j + 1}", cache, args.hog_cores))
            shutil.rmtree(cache, ignore_errors=True)
            print(json.dumps(rows[-1]), flush=True)
            with open(args.out / "budget.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
                w.writeheader()
                w.writerows(rows)
            (args.out / "budget.md").write_text(table(header, rows))
    print("\n".join(line for line in table(header, rows).splitlines() if "shipped a plan in" in line))
    shutil.rmtree(args.out / ".cache", ignore_errors=True)


if __name__ == "__main__":
    main()
