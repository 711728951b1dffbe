"""The HTML report: read from the run files through autoao.records, rendered, re-rendered, and read
by a browser.

Two kinds of runs feed it:
- a real (tiny) search, once for the module (about 15 s on 2 CPU cores): a 6-layer model whose
  ModuleDict has a layer named `<script>alert(1)</script>` (module names are user data), a user
  metric (tier 2) and a candidate that is only emulated on the CPU;
- synthetic runs written from records built here (`write_run`): the cases a real run on this
  machine cannot be made to produce on demand (a busy machine, a screen wider than the budget, a
  stage far over its plan, a budget too short to try a plan), one browser test per report defect.

The browser tests need Debian's `chromium` (.ci/run installs it) and skip without it; their
screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import torch
from torch import nn

from autoao.cli import main as cli_main
from autoao.decisions import BusyCpu, Judged, NothingToTry, RunInterrupted
from autoao.records import (AccuracySpec, CandidateRecord, CurvePoint, DeviceInfo, GroupRecord, LayerRecord, Latency,
                            ModelInfo, RunContext, RunSummary, StageTime, TimingHealth, TrialRecord, WeightBytes, write)
from autoao.reports import ReportError, load, render
from autoao.reports.tables import TABLES
from autoao.types import Accuracy, Verdict

EVIL = "<script>alert(1)</script>"
CANDIDATES = ["bf16", "int8_dyn", "int4_wo(group_size=64)", "int4_wo(group_size=128)", "sparse24"]
ARTIFACTS = Path(__file__).parent / "artifacts"
ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "tests" / "fixtures" / "runs" / "2026-11-30-cpu" / "demo_search"  # the demo's 211 layers, as run then


def _keep(*shots: Path) -> None:
    """Copy screenshots to tests/artifacts/ (build output, never committed)."""
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / ".gitignore").write_text("*\n")
    for f in shots:
        shutil.copy(f, ARTIFACTS / f.name)


##### a real search ##############################################################################

class SlowLinear(nn.Linear):
    """An nn.Linear that also waits 2 ms a call: the model as it came is then measurably slower end
    to end than any plan that swaps its layers, on a quiet or a busy CPU alike (the layers autoao
    times per shape are plain nn.Linear, so the search itself is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return super().forward(x)


class Tiny(nn.Module):
    """Gated MLP blocks on float inputs (the proxy is then 1 - relative output error, which
    quantization moves smoothly). Two weight shapes only, to keep the kernel timing short."""

    def __init__(self, d: int = 64, h: int = 128, n: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"up_proj": SlowLinear(d, h, bias=False), EVIL: SlowLinear(d, h, bias=False),
                           "down_proj": SlowLinear(h, d, bias=False)}) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, d]
        for b in self.blocks:
            x = x + b["down_proj"](torch.relu(b["up_proj"](x)) * torch.sigmoid(b[EVIL](x)))
        return x


def _run(model: nn.Module, examples: list, out: Path, hooks_kw: dict, **kw):
    """optimize() with the command line's hooks (the command it records, the candidates it leaves out)."""
    from autoao.api import run_stages
    from autoao.options import Options, RunHooks

    opts = dict(budget=20, accuracy=None, tokenizer=None, max_accuracy_drop=0.01, candidates=None, eval_inputs=None,
                storage=None, out_dir=out, seed=0, progress=False)
    opts.update(kw)
    return run_stages(model, examples, Options.check(**opts), RunHooks(**hooks_kw))


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """(out_dir, optimize result, snapshot dir holding the report rendered right after the search)."""
    tmp = tmp_path_factory.mktemp("report")
    torch.manual_seed(0)
    model = Tiny().to(torch.bfloat16)
    # two calls of one shape: every candidate is timed at one token count (the timing dominates the setup)
    examples = [torch.randn(1, 32, 64, dtype=torch.bfloat16) for _ in range(2)]
    probe = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        reference = model(probe).float()

    def output_match(m: nn.Module) -> float:
        with torch.no_grad():
            return 1.0 - ((m(probe).float() - reference).norm() / reference.norm()).item()

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOAO_CACHE_DIR", str(tmp / "cache"))
        result = _run(model, examples, tmp / "out", {"command": "python tiny_search.py"}, accuracy=output_match,
                      eval_inputs=[torch.randn(2, 16, 64, dtype=torch.bfloat16)], max_accuracy_drop=0.03,
                      candidates=CANDIDATES)
    first = tmp / "first"
    first.mkdir()
    for f in result.report_path.parent.glob("report*"):
        shutil.copy(f, first / f.name)
    return result.out_dir, result, first


def test_loader_reads_the_finished_search(search):
    out, result, _ = search
    data = load(out)
    s = data.summary
    assert data.finished and s is not None and data.status == "finished"
    assert s.speedup_bound <= s.speedup.measured and s.rounds >= 3
    assert [lay.fqn for lay in data.layers] == [f"blocks.{i}.{n}" for i in range(2) for n in ("up_proj", EVIL, "down_proj")]
    assert {f: c for f, c in data.shown.plan.items() if c != "bf16"} == {f: c.name for f, c in result.plan.layers.items()}
    assert data.shown.trial == result.plan.metadata.get("trial")
    assert len(data.completed) == 20
    assert [r.trial for r in data.front] == [p.trial for p in result.pareto]  # the search's own front, fastest first
    # feasibility is the search's, read from the trial records; the shipped plan's verdicts are the summary's
    assert {t.number: t.feasible for t in data.trials} == {t.number: t.feasible for t in map(TrialRecord.read,
                                                                                             result.study.trials)}
    assert s.verdicts and s.verdict is not None and s.verdict.holds
    # it started from the model as it came and verified at least one better plan, each in its turn
    assert s.curve[0].source == "start" and s.curve[0].speedup == 1.0 and len(s.curve) >= 2 and not s.interrupted
    assert [p.seconds for p in s.curve] == sorted(p.seconds for p in s.curve) and s.curve[-1].seconds <= s.seconds
    # the stages tile the run
    assert [st.name for st in data.stages] == ["profile and baselines", "kernel timing", "layer errors",
                                               "search trials", "verifying plans", "final measurement"]
    assert sum(st.spent_s for st in data.stages) == pytest.approx(s.seconds, rel=0.05, abs=0.1)
    # tier 2 here is the user metric, and every metric row says what it measures
    assert {a.tier for a in data.metrics} == {1, 2}
    assert any(a.metric == "output_match" and a.source == "user metric: output_match" for a in data.metrics)
    assert len({a.description for a in data.metrics}) == len(data.metrics)


