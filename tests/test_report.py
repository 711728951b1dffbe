"""The HTML report of a real (tiny) search: loaded from disk, rendered, re-rendered, read by a browser.

One search runs for the whole module (about 10 s on 2 CPU cores): a 6-layer model whose ModuleDict
has a layer named `<script>alert(1)</script>` (module names are user data), a user metric (tier 2)
and a candidate that is only emulated on the CPU. The browser test needs Debian's `chromium`
(.ci/run installs it) and skips without it; its screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
from torch import nn

from autoao.cli import main as cli_main
from autoao.reports import ReportError, load, render
from autoao.reports.tables import TABLES

EVIL = "<script>alert(1)</script>"
CANDIDATES = ["bf16", "int8_dyn", "int4_wo(group_size=64)", "int4_wo(group_size=128)", "sparse24"]
ARTIFACTS = Path(__file__).parent / "artifacts"


class SlowLinear(nn.Linear):
    """An nn.Linear that also waits 2 ms a call: the model as it came is then measurably slower end
    to end than any plan that swaps its layers, on a quiet or a busy CPU alike (the layers autoao
    times per shape are plain nn.Linear, so the search itself is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return super().forward(x)


class Tiny(nn.Module):
    """Gated MLP blocks on float inputs (the proxy is then 1 - relative output error, which
    quantization moves smoothly: int8 fits a 3% budget, int4 everywhere does not). Two weight
    shapes only, to keep the kernel timing short."""

    def __init__(self, d: int = 64, h: int = 128, n: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"up_proj": SlowLinear(d, h, bias=False), EVIL: SlowLinear(d, h, bias=False),
                           "down_proj": SlowLinear(h, d, bias=False)}) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, d]
        for b in self.blocks:
            x = x + b["down_proj"](torch.relu(b["up_proj"](x)) * torch.sigmoid(b[EVIL](x)))
        return x


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """(out_dir, optimize result, snapshot dir holding the report rendered right after the search)."""
    from autoao.api import optimize

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
        result = optimize(model, examples, budget=20, accuracy=output_match, out_dir=tmp / "out",
                          eval_inputs=[torch.randn(2, 16, 64, dtype=torch.bfloat16)], max_accuracy_drop=0.03,
                          candidates=CANDIDATES, progress=False, command="python tiny_search.py")
        report = render(result.out_dir)
    first = tmp / "first"
    first.mkdir()
    for f in report.parent.glob("report*"):
        shutil.copy(f, first / f.name)
    return result.out_dir, result, first


##### loader ####################################################################################

def test_loader_reads_the_finished_search(search):
    out, result, _ = search
    data = load(out)
    assert data.finished and data.summary is not None
    # the measured speed-up divides two end-to-end times taken back to back after the search
    s = data.summary
    assert s.speedup.measured == pytest.approx(s.baseline_ms.measured / s.plan_ms.measured)
    assert s.baseline_ms_at_start == pytest.approx(data.context.baseline_ms.measured)
    assert [lay.fqn for lay in data.layers] == [f"blocks.{i}.{n}" for i in range(2) for n in ("up_proj", EVIL, "down_proj")]
    assert {f: c for f, c in data.plan.items() if c != "bf16"} == {f: c.name for f, c in result.plan.layers.items()}
    assert data.chosen_trial == result.plan.metadata.get("trial")
    assert len(data.completed) == 20
    assert data.pareto == [p["trial"] for p in result.pareto]  # the search's own front, fastest first
    # the wall time per stage adds up to the search's, in the order the stages ran
    stages = s.stage_seconds
    assert list(stages) == ["profile and baselines", "kernel timing and layer errors", "cost model anchors",
                            "search trials", "tier-2 checks and re-rank",
                            "final measurement"]
    assert all(v >= 0 for v in stages.values()) and sum(stages.values()) == pytest.approx(s.seconds, rel=1e-3)
    # the timing stage by candidate, largest first, within the stage's wall time
    by_kernel = list(s.timing_seconds.values())
    assert by_kernel == sorted(by_kernel, reverse=True)
    assert sum(by_kernel) <= stages["kernel timing and layer errors"] + 0.05
    # the tier of every accuracy number is known; tier 2 here is the user metric
    assert {a.tier for a in data.accuracy} == {1, 2}
    assert any(a.metric == "output_match" and a.source == "user metric: output_match" for a in data.accuracy)


