"""The run files are typed and versioned: what autoao writes it reads back as the same records,
files of earlier autoao versions load (upgraded in memory), and a newer or broken file fails with
one clear error naming the file."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from autoao import decisions as D
from autoao.records import (RUN_FILES_VERSION, WorkloadTiming, AccuracySpec, DeviceInfo, FusedRecord, GroupRecord, KernelTimes,
                            LayerRecord, Latency, ModelInfo, RunContext, RunFileError, RunSummary, WeightBytes,
                            load_context, load_summary, write)
from autoao.types import Verdict

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "tests" / "fixtures" / "runs"  # run files earlier autoaos wrote, as they wrote them
OLD_RUNS = sorted(RUNS.glob("*-cpu/demo_search"))  # version 0: notes as prose
V1_RUN = RUNS / "2026-12-01-cpu" / "minilm-search-0.01"  # version 1: kind + numbers


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


def test_run_files_of_version_1_load_with_their_decisions_as_notes():
    """Version 1 wrote decisions as a kind and a dict of numbers: they load as notes in their words."""
    old = json.loads((V1_RUN / "summary.json").read_text())
    assert old["version"] == 1 and old["decisions"]
    summary = load_summary(V1_RUN / "summary.json")
    assert summary.version == RUN_FILES_VERSION and all(isinstance(d, D.Note) for d in summary.decisions)
    assert len(summary.decisions) == len(old["decisions"])
    (note,) = summary.notes
    assert note.startswith("kept unchanged (trial 2): ") and "rounds 5" in note and "plan_ms 2516.71" in note
    assert summary.verdicts == [] and summary.stages == []
    assert load_context(V1_RUN / "context.json").layers


_VERDICT = Verdict("holds", "proxy", 1, "top-1 agreement", "positions", 2048, 0.003, -0.001, 0.007, 0.01, 0.98, 0.977)

# one example of every decision kind; a new kind must be added here (the test below says so)
EXAMPLES = [
    D.Note("free text"),
    D.BusyCpu(2, 18.8, 0.55),
    D.HeldOutInputs(3, 512, 2048, "tokenizer text"),
    D.NoFeasiblePlan(),
    D.Judged(3, 1.5, 0.02, "holds", (_VERDICT,), 12.0),
    D.NoneHeld(4, 1),
    D.KeptUnchanged(1, 2.0, 1.9, 0.9, 1.02, 3, 0.96, 0.91),
    D.BestIsUnchanged(0),
    D.NothingToTry(12, "kernel timing", 80.0, 240.0),
    D.StudyClosed(3, 1.5, 0, 1, "coordinator@h:1 5, worker@h:2 4, worker@h:3 3"),
    D.ShippedOnEstimate(4, 2.5, "estimated from weight bytes"),
    D.Verified(7, "int8_wo x211", 1.62, 1.41, 4, 187.0, "uniform"),
    D.NotFaster(9, 1.55, 1.31, 3, 1.62),
    D.CheckDidNotFit(3, "int8_wo x211", 64.0, 21.0, 150.0),
    D.RunInterrupted("SIGINT", 201.0, "int8_wo x211, 1.62x"),
    D.Resumed("int8_wo x211", 1.62, 3),
]


def test_every_decision_kind_describes_itself_as_a_distinct_sentence(tmp_path):
    assert {type(d).kind for d in EXAMPLES} == set(D.DECISIONS), "add an example of the new decision kind"
    texts = [d.describe() for d in EXAMPLES]
    assert all(isinstance(t, str) and t for t in texts) and len(set(texts)) == len(texts)
    # each says its own numbers
    by_kind = dict(zip((type(d).kind for d in EXAMPLES), texts))
    assert by_kind["note"] == "free text"
    assert "trial 3" in by_kind["judged"] and "+0.0200" in by_kind["judged"] and "holds" in by_kind["judged"]
    assert "18.8 ms on 2 threads" in by_kind["busy_cpu"]
    assert "verified at 187 s" in by_kind["verified"] and "1.62x (at least 1.41x" in by_kind["verified"]
    assert "the best plan so far (1.62x)" in by_kind["not_faster"]
    assert "a budget of about 150 s" in by_kind["check_did_not_fit"] and "64 s" in by_kind["check_did_not_fit"]
    assert "SIGINT at 201 s" in by_kind["interrupted"]
    too_short = by_kind["nothing_to_try"]
    assert "kernel timing" in too_short and "80 s" in too_short and "about 240 s" in too_short
    assert "trial 4" in by_kind["shipped_on_estimate"] and "2.50x, is estimated from weight bytes" in by_kind["shipped_on_estimate"]
    # typed in the run files: each reads back as the same record, kind and numbers
    summary = RunSummary("cpu", "90 s", 1.0, 0, "", Latency(), None, Latency(), Latency(), None, 0.01, list(EXAMPLES),
                         "", "s", 0, None, WeightBytes(1, 1), [], [], {}, {}, [], {}, {})
    summary.workload = WorkloadTiming(10.0, 8.0, 1.25, 1.1, 1.2, 1.3, 5)
    write(tmp_path / "summary.json", summary)
    back = load_summary(tmp_path / "summary.json")
    assert back.decisions == EXAMPLES and back.workload == summary.workload


def test_an_unknown_decision_kind_names_the_close_ones():
    with pytest.raises(ValueError, match="unknown decision kind 'verifyed'. Did you mean: verified"):
        D.decision_type("verifyed")


def test_decisions_of_kinds_no_longer_made_read_back_as_notes_in_their_words(tmp_path):
    """A summary of an earlier autoao recorded kinds this one no longer makes (the re-rank, the
    bisection's choice): the report still reads it, each such decision a note with its fields."""
    summary = RunSummary("cpu", "90 s", 1.0, 0, "", Latency(), None, Latency(), Latency(), None, 0.01, [D.Note("kept")],
                         "", "s", 0, None, WeightBytes(1, 1), [], [], {}, {}, [], {}, {})
    write(tmp_path / "summary.json", summary)
    data = json.loads((tmp_path / "summary.json").read_text())
    data["decisions"] += [{"kind": "rerank_chose", "trial": 2, "measured_ms": 1.0, "pick": 0, "pick_measured_ms": 1.2,
                           "pick_predicted_ms": 0.9}, {"kind": "chose_slower", "trial": 4, "checked": 3}]
    (tmp_path / "summary.json").write_text(json.dumps(data))
    back = load_summary(tmp_path / "summary.json")
    assert [type(d) for d in back.decisions] == [D.Note, D.Note, D.Note]
    assert back.notes[1] == "rerank chose (trial 2): measured ms 1, pick 0, pick measured ms 1.2, pick predicted ms 0.9"
    assert back.notes[2] == "chose slower (trial 4): checked 3"
