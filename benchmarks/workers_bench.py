"""Trials per minute with 1, 2 and 3 processes on one study (a coordinator and N-1 `autoao worker`s).

    python benchmarks/workers_bench.py --processes 1,2,3 --trials 24 --trial-seconds 1 \
        --out benchmarks/results/<date>-cpu/workers

Each run is `autoao search --storage postgresql://... --workers N-1` as a whole process, on the
tests' one-block tiny model (tests/slow_models.py) whose proxy pass sleeps --trial-seconds, so a
trial costs about that: what is measured is the coordination (the shared storage, the sampler, the
heartbeat) and how many trials run at once, not compute (a 2-core machine has none to spare).
Without --storage a private PostgreSQL cluster is started (tests/pg_cluster.py) and stopped. Every
run has a fresh cache (a cached proxy result skips the sleep) and its own study.

Per run, from the study's trial timestamps: trials per minute over the whole search (from the first
trial's start to the last one's end: the workers' start-up included) and in the steady part (while
every process was running trials: from the last process's first start to the first process's last
end), and each process's trial count. Writes workers.json and workers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import PgCluster, why_missing  # noqa: E402

MODEL = str(ROOT / "tests" / "slow_models.py") + ":build"


def one_run(url: str, processes: int, trials: int, trial_seconds: float, candidates: str,
            device: str | None = None) -> dict:
    study = f"bench-{processes}-{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="autoao-workers-") as tmp:
        env = {**os.environ, "AUTOAO_CACHE_DIR": f"{tmp}/cache", "AUTOAO_TEST_TRIAL_SLEEP": str(trial_seconds)}
        cmd = [sys.executable, "-m", "autoao.cli", "search", "--model", MODEL, "--tasks", "none", "--candidates",
               candidates, "--budget", str(trials), "--storage", url, "--study", study, "--workers",
               str(processes - 1), "--heartbeat", "5", "--out", f"{tmp}/out", "--quiet",
               *(["--device", device] if device else [])]
        t0 = time.perf_counter()
        # from outside the checkout: its root holds autoao/ without the sub-packages an install maps in
        done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"run with {processes} processes failed:\n{done.stdout}\n{done.stderr}")
        summary = json.loads(Path(f"{tmp}/out/summary.json").read_text())
    frozen = [t for t in optuna.load_study(study_name=study, storage=url).trials if t.state.name == "COMPLETE"]
    by: dict[str, list] = {}
    for t in frozen:
        by.setdefault(t.user_attrs["worker"], []).append(t)
    start, end = min(t.datetime_start for t in frozen), max(t.datetime_complete for t in frozen)
    span = (end - start).total_seconds()
    steady_from = max(min(t.datetime_start for t in ts) for ts in by.values())
    steady_to = min(max(t.datetime_complete for t in ts) for ts in by.values())
    steady = [t for t in frozen if t.datetime_start >= steady_from and t.datetime_complete <= steady_to]
    steady_s = (steady_to - steady_from).total_seconds()
    return {"processes": processes, "processes_with_trials": len(by), "trials": len(frozen),
            "search_span_s": round(span, 2), "trials_per_min": round(60 * len(frozen) / span, 1),
            "steady_s": round(steady_s, 2), "steady_trials": len(steady),
            "steady_trials_per_min": round(60 * len(steady) / steady_s, 1) if steady_s > 0 and steady else None,
            "per_process": {w.split("@")[0] + "@" + w.rsplit(":", 1)[1]: len(ts) for w, ts in sorted(by.items())},
            "wall_s": round(wall, 1), "stage_seconds": {k: round(v, 1) for k, v in summary["stage_seconds"].items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", default="1,2,3", help="process counts to run (coordinator included)")
    ap.add_argument("--trials", type=int, default=24, help="the study's trial budget per run")
    ap.add_argument("--trial-seconds", type=float, default=1.0, help="what one trial's proxy pass sleeps")
    ap.add_argument("--candidates", default="int8_dyn,int4_wo(group_size=32)")
    ap.add_argument("--storage", default=None, help="a PostgreSQL URL (default: a private cluster)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: autoao's); on a one-GPU host every "
                    "process shares that GPU")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cluster = None
    if args.storage is None:
        if why_missing():
            raise SystemExit(why_missing())
        cluster = PgCluster.start()
    url = args.storage or cluster.url
    try:
        rows = [one_run(url, int(n), args.trials, args.trial_seconds, args.candidates, args.device)
                for n in args.processes.split(",")]
    finally:
        if cluster is not None:
            cluster.stop()
    import torch

    meta = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(), "versions": {"torch": torch.__version__, "optuna": optuna.__version__,
                                                           "python": platform.python_version()},
            "device": args.device or "autoao's default",
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        meta["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "workers.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=2) + "\n")
    lines = [f"# Trials per minute, 1 to {max(r['processes'] for r in rows)} processes on one study", "",
             f"`{meta['command']}`, {meta['date']}, {meta['cpu']} ({meta['cores']} cores), load average at the end "
             f"{', '.join(f'{v:.1f}' for v in meta['load_avg_at_end'])}; torch {meta['versions']['torch']}, optuna "
             f"{meta['versions']['optuna']}; device {meta['device']}" + (f" ({meta['gpu']}, one GPU shared by every "
             "process)" if meta["gpu"] and args.device and args.device.startswith("cuda") else "") + f". A trial is the tiny model's proxy pass plus a {args.trial_seconds:g} s "
             "sleep: this measures coordination and concurrency, not compute.", "",
             "| processes | trials | trials/min (whole search) | trials/min (all processes running) | per process | "
             "search stage s | wall s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['processes']} | {r['trials']} | {r['trials_per_min']} | {r['steady_trials_per_min']} "
                     f"({r['steady_trials']} trials in {r['steady_s']} s) | "
                     f"{', '.join(f'{w} {n}' for w, n in r['per_process'].items())} | "
                     f"{r['stage_seconds'].get('search trials')} | {r['wall_s']} |")
    (out / "workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