def test_every_layer_explains_every_candidate(search):
    data = load(search[0])
    for lay in data.layers:
        assert lay.pick.status == "chosen" and lay.pick.candidate == lay.chosen
        assert {c.candidate for c in lay.choices} == set(CANDIDATES)
        for c in lay.choices[1:]:
            assert c.reason.startswith(("excluded: ", "slower", "faster, less accurate",
                                        "faster, not shown less accurate")), c
        if "every faster candidate is less accurate" in lay.why:  # the reasons agree with the decision
            assert all(c.reason == "faster, less accurate" for c in lay.choices if c.reason.startswith("faster"))
        sparse = next(c for c in lay.choices if c.candidate == "sparse24")
        assert sparse.emulated and sparse.status == "excluded" and "emulated on cpu" in sparse.reason
        assert sparse.time_us is None  # never picked here (allow_emulated is off), so never timed
    # in_features 64 is not a multiple of 128: that int4 variant is excluded with the reason
    up = next(lay for lay in data.layers if lay.fqn == "blocks.0.up_proj")
    g128 = next(c for c in up.choices if c.candidate == "int4_wo(group_size=128)")
    assert g128.status == "excluded" and "multiple of group size 128" in g128.reason
    # every layer is in exactly one pattern, whose members share its decision and reasons
    assert sorted(lay.fqn for p in data.patterns for lay in p.layers) == sorted(lay.fqn for lay in data.layers)
    assert all(lay.key == p.layers[0].key for p in data.patterns for lay in p.layers)


def test_rerendering_from_disk_gives_the_same_report_and_tables(search, capsys):
    """`autoao report DIR` later = the report written right after the search, byte for byte."""
    out, _, first = search
    assert cli_main(["report", str(out)]) == 0
    assert "report.html" in capsys.readouterr().out
    for name in ["report.html", *(f"report_{t}.csv" for t in TABLES)]:
        assert (out / name).read_bytes() == (first / name).read_bytes(), name


def test_csv_tables_hold_the_study(search):
    import pandas as pd

    out, result, first = search
    trials = pd.read_csv(first / "report_trials.csv")
    study = {t.number: t for t in result.study.trials}
    assert list(trials.trial) == sorted(study)
    for row in trials.itertuples():
        t = study[row.trial]
        assert row.state == t.state.name and row.feasible == TrialRecord.read(t).feasible
        if t.values:
            assert math.isclose(row.predicted_ms, t.values[0] / 1e3)
    layers = pd.read_csv(first / "report_layers.csv")
    assert list(layers.fqn).count(f"blocks.0.{EVIL}") == 1
    assert (layers.chosen != "sparse24").all()
    summary = pd.read_csv(first / "report_summary.csv").set_index("item")["value"]
    assert summary["seconds by stage"].startswith("profile and baselines ")
    assert summary["verdict"].startswith("holds: ")
    verdicts = pd.read_csv(first / "report_verdicts.csv")
    assert set(verdicts.plan) == {"shipped", "judged"} and (verdicts.n > 0).all()
    curve = pd.read_csv(first / "report_curve.csv")
    assert list(curve.trial.iloc[1:]) == [p.trial for p in result.summary.curve[1:]]  # one row per point
    assert len(curve) == len(result.summary.curve) and math.isnan(curve.trial.iloc[0])
    cands = pd.read_csv(first / "report_candidates.csv").set_index("candidate")
    assert cands.loc["sparse24", "status"] == "emulated"
    assert cands.loc["int4_wo(group_size=128)", "status"] == "partly available"


def test_layer_names_are_escaped(search):
    html = (search[2] / "report.html").read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_interrupted_search_shows_what_is_known_and_says_so(search, tmp_path):
    """No summary.json (killed before the end), a trial cut off mid-run and one still queued."""
    out = tmp_path / "killed"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("summary.json", "plan.json", "pareto.json",
                                                                   "model", "report*"))
    ctx = json.loads((out / "context.json").read_text())
    study = optuna.load_study(study_name=ctx["study_name"], storage=f"sqlite:///{out / 'study.db'}")
    study.ask()  # RUNNING forever, as a SIGKILL leaves it
    study.enqueue_trial({})  # WAITING
    data = load(out)
    assert not data.finished and data.status == "running"
    assert data.state_counts() == {"COMPLETE": 20, "RUNNING": 1, "WAITING": 1}
    # the plan shown is the search's best so far, which it also wrote to best_plan.json
    best = json.loads((out / "best_plan.json").read_text())
    assert {f for f, c in data.shown.plan.items() if c != "bf16"} == set(best["layers"])
    assert data.shown.trial == best["metadata"]["trial"]
    html = render(out).read_text()
    assert "This search has not finished" in html and "1 running or cut off" in html and "1 queued" in html
    assert "20 trials finished" in html and "not measured" in html
    assert 'data-status="running"' in html
    assert load(search[0]).state_counts() == {"COMPLETE": 20}  # the original reports its own study


def test_unreadable_study_still_reports_the_rest(search, tmp_path):
    """Storage gone (e.g. a database server that is down): say so, show the front from pareto.json."""
    out = tmp_path / "lost"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("study.db", "report*"))
    ctx = json.loads((out / "context.json").read_text())
    ctx["storage"] = f"sqlite:///{tmp_path / 'elsewhere' / 'gone.db'}"
    (out / "context.json").write_text(json.dumps(ctx))
    data = load(out)
    assert data.trials == () and any("study could not be read" in w for w in data.warnings)
    assert [r.trial for r in data.front] == [p.trial for p in search[1].pareto]
    assert "study could not be read" in render(out).read_text()
    assert not (tmp_path / "elsewhere").exists()  # reading never creates a storage


def test_not_a_search_directory_is_one_clear_line(tmp_path, capsys):
    with pytest.raises(ReportError, match="not an autoao search directory"):
        render(tmp_path)
    assert cli_main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoao: error: ") and "not an autoao search directory" in err and "\n" not in err