def test_every_layer_explains_every_candidate(search):
    data = load(search[0])
    for lay in data.layers:
        assert lay.choices[0].status == "chosen" and lay.choices[0].candidate == lay.chosen
        assert {c.candidate for c in lay.choices} == set(CANDIDATES)
        for c in lay.choices[1:]:
            assert c.reason.startswith(("excluded: ", "slower: ", "less accurate: SQNR ",
                                        "not picked by the search (Pareto trade-off)")), c
        sparse = next(c for c in lay.choices if c.candidate == "sparse24")
        assert sparse.emulated and sparse.status == "excluded" and "emulated on cpu" in sparse.reason
        assert sparse.time_us is None  # never picked here (allow_emulated is off), so never timed
    # in_features 64 is not a multiple of 128: that int4 variant is excluded with the reason
    up = next(lay for lay in data.layers if lay.fqn == "blocks.0.up_proj")
    g128 = next(c for c in up.choices if c.candidate == "int4_wo(group_size=128)")
    assert g128.status == "excluded" and "multiple of group size 128" in g128.reason


##### rendering #################################################################################

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
        assert row.state == t.state.name
        if t.values:
            assert math.isclose(row.predicted_ms, t.values[0] / 1e3)
    layers = pd.read_csv(first / "report_layers.csv")
    assert list(layers.fqn).count(f"blocks.0.{EVIL}") == 1
    assert (layers.chosen != "sparse24").all()
    summary = pd.read_csv(first / "report_summary.csv").set_index("item")["value"]
    assert summary["search seconds by stage"].startswith("profile and baselines ")
    cands = pd.read_csv(first / "report_candidates.csv").set_index("candidate")
    assert cands.loc["sparse24", "status"] == "emulated"
    assert cands.loc["int4_wo(group_size=128)", "status"] == "partly available"


def test_the_report_says_where_the_search_time_went(search):
    html = (search[2] / "report.html").read_text()
    assert "time by stage" in html and "kernel timing and layer errors" in html and "search trials" in html


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
    assert not data.finished
    assert data.state_counts() == {"COMPLETE": 20, "RUNNING": 1, "WAITING": 1}
    # the plan shown is the search's best so far, which it also wrote to best_plan.json
    best = json.loads((out / "best_plan.json").read_text())
    assert {f: c for f, c in data.plan.items() if c != "bf16"}.keys() == best["layers"].keys()
    assert data.chosen_trial == best["metadata"]["trial"]
    html = render(out).read_text()
    assert "This search has not finished" in html and "1 running or cut off" in html and "1 queued" in html
    assert "20 trials finished" in html and "not measured" in html
    assert 'data-status="running"' in html
    # the original directory still reads as finished: the copy reports its own study
    assert load(search[0]).state_counts() == {"COMPLETE": 20}


def test_unreadable_study_still_reports_the_best_plan(search, tmp_path):
    """Storage gone (e.g. a database server that is down): say so, show best_plan.json and the rest."""
    out = tmp_path / "lost"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("summary.json", "plan.json", "study.db", "report*"))
    ctx = json.loads((out / "context.json").read_text())
    ctx["storage"] = f"sqlite:///{tmp_path / 'elsewhere' / 'gone.db'}"
    (out / "context.json").write_text(json.dumps(ctx))
    data = load(out)
    assert data.trials == [] and any("study could not be read" in w for w in data.warnings)
    best = json.loads((out / "best_plan.json").read_text())
    assert {f for f, c in data.plan.items() if c != "bf16"} == set(best["layers"])
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


