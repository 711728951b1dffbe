"""Render a run directory to one self-contained `report.html` (+ its tables as CSV beside it).

    path = render("autoao-report/")                 # autoao-report/report.html, report_*.csv
    path = render("autoao-report/", "x/r.html")     # x/r.html, x/r_*.csv

The page is a Jinja2 template (autoescaped: module names are user data) with inline CSS and inline
SVG plots; it loads nothing and runs no script. `render` only reads the directory (context.json, the
Optuna study, summary.json / pareto.json when the run finished), so it works on a finished, an
interrupted or a still-running run, and rendering again gives the same page.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from autoao.common import BASELINE, atomic_write
from autoao.decisions import Judged
from autoao.records import Latency
from autoao.reports import plots, tables
from autoao.reports.fmt import (fmt_bytes, fmt_db, fmt_db_range, fmt_drop, fmt_interval, fmt_ms, fmt_n, fmt_num,
                                fmt_s, fmt_times, fmt_us)
from autoao.reports.layers import everywhere
from autoao.reports.load import ReportData, load, plan_text
from autoao.reports.trust import budget_seconds
from autoao.types import FromBytes, Verdict, pricing_words

TEMPLATE = "template.html.j2"
TIER_LABEL = {0: "tier 0 · layer SQNR", 1: "tier 1 · proxy", 2: "tier 2"}
# What proposed each point of the curve (CurvePoint.source), in the words the page explains it with.
SOURCES = {"start": "the model as it came, where the run started",
           "uniform": "one candidate on every layer it fits (the warm start)",
           "fallback": "another of the warm start's plans, built from the layer errors",
           "search": "a plan the search's sampler proposed",
           "resumed": "the best plan an earlier run of the same command verified, continued from"}


def render(out_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of the run in `out_dir` and return its path.

    Args:
        out_dir: a run's output directory (it must hold context.json).
        out: the HTML file to write (default: out_dir/report.html). The tables go beside it as
            `<stem>_<table>.csv`.

    Raises:
        autoao.reports.ReportError (a ValueError): out_dir is not a readable run directory.
    """
    data = load(out_dir)
    path = Path(out) if out is not None else Path(out_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    csvs = tables.write_csvs(tables.build(data), path)
    page = render_html(data, [p.name for p in csvs])
    atomic_write(path, lambda f: f.write(page.encode()))
    return path


def render_html(data: ReportData, csv_names: list[str]) -> str:
    """The report page as a string (what `render` writes)."""
    import jinja2  # lazy, as matplotlib below: heavy, and needed only to render
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(ms=fmt_ms, us=fmt_us, db=fmt_db, db_range=fmt_db_range, times=fmt_times, drop=fmt_drop,
                       num=fmt_num, secs=fmt_s, size=fmt_bytes, interval=fmt_interval, evidence=fmt_n, tier=tier_label,
                       sh=lambda p: shlex.quote(str(p)), py=lambda p: repr(str(p)))
    pareto, history, curve = plots.pareto_svg(data), plots.history_svg(data), plots.curve_svg(data)
    star = plots.star(data)
    return env.get_template(TEMPLATE).render(
        d=data, v=headline(data), csv_names=csv_names, BASELINE=BASELINE, budget_s=budget_seconds(data.context),
        # Our own matplotlib output (its text is XML-escaped by matplotlib); never user markup.
        pareto_svg=Markup(pareto) if pareto else None, history_svg=Markup(history) if history else None,
        curve_svg=Markup(curve) if curve else None, sources=SOURCES,
        star=star, line=plots.feasibility_line(data), plan_text=plan_text, common=everywhere(data.layers),
        # the judged plans have their own table (their verdicts); every other decision in words
        notes=[d.describe() for d in data.summary.decisions if not isinstance(d, Judged)] if data.summary else [],
    )


##### what the summary says #####################################################################

@dataclass(frozen=True)
class Headline:
    """The numbers at the top of the page; None = not known (yet), with `*_why` saying why."""

    title: str
    predicted_speedup: float | None
    measured_speedup: float | None
    speedup_why: str  # why a speed-up is missing, or ""
    baseline_ms: Latency
    plan_ms: Latency
    verdict: Verdict | None  # the verdict the plan ships on (or, unfinished, the best trial's screen verdict)
    verdict_what: str  # which plan and judge the verdict is of; or why there is none
    bytes_before: int
    bytes_after: int | None
    trials_done: int
    seconds: float | None
    stopped: str
    layers_changed: int
    base_name: str  # what the plan is compared with: "bf16", or the dtype the model came in (float32)
    estimate: str = ""  # how the predicted speed-up was estimated, where nothing could be measured
    mode: str = ""  # how the speed-up was measured, and so the way of running the model it needs


# How the speed-up was measured, and so how the model must run to see it. Eagerly, autoao's
# quantized modules pay their kernels' launches per call: on a datacenter GPU a plan measured 1.88x
# compiled ran 0.81x in eager generate() (docs/kernels.md#eager-calls-the-hosts-share). Replayed graphs leave out the host's
# work per call: SmolLM2's compiled generate() spends about 3 ms of host time a token against
# 1.9-2.8 ms of kernels, so a plan's kernel saving mostly does not show there
# (docs/results.md#smollm2s-decode-step-and-generate-on-the-h200-searched-at-05-1-and-2-points).
MODES = {
    "compile": "measured compiled (torch.compile, replayed as CUDA graphs, so without the host's work per call): "
               "the speed-up needs the model run that way; a loop that calls the compiled model once a step "
               "(generate()) also pays its own Python and dynamo's guard checks each call, and where those take "
               "longer than the kernels the saving does not show: pass your loop as workload= to measure it; "
               "run eagerly, the plan was not measured and can be slower than the model as it came",
    "graph": "measured as CUDA graph replays: the speed-up needs the model run that way",
    "eager": "measured eagerly, as the model runs without torch.compile",
}


def headline(data: ReportData) -> Headline:
    ctx, s = data.context, data.summary
    trial = data.shown_trial
    emulated = data.emulated_in_plan()
    speedup_why = f"not reported: the plan uses {', '.join(emulated)}, only emulated on this device" if emulated else ""
    verdict, what = _verdict(data)
    if s is not None:
        base, plan_ms = s.baseline_ms, s.plan_ms  # finished: bf16 measured again next to the plan
        predicted, measured = s.speedup.predicted, s.speedup.measured
        after, seconds = s.weight_bytes.after, s.seconds
        stopped = f"interrupted by {s.interrupted}" if s.interrupted else s.stopped
    else:
        base = ctx.baseline_ms
        plan_ms = Latency(trial.predicted_ms if trial else base.predicted, None)
        predicted = base.predicted / plan_ms.predicted if base.predicted and plan_ms.predicted else None
        measured, after, stopped = None, None, "not finished"
        seconds = max((t.elapsed_s for t in data.completed if math.isfinite(t.elapsed_s)), default=None)
        speedup_why = speedup_why or "measured when the run finishes"
    if emulated:
        predicted = measured = None
    pricing = ctx.pricing
    if isinstance(pricing, FromBytes):
        speedup_why = f"the speed-up is {pricing.reason}"
    trials = s.trials if s is not None else len(data.completed)
    return Headline(f"{ctx.model.class_name} on {ctx.device.name}", predicted, measured, speedup_why, base, plan_ms,
                    verdict, what, ctx.model.weight_bytes, after, trials, seconds, stopped,
                    sum(c != BASELINE for c in data.shown.plan.values()), data.baseline_name, pricing_words(pricing),
                    MODES.get(ctx.device.timing_mode, ""))


def _verdict(data: ReportData) -> tuple[Verdict | None, str]:
    """The accuracy card's verdict and what it is of: the shipped plan's deciding verdict; the
    best trial's screen verdict while unfinished; none for the unchanged model (nothing to judge)."""
    s = data.summary
    if data.shown.unchanged:
        return None, f"the model is unchanged (all {data.baseline_name}): nothing to judge"
    if s is not None:
        if s.verdict is not None:
            return s.verdict, "the shipped plan, on the tier that decides"
        acc = s.accuracy
        return None, ("this run recorded no verdict (an earlier autoao judged on the drop alone)"
                      + (f": drop {fmt_drop(acc.drop)} on tier {acc.tier}, its evidence not recorded" if acc else ""))
    trial = data.shown_trial
    if trial is not None and trial.accuracy is not None and trial.accuracy.verdict is not None:
        return (trial.accuracy.verdict,
                f"trial {trial.number} on the search's screen; the verdicts that ship come at the end")
    return None, "no verdict yet: the judges run when the trials end"


def tier_label(tier: int | None, source: str = "") -> str:
    """"tier 1 · proxy", "tier 2 · lm-eval", "tier 2 · user metric"."""
    if tier is None:
        return "–"
    if tier == 2:
        kind = "lm-eval" if source.startswith("lm-eval") else "user metric" if source.startswith("user") else ""
        return f"tier 2 · {kind}" if kind else "tier 2"
    return TIER_LABEL.get(tier, f"tier {tier}")