def test_importing_the_report_package_stays_light():
    code = ("import sys, autoao, autoao.reports; "
            "print(sorted(m for m in ('jinja2', 'matplotlib', 'pandas', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_reports_read_only_the_run_records():
    """reports/ imports autoao's leaf modules and nothing of the stages that produce the run."""
    import ast

    allowed = {"autoao.common", "autoao.records", "autoao.decisions", "autoao.types"}
    for path in (ROOT / "reports").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autoao"):
                assert node.module in allowed or node.module.startswith("autoao.reports"), (path.name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("autoao") for a in node.names), path.name


def test_report_in_headless_chromium(search, tmp_path, capsys):
    """What a person sees: the key sections and numbers in the rendered DOM, no console error, no
    request beyond the file itself, no script (the evil layer name is text), a readable screenshot
    at a laptop's width (saved to tests/artifacts/)."""
    from headless import Browser

    out, result, first = search
    s = result.summary
    shot, full = tmp_path / "report.png", tmp_path / "report-full.png"
    with Browser() as browser:
        page = browser.open(first / "report.html", width=1366, height=900, screenshot=shot, full_page=full)
        n_scripts = browser.evaluate("document.querySelectorAll('script').length")
        overflow = browser.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        svg_text = browser.evaluate("[...document.querySelectorAll('svg text')].map(t => t.textContent).join('|')")
        layer_cells = browser.evaluate("[...document.querySelectorAll('#layers-table tr[data-fqn]')]"
                                       ".map(r => r.cells[0].textContent)")
        card = browser.evaluate("document.querySelector('#card-measured').innerText")
        verdict = browser.evaluate("document.querySelector('#verdicts-table tbody tr').innerText")
    _keep(shot, full)
    with capsys.disabled():
        print(f"\nreport screenshots: {shot} {full} (copied to {ARTIFACTS}/)")

    assert page.errors == [] and page.dialogs == []
    assert page.requests == [(first / "report.html").resolve().as_uri()]  # self-contained
    assert n_scripts == 0 and overflow <= 0
    text = page.dom_text
    for heading in ("Summary", "Accuracy: the verdicts", "Pareto front", "Search history", "Where the time went",
                    "Layers: what each got and why", "Candidates on this device", "Reproduce"):
        assert heading in text
    assert "Search finished" in text
    assert f"{s.speedup.measured:.2f}×" in card and f"{s.baseline_ms.measured:.3g} ms" in card
    assert f"{s.speedup.predicted:.2f}×" in text
    v = s.verdict
    assert v.status in verdict and f"{v.drop:+.4f}" in verdict and v.metric in verdict and str(v.n) in verdict
    assert "tier 2 · user metric" in text and "tier 1 · proxy" in text
    assert sorted(layer_cells) == sorted(lay.fqn for lay in load(out).layers)  # the evil name reads as text
    assert f"blocks.0.{EVIL}" in layer_cells
    assert "python tiny_search.py" in text and str(out) in text
    for label in ("predicted latency (ms)", "accuracy drop on the screen (tier 1)", "trial",
                  "best predicted latency (ms)", "seconds since the trials began", "seconds since the run began"):
        assert label in svg_text.split("|"), label
    assert shot.stat().st_size > 10_000


def test_browser_check_catches_console_errors(tmp_path):
    """The detector itself: a page that logs an error, throws and misses an image is caught."""
    from headless import Browser

    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>bad</p><img src='missing.png'>"
                   "<script>console.error('boom'); throw new Error('kaput')</script></body></html>")
    with Browser() as browser:
        page = browser.open(bad)
    joined = "\n".join(page.errors)
    assert "console.error: boom" in joined and "kaput" in joined and "missing.png" in joined


def test_kernel_choices_reach_the_report(search, tmp_path):
    """Where timing chose among a candidate's kernels (LayerRecord.kernels), the layer's row names
    the kernel and how much slower the others were; failed kernels say so."""
    out = tmp_path / "kernels"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("report*"))
    ctx = json.loads((out / "context.json").read_text())
    lay = ctx["layers"][0]
    chosen = load(search[0]).layers[0].chosen
    other = next(c for c in lay["time_us"] if c != chosen)
    lay["kernels"] = {chosen: {"chosen": "triton", "us": {"tinygemm": 15.0, "triton": 10.0}},
                      other: {"chosen": "triton", "us": {"tinygemm": math.inf, "triton": 4.0}}}
    (out / "context.json").write_text(json.dumps(ctx))  # inf as Infinity, as autoao writes it
    summary = json.loads((out / "summary.json").read_text())
    summary["kernels"][lay["fqn"]] = "triton"  # the kernel the shipped plan runs on that layer
    (out / "summary.json").write_text(json.dumps(summary))
    layer = next(x for x in load(out).layers if x.fqn == lay["fqn"])
    by_name = {c.candidate: c for c in layer.choices}
    assert (by_name[chosen].kernel, by_name[chosen].kernel_note) == ("triton", "triton; tinygemm 1.50x slower")
    assert by_name[other].kernel_note == "triton; tinygemm failed"
    assert all(c.kernel is None for n, c in by_name.items() if n not in (chosen, other))
    html = render(out).read_text()
    assert 'title="kernel chosen by timing: triton; tinygemm 1.50x slower">triton</span>' in html


def test_the_baseline_is_named_by_the_dtype_the_model_came_in(search, tmp_path):
    out = tmp_path / "fp32"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("report*"))
    html = render(out).read_text()
    assert "vs bf16, end to end" in html and "Measurements, bf16 vs the plan" in html
    ctx = json.loads((out / "context.json").read_text())
    ctx["model"]["dtype"] = "float32"
    (out / "context.json").write_text(json.dumps(ctx))
    html = render(out).read_text()
    assert "vs float32, end to end" in html and "Measurements, float32 vs the plan" in html
    assert "vs bf16" not in html and "float32 time" in html