##### in a browser ##############################################################################

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
        layer_cells = browser.evaluate("[...document.querySelectorAll('#layers-table > tbody > tr[data-fqn]')]"
                                       ".map(r => r.cells[0].textContent)")
        card = browser.evaluate("document.querySelector('#card-measured').innerText")

    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / ".gitignore").write_text("*\n")  # screenshots are build output, never committed
    for f in (shot, full):
        shutil.copy(f, ARTIFACTS / f.name)
    with capsys.disabled():
        print(f"\nreport screenshots: {shot} {full} (copied to {ARTIFACTS}/)")

    assert page.errors == [] and page.dialogs == []
    assert page.requests == [(first / "report.html").resolve().as_uri()]  # self-contained
    assert n_scripts == 0 and overflow <= 0
    text = page.dom_text
    for heading in ("Summary", "Pareto front", "Search history", "Layers: what each got and why",
                    "Candidates on this device", "Reproduce"):
        assert heading in text
    assert "Search finished" in text
    assert f"{s.speedup.measured:.2f}×" in card
    assert f"{s.baseline_ms.measured:.3g} ms" in card
    assert f"{s.speedup.predicted:.2f}×" in text
    assert f"{s.accuracy.drop:+.4f}" in text and "tier 2 · user metric" in text and "tier 1 · proxy" in text
    assert layer_cells == [lay.fqn for lay in load(out).layers]  # the evil name reads as text
    assert layer_cells[1] == f"blocks.0.{EVIL}"
    assert "python tiny_search.py" in text and str(out) in text
    for label in ("predicted latency (ms)", "accuracy drop (absolute)", "trial", "best predicted latency (ms)",
                  "search time, trials only (s)"):
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
    """Where timing chose among a candidate's CUDA kernels (context.json "kernels"), the layer table
    names the kernel and how much slower the others were; failed kernels say so."""
    out = tmp_path / "kernels"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("report*"))
    ctx = json.loads((out / "context.json").read_text())
    lay = ctx["layers"][0]
    first, second = list(lay["time_us"])[:2]
    lay["kernels"] = {first: {"chosen": "triton", "us": {"tinygemm": 15.0, "triton": 10.0}},
                      second: {"chosen": "triton", "us": {"tinygemm": math.inf, "triton": 4.0}}}
    (out / "context.json").write_text(json.dumps(ctx))  # inf as Infinity, as autoao writes it
    layer = next(x for x in load(out).layers if x.fqn == lay["fqn"])
    by_name = {c.candidate: c for c in layer.choices}
    assert (by_name[first].kernel, by_name[first].kernel_note) == ("triton", "triton; tinygemm 1.50x slower")
    assert by_name[second].kernel_note == "triton; tinygemm failed"
    assert all(c.kernel is None for n, c in by_name.items() if n not in (first, second))
    html = render(out).read_text()
    assert 'title="CUDA kernel chosen by timing: triton; tinygemm 1.50x slower">triton</span>' in html


def test_the_baseline_is_named_by_the_dtype_the_model_came_in(search, tmp_path):
    out = tmp_path / "fp32"
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("report*"))
    html = render(out).read_text()
    assert "vs bf16, end to end" in html and "Accuracy, bf16 vs the plan" in html
    ctx = json.loads((out / "context.json").read_text())
    ctx["model"]["dtype"] = "float32"
    (out / "context.json").write_text(json.dumps(ctx))
    html = render(out).read_text()
    assert "vs float32, end to end" in html and "Accuracy, float32 vs the plan" in html
    assert "vs bf16" not in html and "float32 time" in html


