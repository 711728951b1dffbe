"""The run files are typed and versioned: what autoao writes it reads back as the same records,
files of earlier autoao versions load (upgraded in memory), and a newer or broken file fails with
one clear error naming the file."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from autoao.runfiles import (RUN_FILES_VERSION, AccuracySpec, Decision, DeviceInfo, FusedRecord, GroupRecord,
                             KernelTimes, LayerRecord, Latency, ModelInfo, RunContext, RunFileError, describe,
                             load_context, load_summary, write)

ROOT = Path(__file__).resolve().parent.parent
OLD_RUNS = sorted((ROOT / "benchmarks" / "results").glob("*-cpu/demo_search"))


def _context() -> RunContext:
    layer = LayerRecord("l0", 64, 32, 5, {1: 4, 256: 1}, {"bf16": 10.0, "int8_wo": math.inf}, {"fp8_wo": "emulated"},
                        {"int4_wo(group_size=64)": KernelTimes("triton", {"triton": 3.0, "tinygemm": 4.5})},
                        ["fp8_wo"], {"int8_wo": 41.5}, ["bf16", "int8_wo"], {"fp8_wo": "emulated on cpu"})
    return RunContext("2026-12-01T00:00:00+00:00", ModelInfo("Tiny", 100, 200, "bfloat16", 1), DeviceInfo("cpu", "x", "eager"),
                      {"autoao": "0.1.0", "triton": None}, "90 s", 0.01, 0, None,
                      AccuracySpec(2, ["autoao_facts"], None, {"accuracy": 0.5}, 0.66, {"autoao_facts/acc": 0.66}),
                      "sqlite:///x.db", "autoao-1", Latency(1.0, 1.2), 0.2, [], [GroupRecord("l0", ["l0"], ["bf16"])],
                      [FusedRecord(["l0"], {"bf16": 9.0})], [layer])


def test_a_written_context_reads_back_as_the_same_record(tmp_path):
    ctx = _context()
    write(tmp_path / "context.json", ctx)
    back = load_context(tmp_path / "context.json")
    assert back == ctx  # int dict keys, nested records, inf and None all survive
    assert back.layers[0].calls == {1: 4, 256: 1} and back.version == RUN_FILES_VERSION


@pytest.mark.parametrize("run", OLD_RUNS, ids=[p.parent.name for p in OLD_RUNS])
def test_run_files_of_an_earlier_autoao_still_load_and_render(run, tmp_path):
    """Untyped context.json / summary.json (notes as prose) load, and the report renders from them."""
    from autoao.reports import load, render

    ctx, summary = load_context(run / "context.json"), load_summary(run / "summary.json")
    assert ctx.model.class_name and ctx.layers and ctx.groups
    old = json.loads((run / "summary.json").read_text())
    assert summary.notes == old["notes"] and all(d.kind == "note" for d in summary.decisions)
    assert summary.baseline_ms_at_start == old["baseline_ms"].get("measured_at_start")
    out = tmp_path / "run"
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("report*"))
    data = load(out)
    assert data.finished and len(data.layers) == len(ctx.layers)
    assert "Search finished" in render(out).read_text()


def test_a_newer_or_broken_run_file_is_one_clear_error(tmp_path):
    path = tmp_path / "context.json"
    write(path, _context())
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "version": RUN_FILES_VERSION + 1}))
    with pytest.raises(RunFileError, match=r"context.json was written by a newer autoao"):
        load_context(path)
    del data["layers"][0]["calls"]
    path.write_text(json.dumps(data))
    with pytest.raises(RunFileError, match=r"RunContext.layers\[0\].calls is missing"):
        load_context(path)
    path.write_text("{not json")
    with pytest.raises(RunFileError, match="cannot read"):
        load_context(path)


def test_every_decision_kind_reads_as_a_sentence():
    cases = [Decision("no_feasible_plan"),
             Decision("tier2_rejected", 3, {"predicted_ms": 1.5, "drop": 0.02}, "lm-eval: autoao_facts"),
             Decision("tier2_chose_slower", 4, {"skipped": 2}), Decision("tier2_none_held", None, {"checked": 4}),
             Decision("rerank_chose", 2, {"measured_ms": 1.0, "pick": 0, "pick_measured_ms": 1.2, "pick_predicted_ms": 0.9}),
             Decision("rerank_kept", 0, {"measured_ms": 1.0, "band": 0.05, "margin": 0.03}, others={1: 1.01}),
             Decision("plan_unmeasurable", 5, reason="RuntimeError: x"),
             Decision("kept_unchanged", 1, {"plan_ms": 2.0, "baseline_ms": 1.9}), Decision("best_is_unchanged", 0),
             Decision("out_of_time", 2, {"checked": 1}, "more tier-2 checks"), Decision("note", reason="free text")]
    texts = [describe(d) for d in cases]
    assert all(texts) and len(set(texts)) == len(texts)
    assert "trial 3" in texts[1] and "+0.0200" in texts[1] and "1.20x faster than trial 0" in texts[4]
    assert texts[-1] == "free text"