@pytest.mark.parametrize("status", ["finished", "unchanged", "no_trials", "interrupted"])
def test_status_box_and_cards_tell_what_happened(search, tmp_path, status):
    """In a browser, for each way a run can end: the status box names it, and the cards hold the
    summary.json numbers (an unchanged model is 1.00x, with the reason, and nothing to judge)."""
    from headless import Browser

    out = tmp_path / status
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("report*"))
    summary = json.loads((out / "summary.json").read_text())
    if status in ("unchanged", "no_trials"):
        base = summary["baseline_ms"]["measured"]
        summary.update(plan={}, kernels={}, fusions=[], accuracy=None, verdicts=[], rounds=0, speedup_range=[1.0, 1.0],
                       plan_ms={"predicted": summary["baseline_ms"]["predicted"], "measured": base},
                       speedup={"predicted": 1.0, "measured": 1.0})
        summary["decisions"].append({"kind": "kept_unchanged", "trial": 3, "plan_ms": base * 1.01, "baseline_ms": base,
                                     "low": 0.97, "high": 1.02, "rounds": 3})
    if status == "no_trials":
        summary.update(trials=0, decisions=[])
    if status == "interrupted":
        summary["interrupted"] = "SIGINT"
        summary["decisions"].append({"kind": "interrupted", "signal": "SIGINT", "at_s": 201.0, "kept": "a plan"})
    (out / "summary.json").write_text(json.dumps(summary))
    with Browser() as browser:
        page = browser.open(render(out), width=1366, height=900)
        box = browser.evaluate("document.querySelector('#status').dataset.status + '|' + "
                               "document.querySelector('#status').innerText")
        card = browser.evaluate("document.querySelector('#card-measured').innerText")
        accuracy = browser.evaluate("document.querySelector('#card-accuracy').innerText")
        why = browser.evaluate("document.querySelector('#layers-table tr.pattern').innerText")
    kind, text = box.split("|", 1)
    assert kind == status
    expected = {"finished": "Search finished", "unchanged": "the model was kept as it came",
                "no_trials": "Stopped by the budget before the first trial", "interrupted": "Interrupted by SIGINT at 201 s"}
    assert expected[status] in text
    assert ("applied and measured end to end" in text) == (status == "finished")
    assert f"{summary['speedup']['measured']:.2f}×" in card
    if status in ("unchanged", "no_trials"):
        assert "nothing to judge" in accuracy and "drop" not in accuracy  # no "drop 0.0" without evidence
        # a zero drop appears only as a trial's measurement, with the positions or rows behind it
        assert all(re.match(r"\s*on [\d,]+ ", after) for after in re.findall(r"\+0\.0000(.{0,20})", page.dom_text,
                                                                                 flags=re.S))
    if status == "interrupted":
        assert f"the best verified by then (it holds on every judge and ran {summary['speedup']['measured']:.2f}×" in text
    if status == "unchanged":
        assert "no measurable change" in text and "0.97x to 1.02x over 3 interleaved rounds" in text
        assert "1.00×" in card and "kept as it came with the whole model" in why
        assert "spent the accuracy budget" not in why
    if status == "no_trials":
        assert "budget ran out before the first trial" in why


def test_the_report_names_left_out_candidates_and_a_4_bit_weight_grid(tmp_path, monkeypatch):
    """A model whose weights sit on a 4-bit group-32 grid is flagged up front, and a candidate the
    caller left out is listed with its reason."""
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
    with torch.no_grad():  # an affine 4-bit grid per 32 input columns, as GGUF Q4_1 leaves it
        g = model[0].weight.float().reshape(64, 2, 32)
        lo, step = g.amin(-1, keepdim=True), (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
        model[0].weight.copy_((((g - lo) / step).round() * step + lo).reshape(64, 64))
    why = "its weights were a 4-bit grid of groups of 32"
    _run(model, [torch.randn(4, 64, dtype=torch.bfloat16)], tmp_path / "o", {"left_out": {"int4_wo(group_size=32)": why}},
         budget=2, candidates=["int8_wo"])
    data = load(tmp_path / "o")
    assert data.context.int4_grid_layers == 1
    assert any("sit on a 4-bit grid of groups of 32" in w and "left out of this search" in w for w in data.warnings)
    row = next(c for c, _ in data.candidates if c.name == "int4_wo(group_size=32)")
    assert row.status == "left out" and row.reasons == [why]
    html = (tmp_path / "o" / "report.html").read_text()
    assert "left out" in html and why in html


##### synthetic runs: one browser test per report defect ##########################################

STARTED = "2026-12-01T09:00:00+00:00"  # the command's start, as RunContext records it
SYN = ["bf16", "int8_wo", "int4_wo(group_size=64)"]
KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")
SHIPPED = {"qkv": "int8_wo", "o_proj": "bf16", "up_proj": "int8_wo", "down_proj": "int4_wo(group_size=64)"}
# (trial, choices by kind, predicted ms, screen drop): the screen is 0.05, the tier-2 budget 0.01
TRIALS = [(0, dict.fromkeys(SHIPPED, "bf16"), 1.20, 0.0), (1, dict.fromkeys(SHIPPED, "int8_wo"), 0.95, 0.004),
          (2, dict.fromkeys(SHIPPED, "int4_wo(group_size=64)"), 0.70, 0.12), (3, SHIPPED, 0.88, 0.02),
          (4, {**SHIPPED, "o_proj": "int4_wo(group_size=64)"}, 0.80, 0.045),
          (5, {**SHIPPED, "qkv": "int4_wo(group_size=64)"}, 0.78, 0.06), (6, {**SHIPPED, "up_proj": "bf16"}, 0.93, 0.03),
          (7, {**SHIPPED, "down_proj": "int8_wo"}, 0.91, 0.015), (8, {**SHIPPED, "o_proj": "int8_wo"}, 0.86, 0.035)]


def _verdict(status: str, judge: str = "lm-eval", drop: float = 0.002, half: float = 0.007, n: int = 300) -> Verdict:
    tier, metric, unit, pop = ((2, "autoao_facts acc", "documents", 372) if judge == "lm-eval" else
                               (1, "greedy agreement", "tokens", None))
    return Verdict(status, judge, tier, metric, unit, n, drop, drop - half, drop + half, 0.01, 0.66, 0.66 - drop, pop)


def _context(out: Path, *, tier: int = 2, blocks: int = 4, baseline_tier1: dict | None = None) -> RunContext:
    layers, groups = [], []
    for b in range(blocks):
        for kind in KINDS:
            fqn = f"model.layers.{b}.{kind}"
            layers.append(LayerRecord(fqn, 64, 64, 32, {32: 1}, {"bf16": 50.0, "int8_wo": 35.0, SYN[2]: 25.0}, {}, {},
                                      [], {"bf16": math.inf, "int8_wo": 40.0 + b, SYN[2]: 20.0 + b}, list(SYN), {}))
        groups.append(GroupRecord(f"model.layers.{b}.{{q_proj,k_proj,v_proj}}",
                                  [f"model.layers.{b}.{k}" for k in KINDS[:3]], list(SYN)))
        groups += [GroupRecord(f"model.layers.{b}.{k}", [f"model.layers.{b}.{k}"], list(SYN)) for k in KINDS[3:]]
    proxy = {"accuracy": 1.0, "rel_error": 0.0} if baseline_tier1 is None else baseline_tier1
    spec = AccuracySpec(tier, ["autoao_facts"] if tier == 2 else None, None, proxy, 0.66 if tier == 2 else None,
                        {"autoao_facts/acc": 0.66} if tier == 2 else {}, proxy="1 - the mean relative L2 error",
                        held_out="256 held-out rows of inputs like the examples")
    return RunContext(STARTED, ModelInfo("TinyLM", 10_000, 20_000, "bfloat16", len(layers)),
                      DeviceInfo("cpu", "Test CPU (2 threads)", "eager"), {"autoao": "0.1.0"}, "300 s", 0.01, 0,
                      "autoao search --budget 5m", spec, f"sqlite:///{out / 'study.db'}", "autoao-synthetic",
                      Latency(1.2, 1.25), 0.2, [CandidateRecord(c, f"{c} weights", "available", len(layers)) for c in SYN],
                      groups, [], layers, TimingHealth(cells=24), screen_drop=0.05 if tier == 2 else None)


def _params(ctx: RunContext, by_kind: dict[str, str]) -> dict[str, str]:
    return {g.name: by_kind["qkv" if "{" in g.name else g.name.rpartition(".")[2]] for g in ctx.groups}


def _summary(ctx: RunContext, **changes) -> RunSummary:
    plan = {f: c for g in ctx.groups for f in g.fqns if (c := _params(ctx, SHIPPED)[g.name]) != "bf16"}
    judged = [Judged(4, 0.80, 0.045, "breaks", (_verdict("breaks", drop=0.02),), 12.0),
              Judged(3, 0.88, 0.02, "holds", (_verdict("holds"), _verdict("holds", "generation", 0.01, 0.02, 512)), 9.0)]
    stages = [StageTime("profile and baselines", 20.0), StageTime("kernel timing", 60.0, 80.0),
              StageTime("layer errors", 10.0, 20.0), StageTime("search trials", 100.0, 110.0),
              StageTime("verifying plans", 45.0, 65.0), StageTime("final measurement", 15.0, 20.0)]
    s = RunSummary("Test CPU (2 threads)", "300 s", 250.0, len(TRIALS), "budget spent", Latency(1.2, 1.25), 1.24,
                   Latency(0.88, 0.9), Latency(1.36, 1.39), Accuracy(2, 0.658, 0.002, {}, "lm-eval: autoao_facts",
                                                                     judged[1].verdicts[0]),
                   0.01, judged, ctx.storage, ctx.study_name, 0, ctx.command,
                   WeightBytes(20_000, 12_000), [], [], plan, {}, [], {st.name: st.spent_s for st in stages}, {},
                   speedup_range=[1.31, 1.45], rounds=5, speedup_bound=1.33, verdicts=list(judged[1].verdicts),
                   stages=stages)
    return replace(s, **changes)


def write_run(out: Path, ctx: RunContext, summary: RunSummary | None, trials=TRIALS) -> Path:
    """A run directory as autoao writes it: context.json, the study's trial records, summary.json."""
    out.mkdir(parents=True, exist_ok=True)
    write(out / "context.json", ctx)
    if summary is not None:
        write(out / "summary.json", summary)
    screen = ctx.screen_drop if ctx.screen_drop is not None else ctx.max_accuracy_drop
    study = optuna.create_study(storage=ctx.storage, study_name=ctx.study_name, directions=["minimize", "minimize"])
    for number, by_kind, ms, drop in trials:
        params = _params(ctx, by_kind)
        acc = Accuracy(1, 1 - drop, drop, {"accuracy": 1 - drop, "rel_error": drop, "kl": drop / 2, "next_token": 0.35,
                                           "loss": 3.3 + drop, "agreement": 1 - drop},
                       "proxy", Verdict("holds" if drop <= screen else "breaks", "proxy", 1, "top-1 agreement",
                                        "positions", 1024, drop, drop - 0.01, drop + 0.01, screen))
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={g: optuna.distributions.CategoricalDistribution(SYN) for g in params},
            values=[ms * 1e3, drop], user_attrs={TrialRecord.ATTR: TrialRecord.attrs(acc, drop <= screen, 2.0 * number)}))
    return out


