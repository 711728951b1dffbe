"""The report's tables as pandas DataFrames, written as CSV beside the HTML.

Each table is a pure function of `ReportData`, so re-rendering a directory gives byte-identical
CSVs. Numbers stay raw (us, ms, dB, absolute drops); the HTML formats them, the CSVs are for
analysis. Every layer has its own rows here, where the page says a reason once per pattern.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoao.common import atomic_write
from autoao.reports.load import ReportData, layer_counts, plan_text
from autoao.reports.layers import Layer
from autoao.types import FromBytes, Verdict

if TYPE_CHECKING:
    import pandas as pd

TABLES = ("summary", "accuracy", "verdicts", "stages", "curve", "layers", "layer_candidates", "trials", "candidates")
CURVE_COLUMNS = ["seconds", "speedup", "bound", "plan", "trial", "source"]
VERDICT_COLUMNS = ["plan", "trial", "status", "judge", "tier", "metric", "n", "population", "unit", "drop", "low",
                   "high", "max_drop", "baseline", "score"]


def build(data: ReportData) -> dict[str, pd.DataFrame]:
    """name -> DataFrame for every table in TABLES."""
    import pandas as pd  # lazy: heavy, and needed only to render

    def frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
        return pd.DataFrame(rows, columns=columns)

    return {
        "summary": frame([{"item": k, "value": v} for k, v in summary_items(data)], ["item", "value"]),
        "accuracy": frame([{"metric": a.metric, "tier": a.tier, "source": a.source, "description": a.description,
                            "baseline": a.baseline, "plan": a.plan, "higher_is_better": a.higher_is_better}
                           for a in data.metrics],
                          ["metric", "tier", "source", "description", "baseline", "plan", "higher_is_better"]),
        "verdicts": frame(_verdict_rows(data), VERDICT_COLUMNS),
        "stages": frame([{"stage": s.name, "planned_s": s.planned_s, "spent_s": s.spent_s} for s in data.stages],
                        ["stage", "planned_s", "spent_s"]),
        "curve": _curve(data),
        "layers": frame([_layer_row(lay) for lay in data.layers],
                        ["fqn", "group", "in_features", "out_features", "tokens", "calls", "chosen", "kernel", "fused",
                         "time_us", "baseline_time_us", "speedup", "sqnr_db", "why"]),
        "layer_candidates": frame(
            [{"fqn": lay.fqn, "candidate": c.candidate, "status": c.status, "time_us": c.time_us,
              "emulated": c.emulated, "sqnr_db": c.sqnr_db, "kernel": c.kernel, "reason": c.reason}
             for lay in data.layers for c in lay.choices],
            ["fqn", "candidate", "status", "time_us", "emulated", "sqnr_db", "kernel", "reason"]),
        "trials": frame(_trial_rows(data), ["trial", "state", "predicted_ms", "drop", "accuracy", "tier", "feasible",
                                            "pareto", "shown_plan", "warm_start", "elapsed_s", "plan", "error",
                                            "worker"]),
        "candidates": frame(
            [{"candidate": c.name, "status": c.status, "layers_allowed": c.layers, "layers_in_plan": n,
              "emulated": c.emulated or "", "reasons": "; ".join(c.reasons), "summary": c.summary}
             for c, n in data.candidates],
            ["candidate", "status", "layers_allowed", "layers_in_plan", "emulated", "reasons", "summary"]),
    }


def write_csvs(tables: dict[str, pd.DataFrame], html_path: Path) -> list[Path]:
    """Each table as `<report stem>_<name>.csv` beside the HTML, written atomically."""
    paths = []
    for name, df in tables.items():
        path = html_path.with_name(f"{html_path.stem}_{name}.csv")
        text = df.to_csv(index=False, lineterminator="\n")
        atomic_write(path, lambda f, text=text: f.write(text.encode()))
        paths.append(path)
    return paths


def _curve(data: ReportData) -> pd.DataFrame:
    """One row per better plan verified (the first: what the run started from); the trial an
    integer, left empty for the model as it came (not a float column)."""
    import pandas as pd

    points = data.summary.curve if data.summary else []
    df = pd.DataFrame([{c: getattr(p, c) for c in CURVE_COLUMNS} for p in points], columns=CURVE_COLUMNS)
    df["trial"] = df["trial"].astype("Int64")
    return df


def _verdict_rows(data: ReportData) -> list[dict[str, Any]]:
    """Every recorded verdict: the shipped plan's, then each judged plan's."""
    def row(plan: str, trial: int | None, v: Verdict) -> dict[str, Any]:
        return {"plan": plan, "trial": trial, "status": v.status, "judge": v.judge, "tier": v.tier, "metric": v.metric,
                "n": v.n, "population": v.population, "unit": v.unit, "drop": v.drop, "low": v.low, "high": v.high,
                "max_drop": v.max_drop, "baseline": v.baseline, "score": v.score}

    shipped = [row("shipped", data.shown.trial, v) for v in data.summary.verdicts] if data.summary else []
    return shipped + [row("judged", d.trial, v) for d in data.judged for v in d.verdicts]


def _trial_rows(data: ReportData) -> list[dict[str, Any]]:
    front = {r.trial for r in data.front}
    return [{"trial": t.number, "state": t.state, "predicted_ms": t.predicted_ms if t.state == "COMPLETE" else None,
             "drop": t.drop if t.accuracy is not None else None,
             "accuracy": t.accuracy.accuracy if t.accuracy is not None else None, "tier": t.tier,
             "feasible": t.feasible, "pareto": t.number in front, "shown_plan": t.number == data.shown.trial,
             "warm_start": t.warm_start, "elapsed_s": t.elapsed_s if math.isfinite(t.elapsed_s) else None,
             "plan": plan_text(layer_counts(data.context, t.params)), "error": t.error or _unscored(t), "worker": t.worker}
            for t in data.trials]


def _unscored(t: Any) -> str:
    """Why a finished trial has no finite drop, as the search recorded it (a plan that failed to
    apply; one predicted slower than the model as it came); "" for a scored one."""
    return t.accuracy.source if t.accuracy is not None and not math.isfinite(t.accuracy.drop) else ""


def summary_items(data: ReportData) -> list[tuple[str, str]]:
    """The headline numbers as (item, value) text pairs: the summary CSV."""
    ctx, s = data.context, data.summary
    counts = data.state_counts()
    items = [("status", _status(data)),
             ("run started", ctx.started),
             ("trials finished", str(counts.get("COMPLETE", 0))),
             ("trials failed / running / waiting",
              f"{counts.get('FAIL', 0)} / {counts.get('RUNNING', 0)} / {counts.get('WAITING', 0)}"),
             ("shown plan", data.shown.source),
             ("baseline latency predicted (ms)", _num(ctx.baseline_ms.predicted)),
             ("baseline latency measured (ms)", _num((s or ctx).baseline_ms.measured))]
    emulated = bool(data.emulated_in_plan())
    pricing = ctx.pricing
    if s and isinstance(pricing, FromBytes):
        items.append(("speed-up estimated, not measured", pricing.reason))
    if s:
        verdict = s.verdict
        items += [("plan latency predicted (ms)", _num(s.plan_ms.predicted)),
                  ("plan latency measured (ms)", _num(s.plan_ms.measured)),
                  ("speed-up predicted", "" if emulated else _num(s.speedup.predicted)),
                  ("speed-up measured", "" if emulated else _num(s.speedup.measured)),
                  ("speed-up lower bound (95%)", "" if emulated else _num(s.speedup_bound)),
                  ("rounds", str(s.rounds)),
                  ("verdict", verdict.describe() if verdict else ""),
                  ("weight bytes before", str(s.weight_bytes.before)),
                  ("weight bytes after", str(s.weight_bytes.after)),
                  ("run seconds", _num(s.seconds))]
        if data.stages:
            items.append(("seconds by stage", "; ".join(f"{st.name} {st.spent_s:.1f}" for st in data.stages)))
    items += [("max accuracy drop", _num(data.max_drop)), ("budget", ctx.budget), ("seed", str(ctx.seed)),
              ("device", f"{ctx.device.name} ({ctx.device.type}, timing {ctx.device.timing_mode})")]
    return items


def _status(data: ReportData) -> str:
    s = data.summary
    if s is None:
        return "not finished (killed or running)"
    if s.interrupted:
        return f"interrupted by {s.interrupted} at {data.interrupted_at:.0f} s"
    return "finished: " + s.stopped


def _layer_row(lay: Layer) -> dict[str, object]:
    base = lay.baseline
    return {"fqn": lay.fqn, "group": lay.group, "in_features": lay.in_features, "out_features": lay.out_features,
            "tokens": lay.tokens, "calls": " ".join(f"M={m}:{n}" for m, n in sorted(lay.calls.items())),
            "chosen": lay.chosen, "kernel": lay.pick.kernel, "fused": lay.fused, "time_us": lay.pick.time_us,
            "baseline_time_us": base.time_us if base else None, "speedup": lay.speedup, "sqnr_db": lay.pick.sqnr_db,
            "why": lay.why}


def _num(v: float | None) -> str:
    if v is None:
        return ""
    return repr(float(v)) if math.isfinite(v) else str(v)