@pytest.mark.parametrize("status", ["finished", "unchanged", "no_trials", "interrupted"])
def test_status_box_and_cards_tell_what_happened(search, tmp_path, status):
    """In a browser, for each way a run can end: the status box names it, and the cards hold the
    summary.json numbers (an unchanged model is 1.00x, with the reason)."""
    from headless import Browser

    out = tmp_path / status
    shutil.copytree(search[0], out, ignore=shutil.ignore_patterns("report*"))
    summary = json.loads((out / "summary.json").read_text())
    if status in ("unchanged", "no_trials"):
        base = summary["baseline_ms"]["measured"]
        summary.update(plan={}, kernels={}, fusions=[], accuracy=None, rounds=0, speedup_range=[1.0, 1.0],
                       plan_ms={"predicted": summary["baseline_ms"]["predicted"], "measured": base},
                       speedup={"predicted": 1.0, "measured": 1.0})
        summary["decisions"].append({"kind": "kept_unchanged", "trial": 3, "numbers": {
            "plan_ms": base * 1.01, "baseline_ms": base, "low": 0.97, "high": 1.02, "rounds": 3}})
        (out / "plan.json").unlink()
    if status == "no_trials":
        summary.update(trials=0, decisions=[])
    if status == "interrupted":
        summary["stopped"] = "interrupted (finished trials are in the storage; run again to continue)"
    (out / "summary.json").write_text(json.dumps(summary))
    page_path = render(out)
    with Browser() as browser:
        browser.open(page_path, width=1366, height=900)
        box = browser.evaluate("document.querySelector('#status').dataset.status + '|' + "
                               "document.querySelector('#status').innerText")
        card = browser.evaluate("document.querySelector('#card-measured').innerText")
        layer_why = browser.evaluate("document.querySelector('#layers-table > tbody > tr[data-fqn]').innerText")
    kind, text = box.split("|", 1)
    assert kind == status
    expected = {"finished": "Search finished", "unchanged": "the model was kept as it came",
                "no_trials": "Stopped by the budget before the first trial", "interrupted": "Interrupted during the search"}
    assert expected[status] in text
    assert ("applied and measured end to end" in text) == (status in ("finished", "interrupted"))
    assert f"{summary['speedup']['measured']:.2f}×" in card
    if status == "unchanged":
        assert "no measurable change" in text and "0.97x to 1.02x over 3 interleaved rounds" in text
        assert "1.00×" in card and "kept as it came with the whole model" in layer_why
        assert "spent the accuracy budget" not in layer_why
    if status == "no_trials":
        assert "budget ran out before the first trial" in layer_why


def test_the_report_names_left_out_candidates_and_a_4_bit_weight_grid(tmp_path, monkeypatch):
    """A model whose weights sit on a 4-bit group-32 grid is flagged up front, and a candidate the
    caller left out is listed with its reason."""
    import torch
    from torch import nn

    import autoao
    from autoao.reports.load import load

    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
    with torch.no_grad():  # an affine 4-bit grid per 32 input columns, as GGUF Q4_1 leaves it
        g = model[0].weight.float().reshape(64, 2, 32)
        lo, step = g.amin(-1, keepdim=True), (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
        model[0].weight.copy_((((g - lo) / step).round() * step + lo).reshape(64, 64))
    why = "its weights were a 4-bit grid of groups of 32"
    autoao.optimize(model, [torch.randn(4, 64, dtype=torch.bfloat16)], budget=2, candidates=["int8_wo"],
                    left_out={"int4_wo(group_size=32)": why}, out_dir=tmp_path / "o", progress=False)
    data = load(tmp_path / "o")
    assert data.context.int4_grid_layers == 1
    assert any("sit on a 4-bit grid of groups of 32" in w and "left out of this search" in w for w in data.warnings)
    row = next(c for c in data.candidates if c.name == "int4_wo(group_size=32)")
    assert row.status == "left out" and row.reasons == [why]
    html = (tmp_path / "o" / "report.html").read_text()
    assert "left out" in html and why in html