def _open(path: Path, tmp_path: Path, name: str, **evaluate: str) -> tuple:
    """Render `path`, open it at 1366 px, keep a full-page screenshot; (page, height, {name: value})."""
    from headless import Browser

    shot = tmp_path / f"{name}.png"
    with Browser() as browser:
        page = browser.open(render(path), width=1366, height=900, full_page=shot)
        height = browser.evaluate("document.documentElement.scrollHeight")
        values = {k: browser.evaluate(js) for k, js in evaluate.items()}
    _keep(shot)
    assert page.errors == [], page.errors
    return page, height, values


WARNINGS = "(document.querySelector('#warnings') || {innerText: ''}).innerText"


@pytest.mark.parametrize("sign", ["quiet", "end_far_from_predicted", "disturbed_samples", "busy_cpu", "stage_over"])
def test_a_busy_machine_is_flagged_before_the_numbers(tmp_path, sign):
    """Each sign the run recorded of other work on the machine puts it in "Read before trusting
    the numbers"; a quiet run says nothing of the kind."""
    ctx = _context(tmp_path / sign)
    summary = _summary(ctx)
    if sign == "end_far_from_predicted":  # the numbers: 9,249 ms at the end, 1,152 ms predicted
        ctx = replace(ctx, baseline_ms=Latency(1152.0, 1160.0))
        summary = replace(summary, baseline_ms=Latency(1152.0, 9249.0), baseline_ms_at_start=1160.0)
    if sign == "disturbed_samples":
        ctx = replace(ctx, timing=TimingHealth(cells=24, discarded_samples=2570))
    if sign == "busy_cpu":
        summary = replace(summary, decisions=[BusyCpu(2, 18.8, 0.55), *summary.decisions])
    if sign == "stage_over":
        stages = [StageTime("kernel timing", 154.0, 25.0) if st.name == "kernel timing" else st for st in summary.stages]
        summary = replace(summary, stages=stages)
    _, _, got = _open(write_run(tmp_path / sign, ctx, summary), tmp_path, f"busy-{sign}", warnings=WARNINGS)
    text = got["warnings"]
    assert ("Other work had this machine during the run" in text) == (sign != "quiet"), text
    expected = {"quiet": "", "end_far_from_predicted": "9,249.0 ms at the end of the run against 1,152.0 ms predicted",
                "disturbed_samples": "2,570 timing samples were dropped", "busy_cpu": BusyCpu(2, 18.8, 0.55).describe(),
                "stage_over": "'kernel timing' took 154 s where the time plan gave it 25 s"}
    assert expected[sign] in text


