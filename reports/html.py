"""Render a search directory to one self-contained `report.html` (+ its tables as CSV beside it).

    path = render("autoao-report/")                 # autoao-report/report.html, report_*.csv
    path = render("autoao-report/", "x/r.html")     # x/r.html, x/r_*.csv

The page is a Jinja2 template (autoescaped: module names are user data) with inline CSS and inline
SVG plots; it loads nothing and runs no script. `render` only reads the directory (context.json, the
Optuna study, summary.json / plan.json when the search finished), so it works on a finished, an
interrupted or a still-running search, and rendering again gives the same page.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoao.reports import plots, tables
from autoao.reports.fmt import fmt_bytes, fmt_db, fmt_drop, fmt_ms, fmt_num, fmt_times, fmt_us
from autoao.common import BASELINE, atomic_write
from autoao.reports.load import TIER_LABEL, ReportData, Trial, decision_notes, load, plan_of
from autoao.runfiles import Latency

TEMPLATE = "template.html.j2"


def render(out_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of the search in `out_dir` and return its path.

    Args:
        out_dir: a search's output directory (it must hold context.json).
        out: the HTML file to write (default: out_dir/report.html). The tables go beside it as
            `<stem>_<table>.csv`.

    Raises:
        autoao.reports.load.ReportError (a ValueError): out_dir is not a readable search directory.
    """

    data = load(out_dir)
    path = Path(out) if out is not None else Path(out_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = tables.build(data)
    csvs = tables.write_csvs(frames, path)
    page = render_html(data, [p.name for p in csvs])
    atomic_write(path, lambda f: f.write(page.encode()))
    return path


def render_html(data: ReportData, csv_names: list[str]) -> str:
    """The report page as a string (what `render` writes)."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(ms=fmt_ms, us=fmt_us, db=fmt_db, times=fmt_times, drop=fmt_drop, num=fmt_num,
                       size=fmt_bytes, tier=tier_label, sh=lambda p: shlex.quote(str(p)),
                       py=lambda p: repr(str(p)))
    pareto, history = plots.pareto_svg(data), plots.history_svg(data)
    return env.get_template(TEMPLATE).render(
        d=data, v=headline(data), csv_names=csv_names,
        # Our own matplotlib output (its text is XML-escaped by matplotlib); never user markup.
        pareto_svg=Markup(pareto) if pareto else None, history_svg=Markup(history) if history else None,
        pareto_rows=[_pareto_row(data, t) for n in data.pareto if (t := data.trial(n)) is not None],
        plan_text=lambda params: tables.plan_text(data, params), BASELINE=BASELINE, decision_notes=decision_notes,
    )


##### what the summary says #####################################################################

@dataclass
class Headline:
    """The numbers at the top of the page; None = not known (yet), with `*_why` saying why."""

    title: str
    predicted_speedup: float | None
    measured_speedup: float | None
    speedup_why: str  # why a speed-up is missing, or ""
    baseline_ms: Latency
    plan_ms: Latency
    drop: float | None
    drop_tier: int | None
    drop_source: str
    within_budget: bool | None
    bytes_before: int
    bytes_after: int | None
    trials_done: int
    seconds: float | None
    stopped: str
    layers_changed: int
    base_name: str  # what the plan is compared with: "bf16", or the dtype the model came in (float32)


def headline(data: ReportData) -> Headline:
    ctx, s = data.context, data.summary
    chosen = data.trial(data.chosen_trial)
    base = s.baseline_ms if s else ctx.baseline_ms  # finished: bf16 measured again next to the plan
    emulated = data.emulated_in_plan()
    speedup_why = (f"not reported: the plan uses {', '.join(emulated)}, only emulated on this device"
                   if emulated else "")
    changed = sum(c != BASELINE for c in data.plan.values())
    if s is not None:
        plan_ms = s.plan_ms
        acc = s.accuracy
        drop, tier, source = ((acc.drop, acc.tier, acc.source) if acc else
                              (0.0, None, f"the model is unchanged (all {data.baseline_name})"))
        predicted, measured = s.speedup.predicted, s.speedup.measured
        after, seconds, stopped = s.weight_bytes.after, s.seconds, s.stopped
    else:
        plan_ms = Latency(chosen.predicted_ms if chosen else base.predicted, None)
        drop, tier = (chosen.drop, chosen.tier) if chosen else (0.0, None)
        source = "best trial so far" if chosen else f"no feasible trial yet (all {data.baseline_name})"
        predicted = base.predicted / plan_ms.predicted if base.predicted and plan_ms.predicted else None
        measured, after, stopped = None, None, "not finished"
        seconds = max((t.finished_s for t in data.trials if t.finished_s is not None), default=None)
        speedup_why = speedup_why or "measured when the search finishes"
    if emulated:
        predicted = measured = None
    return Headline(
        title=f"{ctx.model.class_name} on {ctx.device.name}",
        predicted_speedup=predicted, measured_speedup=measured, speedup_why=speedup_why, baseline_ms=base,
        plan_ms=plan_ms, drop=drop, drop_tier=tier, drop_source=source,
        within_budget=None if drop is None else drop <= data.max_drop,
        bytes_before=ctx.model.weight_bytes, bytes_after=after,
        trials_done=len(data.completed), seconds=seconds, stopped=stopped, layers_changed=changed,
        base_name=data.baseline_name,
    )


def _pareto_row(data: ReportData, t: Trial) -> dict[str, Any]:
    plan = plan_of(data.groups, t.params)
    emulated = {lay.fqn: {c.candidate for c in lay.choices if c.emulated} for lay in data.layers}
    uses_emulated = any(plan.get(f, BASELINE) in e for f, e in emulated.items())
    base = data.context.baseline_ms.predicted
    return {"trial": t, "speedup": None if uses_emulated or not base else base / t.predicted_ms,
            "emulated": uses_emulated, "shown": t.number == data.chosen_trial, "plan": tables.plan_text(data, t.params)}


##### labels ####################################################################################

def tier_label(tier: int | None, source: str = "") -> str:
    """"tier 1 · proxy", "tier 2 · lm-eval", "tier 2 · user metric"."""
    if tier is None:
        return "–"
    if tier == 2:
        kind = "lm-eval" if source.startswith("lm-eval") else "user metric" if source.startswith("user") else ""
        return f"tier 2 · {kind}" if kind else "tier 2"
    return TIER_LABEL.get(tier, f"tier {tier}")
