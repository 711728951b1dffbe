"""Interruptible without loss: SIGINT or SIGTERM at any moment writes the best plan verified so far
(plan.json with its verdicts, the run files, the report) and exits 130 / 143 with one line saying
what was kept; the same command with the same --out continues from it. Run as users run it: the
`autoao search` command in a process of its own, on the tiny model of tests/tiny_models.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _search(out: Path, budget: str, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "autoao.cli", "search", "--model", str(ROOT / "tests" / "tiny_models.py") + ":build",
           "--tasks", "none", "--candidates", "int8_wo,int8_dyn", "--budget", budget, "--out", str(out)]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def _until(proc: subprocess.Popen, words: str, seconds: float = 300.0) -> list[str]:
    """stderr lines up to and including the first that holds `words` (the run still going)."""
    lines: list[str] = []
    end = time.time() + seconds
    assert proc.stderr is not None
    while time.time() < end:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if words in line:
            return lines
    raise AssertionError(f"{words!r} never said; stderr ended with: {''.join(lines[-10:])}")


def _stop(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_an_interrupted_run_keeps_its_verified_plan_and_the_same_command_continues_from_it(tmp_path):
    env = dict(os.environ, AUTOAO_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "run"
    first = _search(out, "10m", env)
    said = "".join(_until(first, "verified at"))  # the first better plan: SIGINT right after it
    code, err = _stop(first, signal.SIGINT)
    assert code == 130, err[-2000:]
    last = [ln for ln in err.splitlines() if ln.startswith("autoao: interrupted")]
    assert last and "kept" in last[-1] and "x, verified at" in last[-1], err[-2000:]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["layers"] and plan["metadata"]["verdicts"] and all(v["status"] == "holds"
                                                                  for v in plan["metadata"]["verdicts"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["speedup"]["measured"] > 1.0
    assert [p["source"] for p in summary["curve"]][0] == "start" and len(summary["curve"]) >= 2
    assert (out / "report.html").is_file() and "interrupted" in [d["kind"] for d in summary["decisions"]]
    state = json.loads((out / "anytime.json").read_text())
    assert state["incumbent"]["params"] and "verified" in said

    # the same command continues from the kept plan; a SIGTERM there keeps it too
    second = _search(out, "10m", env)
    said = "".join(_until(second, "continued from the earlier run's best plan"))
    code, err = _stop(second, signal.SIGTERM)
    assert code == 143, err[-2000:]
    again = json.loads((out / "plan.json").read_text())
    kept = {f: c for f, c in again["layers"].items()}
    assert kept == plan["layers"] or json.loads((out / "summary.json").read_text())["curve"][-1]["source"] != "resumed"
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["interrupted"] == "SIGTERM" and resumed["curve"][0]["source"] == "resumed"
    assert resumed["speedup"]["measured"] > 1.0 and resumed["verdicts"]


def test_a_run_interrupted_before_anything_was_measured_says_so_and_writes_nothing(tmp_path):
    env = dict(os.environ, AUTOAO_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "run"
    proc = _search(out, "10m", env)
    _until(proc, "profiling")
    code, err = _stop(proc, signal.SIGINT)
    assert code == 130 and "kept nothing" in err.splitlines()[-1], err[-2000:]
    assert not (out / "plan.json").exists()