@pytest.mark.parametrize("shipped", [True, False])
def test_the_star_the_caption_promises_is_drawn(tmp_path, shipped):
    """The shipped plan is a star on the Pareto plot where the caption says so; with the model kept
    as it came there is no star and the caption promises none."""
    ctx = _context(tmp_path / "run")
    summary = _summary(ctx) if shipped else _summary(ctx, plan={}, accuracy=None, verdicts=[])
    _, _, got = _open(write_run(tmp_path / "run", ctx, summary), tmp_path, f"star-{shipped}",
                      star="[...document.querySelectorAll('#pareto-star path, #pareto-star use')]"
                           ".filter(e => !e.closest('defs')).length",
                      legend="[...document.querySelectorAll('figure.pareto svg text')].map(t => t.textContent).join('|')",
                      caption="document.querySelector('#pareto-caption').innerText",
                      row="(document.querySelector('#pareto-table tr.shown') || {innerText: ''}).innerText")
    assert (got["star"] > 0) == shipped
    assert ("★ marks the shipped plan" in got["caption"]) == shipped
    assert ("shipped plan: trial 3" in got["legend"]) == shipped
    assert got["row"].startswith("3 ★") == shipped


def test_feasible_points_lie_on_the_side_of_the_line_they_were_judged_against(tmp_path):
    """Where tier 2 decides, trials are feasible up to the proxy's screen (0.05), not the budget
    (0.01): the plot draws the screen, labelled so, colours points by the recorded feasibility, and
    no feasible point sits above its line (pixel y grows downward)."""
    ctx = _context(tmp_path / "run")
    positions = """(() => {
      const y = el => { const r = el.getBoundingClientRect(); return r.top + r.height / 2; };
      const pts = sel => [...document.querySelectorAll(sel)].filter(e => !e.closest('defs')).map(y);
      return {feasible: pts('#pareto-feasible use, #pareto-feasible path'),
              infeasible: pts('#pareto-infeasible use, #pareto-infeasible path'),
              screen: y(document.querySelector('#pareto-screen path')),
              budget: y(document.querySelector('#pareto-budget path'))};
    })()"""
    _, _, got = _open(write_run(tmp_path / "run", ctx, _summary(ctx)), tmp_path, "pareto-screen", pos=positions,
                      legend="[...document.querySelectorAll('figure.pareto svg text')].map(t => t.textContent).join('|')")
    pos = got["pos"]
    feasible = sum(drop <= 0.05 for *_, drop in TRIALS)
    assert len(pos["feasible"]) == feasible and len(pos["infeasible"]) == len(TRIALS) - feasible
    assert all(y >= pos["screen"] - 1 for y in pos["feasible"])
    assert all(y < pos["screen"] for y in pos["infeasible"])
    assert any(y < pos["budget"] for y in pos["feasible"])  # feasible on the screen, above the tier-2 budget's line
    assert "the proxy's screen (0.05, tier 1): feasible at or below" in got["legend"]
    assert "max accuracy drop (0.01): judged on tier 2, not on this axis" in got["legend"]


def test_each_metric_row_says_what_it_measures(tmp_path):
    """KL, next-token accuracy and loss each carry their own description, not the top-1 row's."""
    proxy = {"accuracy": 1.0, "agreement": 1.0, "kl": 0.0, "next_token": 0.35, "loss": 3.29, "noise_agreement": 0.97}
    ctx = _context(tmp_path / "run", baseline_tier1=proxy)
    ctx = replace(ctx, accuracy=replace(ctx.accuracy, proxy="top-1 agreement with the unmodified model on 1024 tokens"))
    _, _, got = _open(write_run(tmp_path / "run", ctx, _summary(ctx)), tmp_path, "metrics",
                      rows="[...document.querySelectorAll('#accuracy-table tbody tr')]"
                           ".map(r => [r.cells[0].innerText, r.cells[6].innerText])")
    rows = dict(got["rows"])
    descriptions = list(rows.values())
    assert len(set(descriptions)) == len(descriptions) == len(rows)
    assert rows["top-1 agreement with bf16"] == "top-1 agreement with the unmodified model on 1024 tokens"
    assert "KL(bf16 ‖ plan)" in rows["KL divergence from bf16 (nats/token)"]
    assert "actual next token" in rows["next-token accuracy on held-out text"]
    assert "cross-entropy" in rows["loss on held-out text (nats/token)"]


def test_the_header_gives_the_runs_start(tmp_path):
    ctx = _context(tmp_path / "run")
    page, _, got = _open(write_run(tmp_path / "run", ctx, _summary(ctx)), tmp_path, "header",
                         line="document.querySelector('#run-line').innerText")
    assert got["line"].startswith(f"run started {STARTED}")
    assert "search started" not in page.dom_text


@pytest.mark.parametrize("mode", ["compile", "eager"])
def test_the_measured_card_says_which_way_of_running_the_speed_up_needs(tmp_path, mode):
    ctx = replace(_context(tmp_path / "run"), device=DeviceInfo("cuda" if mode == "compile" else "cpu", "Dev", mode))
    _, _, got = _open(write_run(tmp_path / "run", ctx, _summary(ctx)), tmp_path, f"mode-{mode}",
                      card="document.querySelector('#card-measured').innerText")
    needs = "the speed-up needs the model run that way" in got["card"]
    assert needs == (mode == "compile") and ("measured eagerly" in got["card"]) == (mode == "eager"), got["card"]


def test_an_estimated_run_says_its_speed_up_is_an_estimate_everywhere(tmp_path):
    ctx = replace(_context(tmp_path / "run"), target="llama.cpp", estimate="estimated from weight bytes, not measured")
    summary = _summary(ctx, plan_ms=Latency(0.88, None), speedup=Latency(1.36, None), rounds=0, speedup_range=[1.0, 1.0])
    page, _, got = _open(write_run(tmp_path / "run", ctx, summary), tmp_path, "estimate",
                         measured="document.querySelector('#card-measured').innerText",
                         predicted="document.querySelector('#card-predicted').innerText",
                         status=WARNINGS)
    assert "not measured" in got["measured"] and "estimated from weight bytes" in got["measured"]
    assert "ESTIMATED SPEED-UP (WEIGHT BYTES)" in got["predicted"].upper() and "1.36×" in got["predicted"]
    assert "its speed-up was not measured" in page.dom_text and "measured end to end, interleaved" not in page.dom_text
    assert "estimated from weight bytes" in got["status"]


