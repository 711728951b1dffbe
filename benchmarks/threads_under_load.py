"""How a busy neighbour distorts CPU timings at several threads, and why one thread survives it.

    python benchmarks/threads_under_load.py --out benchmarks/results/<date>-cpu/threads-under-load

Times one bf16 linear layer (autoao's demo shapes) at M=1 and M=256 on 1 and on all threads,
first as the machine is, then next to --hogs busy-loop processes (each stops by itself after
--seconds). Per sample it records the wall time and the run-queue delay of the process's threads
(autoao.clock.cpu_lost_ns: the same test autoao's timing uses to drop a sample), and prints the
median wall time, the clean samples and their median. Writes threads.md and threads.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from autoao.clock import LOST_FRACTION, cpu_lost_ns
from autoao.evaluators.timing import device_name


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def cell(m: int, k: int, n: int, threads: int, reps: int) -> dict:
    torch.set_num_threads(threads)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    for _ in range(5):
        F.linear(x, w)
    walls, clean = [], []
    for _ in range(reps):
        lost0 = cpu_lost_ns()
        t0 = time.perf_counter_ns()
        F.linear(x, w)
        wall = time.perf_counter_ns() - t0
        lost = cpu_lost_ns() - lost0
        walls.append(wall / 1e3)
        if lost <= LOST_FRACTION * wall:
            clean.append(wall / 1e3)
    return {"m": m, "k": k, "n": n, "threads": threads, "median_us": statistics.median(walls),
            "clean": len(clean), "reps": reps, "clean_median_us": statistics.median(clean) if clean else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-loop processes next to the timing")
    ap.add_argument("--seconds", type=float, default=60.0, help="each busy loop stops by itself after this")
    ap.add_argument("--reps", type=int, default=60)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    most = os.cpu_count() or 1
    shapes = [(1, 576, 1536), (256, 576, 1536)]
    rows = []
    for condition in ("as is", f"{args.hogs} busy loops"):
        hogs = []
        if condition != "as is":
            hogs = [mp.Process(target=spin, args=(args.seconds,), daemon=True) for _ in range(args.hogs)]
            for h in hogs:
                h.start()
            time.sleep(0.5)
        load = os.getloadavg()[0]
        try:
            for m, k, n in shapes:
                for threads in sorted({1, most}):
                    rows.append({"condition": condition, "load1": load, **cell(m, k, n, threads, args.reps)})
        finally:
            for h in hogs:
                h.terminate()
    lines = ["# bf16 linear timings on 1 and all threads, as is and next to busy loops", "",
             f"command: `python benchmarks/threads_under_load.py --out {args.out} --hogs {args.hogs}`",
             f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {device_name(torch.device('cpu'))}, "
             f"{most} cores ({platform.machine()}); torch {torch.__version__}",
             "load (1 min): the machine's load average when the condition started (other jobs included)", "",
             "| condition | load (1 min) | M | K x N | threads | median us (all samples) | clean samples | clean median us |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cm = "-" if r["clean_median_us"] is None else f"{r['clean_median_us']:.0f}"
        lines.append(f"| {r['condition']} | {r['load1']:.1f} | {r['m']} | {r['k']}x{r['n']} | {r['threads']} | "
                     f"{r['median_us']:.0f} | {r['clean']}/{r['reps']} | {cm} |")
    (args.out / "threads.md").write_text("\n".join(lines) + "\n")
    (args.out / "threads.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
