"""A seeded search writes the same run files as it did before the code was reorganised: the plan,
the Pareto front, the summary's decisions, verdicts and speed-ups (timings faked as data, so only
the code decides). The expected files are tests/fixtures/seeded-run/, written by this test with
AUTOAO_WRITE_SEEDED_RUN=1 from the code they describe; what varies between runs on one machine
(seconds, dates, paths, versions, cache state) is left out of the comparison."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from torch import nn

FIXTURE = Path(__file__).parent / "fixtures" / "seeded-run"
FILES = ("plan.json", "pareto.json", "summary.json")
# keys whose values are clocks, places or versions; their presence still counts
VOLATILE = ("seconds", "_s", "started", "time", "elapsed", "duration", "wall", "versions", "command", "storage",
            "path", "cache", "host", "cpu", "device", "threads", "torch", "python", "ended", "date", "pid", "worker")

MACHINE = {"busy_cpu"}  # decisions that describe the machine's state during the run


def _stable(value, key: str = ""):
    """`value` with volatile keys' values replaced by their type's name and floats rounded."""
    if any(v in key.lower() for v in VOLATILE):
        return type(value).__name__
    if isinstance(value, dict):
        return {k: _stable(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_stable(v, key) for v in value]
    if isinstance(value, float):
        return value if not math.isfinite(value) else round(value, 6)
    return value


def _run(tmp_path: Path, monkeypatch) -> dict[str, object]:
    from autoao import api
    from autoao.stages import bench, measure
    from autoao.evaluators import harness
    from autoao.evaluators.timing import Timing
    from autoao.kernels import QuantizedLinear

    per_layer = {"bf16": 400.0, "int8_dyn": 100.0, "int8_wo": 150.0}
    monkeypatch.setattr(harness, "time_missing", lambda cand, kern, n, k, tokens, *a: {
        m: Timing(per_layer[cand.family] * (n * k) / 8192, 0.0, 0.0, 5) for m in tokens})

    def timing(model, examples, *a, **kw):
        quantized = sum(isinstance(m, QuantizedLinear) for m in model.modules())
        return (1000.0 - 150.0 * quantized,) * 3

    monkeypatch.setattr(bench, "forward_timing", timing)
    monkeypatch.setattr(measure, "forward_timing", timing)
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 64, bias=False), nn.ReLU(),
                          nn.Linear(64, 64, bias=False))
    api.optimize(model, [torch.randn(16, 64)], budget=8, candidates=["int8_dyn", "int8_wo"], max_accuracy_drop=0.05,
                 seed=3, out_dir=tmp_path / "out", progress=False)
    files = {name: json.loads((tmp_path / "out" / name).read_text()) for name in FILES}
    # what the machine was doing (another process on the CPU) is said, and is no part of the search
    files["summary.json"]["decisions"] = [d for d in files["summary.json"]["decisions"] if d["kind"] not in MACHINE]
    return {name: _stable(value) for name, value in files.items()}


def test_a_seeded_search_writes_the_run_files_it_wrote_before(tmp_path, monkeypatch):
    got = _run(tmp_path, monkeypatch)
    if os.environ.get("AUTOAO_WRITE_SEEDED_RUN"):
        FIXTURE.mkdir(parents=True, exist_ok=True)
        for name, value in got.items():
            (FIXTURE / name).write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    assert got["plan.json"]["layers"], "the seeded search ships a plan (a comparison of nothing proves nothing)"
    for name in FILES:
        expected = json.loads((FIXTURE / name).read_text())
        assert got[name] == expected, f"{name} differs from tests/fixtures/seeded-run/{name}"


def test_the_comparison_sees_a_changed_plan():
    expected = json.loads((FIXTURE / "plan.json").read_text())
    changed = json.loads(json.dumps(expected))
    fqn = next(iter(changed["layers"]))
    changed["layers"][fqn] = {"family": "bf16", "params": {}}
    assert changed != expected and _stable({"started": "x"}) == {"started": "str"}