def test_the_demos_211_layers_fit_a_few_screens(tmp_path, capsys):
    """The demo's layers (its run files of 2026-11-30): each decision's reason is said once per
    pattern, every layer keeps a compact row, and the page stays a few thousand pixels tall at 1366."""
    out = tmp_path / "demo"
    shutil.copytree(DEMO, out, ignore=shutil.ignore_patterns("report*"))
    data = load(out)
    assert len(data.layers) == 211 and len(data.patterns) < 20
    _, height, got = _open(out, tmp_path, "demo-211-layers",
                           why="[...document.querySelectorAll('#layers-table td.why')].map(c => c.innerText)",
                           rows="[...document.querySelectorAll('#layers-table tr[data-fqn]')].map(r => r.textContent)")
    with capsys.disabled():
        print(f"\nthe demo's 211 layers: {len(data.patterns)} patterns, page {height} px tall at 1366 px")
    assert len(got["rows"]) == 211 and height < 6000
    assert len(got["why"]) == len(data.patterns)  # each reason on its pattern's row, none on a layer's
    assert not [row for row in got["rows"] for why in got["why"] if why in row]


@pytest.mark.parametrize("run", sorted((ROOT / "tests" / "fixtures" / "runs").glob("*-cpu/demo_search")),
                         ids=lambda p: p.parent.name)
def test_run_directories_of_an_earlier_autoao_still_render(run, tmp_path):
    """Version-0 run files (notes as prose, no verdicts, no study beside them) load and render; the
    accuracy card says no verdict was recorded rather than inventing one."""
    out = tmp_path / "run"
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("report*"))
    data = load(out)
    assert data.finished and data.layers and data.front and not data.trials
    assert all(d.kind == "note" for d in data.summary.decisions)  # prose notes, kept as written
    html = render(out).read_text()
    assert "Search finished" in html and "recorded no verdict" in html


def test_the_time_section_shows_planned_and_spent_and_a_budget_too_short(tmp_path):
    ctx = _context(tmp_path / "run")
    stages = [StageTime("profile and baselines", 80.0), StageTime("kernel timing", 35.0, 30.0),
              StageTime("final measurement", 2.0, 5.0)]
    short = NothingToTry(not_timed=40, stage="profile and baselines", stage_s=80.0, suggest_s=240.0)
    summary = _summary(ctx, plan={}, accuracy=None, verdicts=[], trials=0, decisions=[short], stages=stages,
                       stage_seconds={st.name: st.spent_s for st in stages})
    _, _, got = _open(write_run(tmp_path / "run", ctx, summary, trials=[]), tmp_path, "time",
                      rows="[...document.querySelectorAll('#stages-table tbody tr')]"
                           ".map(r => [r.dataset.stage, r.className, r.cells[1].innerText, r.cells[2].innerText])",
                      short="document.querySelector('#too-short').innerText")
    rows = {name: (cls, planned, spent) for name, cls, planned, spent in got["rows"]}
    assert rows == {"profile and baselines": ("culprit", "–", "80.0 s"), "kernel timing": ("", "30.0 s", "35.0 s"),
                    "final measurement": ("", "5.0 s", "2.0 s")}
    assert "profile and baselines" in got["short"] and "80 s" in got["short"] and "240 s" in got["short"]


CURVE = [CurvePoint(62.0, 1.0, 1.0, "the model as it came", None, "start"),
         CurvePoint(95.4, 1.21, 1.12, "int8_wo x24", 1, "uniform"),
         CurvePoint(201.0, 1.39, 1.33, "int8_wo x16, int4_wo(group_size=64) x4", 3, "search")]


def test_the_time_section_shows_when_each_better_plan_was_verified(tmp_path):
    """The anytime curve: a step plot to the run's end with each point's lower bound and the
    budget's end, a table row per point, a sentence on what it does not show, a CSV row per point."""
    import pandas as pd

    ctx = _context(tmp_path / "run")
    out = write_run(tmp_path / "run", ctx, _summary(ctx, curve=CURVE))
    _, _, got = _open(out, tmp_path, "curve",
                      inside="!!document.querySelector('#time #curve figure.curve svg')",
                      marks="['curve-step', 'curve-bound', 'curve-verified', 'curve-budget', 'curve-end']"
                            ".filter(id => document.getElementById(id))",
                      legend="[...document.querySelectorAll('#curve svg text')].map(t => t.textContent).join('|')",
                      lead="document.querySelector('#curve p.lead').innerText",
                      rows="[...document.querySelectorAll('#curve-table tbody tr')].map(r => [...r.cells].map(c => c.innerText))")
    assert got["inside"] and got["marks"] == ["curve-step", "curve-bound", "curve-verified", "curve-budget", "curve-end"]
    for label in ("seconds since the run began", "speed-up vs bf16, measured", "the budget's end (300 s)",
                  "the run's end (250 s)", "plan verified (2)", "95% lower bound of the measured speed-up"):
        assert label in got["legend"].split("|"), label
    assert "does not show what more time would have found" in got["lead"]
    assert got["rows"] == [["62.0 s", "the model as it came", "1.00×", "1.00×", "–", "start"],
                           ["95.4 s", "int8_wo x24", "1.21×", "1.12×", "1", "uniform"],
                           ["201 s", "int8_wo x16, int4_wo(group_size=64) x4", "1.39×", "1.33×", "3", "search"]]
    csv = pd.read_csv(out / "report_curve.csv", dtype={"trial": "Int64"})
    assert len(csv) == len(CURVE) and list(csv.columns) == ["seconds", "speedup", "bound", "plan", "trial", "source"]
    assert list(csv.itertuples(index=False, name=None))[1:] == [(p.seconds, p.speedup, p.bound, p.plan, p.trial,
                                                                  p.source) for p in CURVE[1:]]
    assert (out / "report_curve.csv").read_text().splitlines()[1] == "62.0,1.0,1.0,the model as it came,,start"


@pytest.mark.parametrize("start", ["start", "resumed"])
def test_a_curve_with_its_start_alone_says_no_plan_was_verified(tmp_path, start):
    """Nothing verified: no plot and no table, a sentence that says so and points to the status
    box for why; a run continued from an earlier one names the plan it kept."""
    ctx = _context(tmp_path / "run")
    point = (CURVE[0] if start == "start" else CurvePoint(40.0, 1.3, 1.2, "int8_wo x24", 1, "resumed"))
    summary = (_summary(ctx, curve=[point], plan={}, accuracy=None, verdicts=[]) if start == "start" else
               _summary(ctx, curve=[point]))
    html = render(write_run(tmp_path / "run", ctx, summary)).read_text()
    curve = html[html.index('<div id="curve">'):html.index('<section id="layers">')]
    assert "<svg" not in curve and "curve-table" not in curve and 'href="#status"' in curve
    said = {"start": "No plan was verified in this run: the model as it came stayed the best",
            "resumed": "No plan faster than the one this run continued from (int8_wo x24, 1.30× measured by the "
                       "earlier run) was verified in this run"}
    assert said[start] in curve
    assert (tmp_path / "run" / "report_curve.csv").read_text().count("\n") == 2  # the header and the one point


