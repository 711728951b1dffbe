"""The report's tables as pandas DataFrames, written as CSV beside the HTML.

Each table is a pure function of `ReportData`, so re-rendering a directory gives byte-identical
CSVs (the test of "re-rendering from the stored study gives the same tables"). Numbers stay raw
(us, ms, dB, absolute drops); the HTML formats them, the CSVs are for analysis.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from autoao.common import BASELINE, atomic_write
from autoao.reports.load import ReportData, plan_of

if TYPE_CHECKING:
    import pandas as pd

TABLES = ("summary", "accuracy", "layers", "layer_candidates", "trials", "candidates")


def build(data: ReportData) -> dict[str, pd.DataFrame]:
    """name -> DataFrame for every table in TABLES."""
    import pandas as pd

    return {
        "summary": pd.DataFrame(summary_items(data), columns=["item", "value"]),
        "accuracy": pd.DataFrame([{"metric": a.metric, "tier": a.tier, "source": a.source, "bf16": a.baseline,
                                   "plan": a.plan, "higher_is_better": a.higher_is_better}
                                  for a in data.accuracy],
                                 columns=["metric", "tier", "source", "bf16", "plan", "higher_is_better"]),
        "layers": pd.DataFrame([_layer_row(data, lay) for lay in data.layers],
                               columns=["fqn", "group", "in_features", "out_features", "tokens", "calls", "chosen",
                                        "time_us", "bf16_time_us", "speedup", "sqnr_db", "why"]),
        "layer_candidates": pd.DataFrame(
            [{"fqn": lay.fqn, "candidate": c.candidate, "status": c.status, "time_us": c.time_us,
              "emulated": c.emulated, "sqnr_db": c.sqnr_db, "reason": c.reason}
             for lay in data.layers for c in lay.choices],
            columns=["fqn", "candidate", "status", "time_us", "emulated", "sqnr_db", "reason"]),
        "trials": pd.DataFrame(
            [{"trial": t.number, "state": t.state, "predicted_ms": t.predicted_ms, "drop": t.drop,
              "accuracy": t.accuracy, "tier": t.tier, "feasible": t.feasible, "pareto": t.number in data.pareto,
              "shown_plan": t.number == data.chosen_trial, "warm_start": t.warm_start,
              "finished_s": t.finished_s, "plan": plan_text(data, t.params), "error": t.error,
              "worker": t.worker}
             for t in sorted(data.trials, key=lambda t: t.number)],
            columns=["trial", "state", "predicted_ms", "drop", "accuracy", "tier", "feasible", "pareto",
                     "shown_plan", "warm_start", "finished_s", "plan", "error", "worker"]),
        "candidates": pd.DataFrame(
            [{"candidate": c.name, "status": c.status, "layers_allowed": c.layers, "layers_in_plan": c.in_plan,
              "emulated": c.emulated or "", "reasons": "; ".join(c.reasons), "summary": c.summary}
             for c in data.candidates],
            columns=["candidate", "status", "layers_allowed", "layers_in_plan", "emulated", "reasons", "summary"]),
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


def plan_text(data: ReportData, params: dict[str, str]) -> str:
    """"int8_dyn x4, int4_wo(group_size=64) x2" (layers per candidate, the baseline left out; "unchanged")."""
    counts: dict[str, int] = {}
    for cand in plan_of(data.groups, params).values():
        if cand != BASELINE:
            counts[cand] = counts.get(cand, 0) + 1
    return ", ".join(f"{c} x{n}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "unchanged"


def summary_items(data: ReportData) -> list[tuple[str, str]]:
    """The headline numbers as (item, value) text pairs: the summary CSV and the HTML's facts."""
    ctx, s = data.context, data.summary
    counts = data.state_counts()
    items = [("status", "finished: " + s.stopped if s else "not finished (interrupted or running)"),
             ("trials finished", str(counts.get("COMPLETE", 0))),
             ("trials failed / running / waiting",
              f"{counts.get('FAIL', 0)} / {counts.get('RUNNING', 0)} / {counts.get('WAITING', 0)}"),
             ("shown plan", data.plan_source),
             ("bf16 latency predicted (ms)", _num(ctx.baseline_ms.predicted)),
             ("bf16 latency measured (ms)", _num((s or ctx).baseline_ms.measured))]
    chosen = data.trial(data.chosen_trial)
    if s:
        items += [("plan latency predicted (ms)", _num(s.plan_ms.predicted)),
                  ("plan latency measured (ms)", _num(s.plan_ms.measured)),
                  ("speed-up predicted", _num(s.speedup.predicted) if not data.emulated_in_plan() else ""),
                  ("speed-up measured", _num(s.speedup.measured) if not data.emulated_in_plan() else ""),
                  ("weight bytes before", str(s.weight_bytes.before)),
                  ("weight bytes after", str(s.weight_bytes.after)),
                  ("search seconds", _num(s.seconds))]
        if s.stage_seconds:  # where the wall time went (older run files may lack it)
            items.append(("search seconds by stage",
                          "; ".join(f"{stage} {sec:.1f}" for stage, sec in s.stage_seconds.items())))
    elif chosen is not None:
        items += [("plan latency predicted (ms)", _num(chosen.predicted_ms))]
    final = s.accuracy if s else None
    drop, tier = ((final.drop, final.tier) if final else (chosen.drop, chosen.tier) if chosen and not s else
                  (None, None))
    items += [("accuracy drop", _num(drop) if drop is not None else "0 (unchanged)"),
              ("accuracy drop tier", str(tier) if tier is not None else ""),
              ("max accuracy drop", _num(data.max_drop)),
              ("budget", ctx.budget), ("seed", str(ctx.seed)),
              ("device", f"{ctx.device.name} ({ctx.device.type}, timing {ctx.device.timing_mode})")]
    return items


def _layer_row(data: ReportData, lay) -> dict[str, object]:
    chosen = lay.choices[0]
    base = next((c.time_us for c in lay.choices if c.candidate == BASELINE), None)
    speedup = (base / chosen.time_us if base and chosen.time_us and not chosen.emulated else None)
    return {"fqn": lay.fqn, "group": lay.group, "in_features": lay.in_features, "out_features": lay.out_features,
            "tokens": lay.tokens, "calls": " ".join(f"M={m}:{n}" for m, n in sorted(lay.calls.items())),
            "chosen": lay.chosen, "time_us": chosen.time_us, "bf16_time_us": base, "speedup": speedup,
            "sqnr_db": chosen.sqnr_db, "why": lay.why}


def _num(v: float | None) -> str:
    if v is None:
        return ""
    return repr(float(v)) if math.isfinite(v) else str(v)