@pytest.mark.parametrize("kept", [True, False])
def test_an_interrupted_run_says_when_and_what_it_kept(tmp_path, kept):
    """SIGINT / SIGTERM: the status box gives the signal, when it came, and the best plan verified
    by then with its measured speed-up and bound; or that none had been verified yet."""
    ctx = _context(tmp_path / "run")
    stop = RunInterrupted("SIGINT" if kept else "SIGTERM", 201.3, "the plan")
    summary = (_summary(ctx, curve=CURVE, interrupted="SIGINT", speedup=Latency(1.36, 1.62), speedup_bound=1.41,
                        decisions=[stop]) if kept else
               _summary(ctx, curve=CURVE[:1], interrupted="SIGTERM", plan={}, accuracy=None, verdicts=[],
                        decisions=[replace(stop, at_s=20.3)]))
    data = load(write_run(tmp_path / "run", ctx, summary))
    assert data.status == "interrupted" and data.interrupted_at == (201.3 if kept else 20.3)
    _, _, got = _open(tmp_path / "run", tmp_path, f"interrupted-{kept}",
                      box="document.querySelector('#status').dataset.status + '|' + "
                          "document.querySelector('#status').innerText",
                      legend="[...document.querySelectorAll('#curve svg text')].map(t => t.textContent).join('|')")
    kind, text = got["box"].split("|", 1)
    assert kind == "interrupted"
    if kept:
        assert ("Interrupted by SIGINT at 201 s: the plan below is the best verified by then (it holds on every judge "
                "and ran 1.62×, at least 1.41× with 95% confidence); the same command with the same output folder "
                "continues from it.") in text
        assert "interrupted by SIGINT (201 s)" in got["legend"].split("|")
    else:
        assert "Interrupted by SIGTERM at 20.3 s: no plan had been verified yet, so the model was kept as it came" in text
        assert all("SIGTERM ended the run before a plan was verified" in lay.why for lay in data.layers)
        assert got["legend"] == ""
    summary_csv = (tmp_path / "run" / "report_summary.csv").read_text()
    assert f"status,interrupted by {'SIGINT at 201' if kept else 'SIGTERM at 20'} s" in summary_csv


def test_every_verdict_is_shown_with_its_evidence(tmp_path):
    """The shipped plan's verdicts and every judged plan's: status, judge, metric, n with its
    unit, the drop, its 95% interval and the limit."""
    ctx = _context(tmp_path / "run")
    _, _, got = _open(write_run(tmp_path / "run", ctx, _summary(ctx)), tmp_path, "verdicts",
                      shipped="[...document.querySelectorAll('#verdicts-table tbody tr')].map(r => r.innerText)",
                      judged="[...document.querySelectorAll('#judged-table tbody tr')].map(r => r.innerText)",
                      card="document.querySelector('#card-accuracy').innerText")
    lm, gen = got["shipped"]
    for text in ("holds", "lm-eval", "autoao_facts acc", "300 of 372 documents", "+0.0020", "95%: -0.0050 to +0.0090",
                 "0.01"):
        assert text in lm, (text, lm)
    assert "generation" in gen and "512 tokens" in gen and "greedy agreement" in gen
    assert len(got["judged"]) == 3  # trial 4 (one verdict), trial 3 (two)
    assert "breaks" in got["judged"][0] and "+0.0200" in got["judged"][0]
    assert "holds" in got["card"] and "300 of 372 documents" in got["card"]


def test_tier2_rows_compare_both_sides_on_the_plans_documents(tmp_path):
    """The unchanged model's task scores at the start are its first look's (64 documents); a
    verdict may take more. Each row's two sides come from the same documents: the verdict's
    baseline and the paired per-task scores, never 64 documents against 256."""
    from autoao.reports.accuracy import metric_rows
    from autoao.types import UNMODIFIED_ACC

    ctx = _context(tmp_path / "run")
    ctx = replace(ctx, accuracy=replace(ctx.accuracy, baseline_tier2=0.75,
                                        baseline_tier2_metrics={"autoao_facts/acc": 0.75, "autoao_facts/documents": 64.0}))
    verdict = replace(_verdict("holds", drop=-0.008, n=256), baseline=0.676, score=0.684)
    paired = {"autoao_facts/acc": 0.684, f"autoao_facts/{UNMODIFIED_ACC}": 0.676, "autoao_facts/documents": 256.0}
    summary = _summary(ctx, accuracy=Accuracy(2, 0.684, -0.008, paired, "lm-eval: autoao_facts", verdict))
    rows = {r.metric: (r.baseline, r.plan) for r in metric_rows(ctx, summary, None, False, "bf16") if r.tier == 2}
    assert rows == {"mean headline accuracy of the tasks": (0.676, 0.684), "autoao_facts/acc": (0.676, 0.684),
                    "autoao_facts/documents": (256.0, 256.0)}
    # a summary without the paired scores: the headline still pairs on the verdict's baseline
    summary = _summary(ctx, accuracy=Accuracy(2, 0.684, -0.008, {"autoao_facts/acc": 0.684}, "lm-eval", verdict))
    rows = {r.metric: (r.baseline, r.plan) for r in metric_rows(ctx, summary, None, False, "bf16") if r.tier == 2}
    assert rows["mean headline accuracy of the tasks"] == rows["autoao_facts/acc"] == (0.676, 0.684)


def test_a_trial_left_unscored_says_why_in_the_trials_table():
    """A plan that failed to apply, or was predicted slower than the model as it came, has no
    finite drop: report_trials.csv's error column gives the search's reason."""
    from autoao.records import TrialRecord
    from autoao.reports.tables import _unscored

    why = "not scored: predicted 0.300 ms, slower than the model as it came (0.200 ms)"
    t = TrialRecord(4, "COMPLETE", {}, 300.0, Accuracy(1, -math.inf, math.inf, {}, why), False)
    assert _unscored(t) == why
    assert _unscored(replace(t, accuracy=Accuracy(1, 0.9, 0.01, {}, "proxy"))) == ""
    assert _unscored(replace(t, state="FAIL", accuracy=None)) == ""
