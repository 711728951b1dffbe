"""Run files written by an earlier autoao, upgraded in memory to this one's fields (a leaf module):
autoao.records reads every run file through these before building its typed records.

    upgrade_context(data)   context.json's JSON object -> the current RunContext's fields
    upgrade_summary(data)   summary.json's JSON object -> the current RunSummary's fields

Version 0 is autoao 0.1.0's untyped files; version 1 kept decisions as a kind and a dict of numbers.
"""

from __future__ import annotations

from typing import Any

# 1: the first typed version; 2: decisions as typed records, accuracy with verdicts, stages planned
# and spent. Bump it when a field changes meaning or is removed, and teach the upgrades the step.
RUN_FILES_VERSION = 2


def upgrade_context(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("version") == 1:  # nothing in the context changed meaning
        d = dict(d, version=RUN_FILES_VERSION)
    if d.get("version", 0) == 0:  # untyped context.json of autoao 0.1.0
        d = dict(d, version=RUN_FILES_VERSION)
        model = dict(d["model"])
        model["class_name"] = model.pop("class", "")
        d["model"] = model
        acc = dict(d["accuracy"])
        base = acc.pop("baseline", {}) or {}
        acc["baseline_tier1"], tier2 = base.get("tier1") or {}, base.get("tier2")
        if isinstance(acc.get("tasks"), str):  # accuracy="a,b" was written as given
            acc["tasks"] = [t.strip() for t in acc["tasks"].split(",") if t.strip()]
        if isinstance(tier2, dict):  # lm-eval: {"accuracy", "metrics": {task: {metric: value}}}
            acc["baseline_tier2"] = tier2.get("accuracy")
            acc["baseline_tier2_metrics"] = {f"{t}/{k}": v for t, m in (tier2.get("metrics") or {}).items()
                                             for k, v in m.items() if not k.endswith("_stderr")}
        else:
            acc["baseline_tier2"] = tier2
        d["accuracy"] = acc
        d["groups"] = [{"name": n, "fqns": f, "choices": c} for n, f, c in d["groups"]]
        d.setdefault("fused", [])  # sibling fusion came later in 0.1.0
        d["layers"] = [{"kernels": {}, "tied": [], **lay} for lay in d["layers"]]
    return d


# Decision kinds earlier runs recorded that this autoao no longer makes (the bisection of the Pareto
# front, the re-rank, the final comparison's refusals): read back as notes in their own words.
RETIRED = {"chose_slower", "out_of_time", "rerank_chose", "rerank_kept", "plan_unmeasurable", "workload_not_faster"}


def upgrade_summary(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("version", 0) == 0:  # untyped summary.json of autoao 0.1.0: notes were prose
        d = dict(d, version=RUN_FILES_VERSION)
        base = dict(d["baseline_ms"])
        d["baseline_ms_at_start"] = base.pop("measured_at_start", None)
        d["baseline_ms"] = base
        d["decisions"] = [{"kind": "note", "reason": n} for n in d.pop("notes", [])]
        d.pop("baseline_accuracy", None)  # also in context.json
        d.setdefault("stage_seconds", {})
        d.setdefault("timing_seconds", {})
        d.setdefault("fusions", [])
        d.setdefault("kernels", {})
        d.setdefault("measured_plans", [])
        d.setdefault("uniform", [])
    elif d.get("version") == 1:  # decisions were a kind and a dict of numbers: kept as their words
        d = dict(d, version=RUN_FILES_VERSION)
        d["decisions"] = [{"kind": "note", "reason": _v1_words(x)} for x in d.get("decisions", [])]
    if any(x.get("kind") in RETIRED for x in d.get("decisions", [])):
        d = dict(d, decisions=[{"kind": "note", "reason": _retired_words(x)} if x.get("kind") in RETIRED else x
                               for x in d["decisions"]])
    return d


def _retired_words(d: dict[str, Any]) -> str:
    """A retired decision as text: its kind, its trial and its fields."""
    trial = f" (trial {d['trial']})" if d.get("trial") is not None else ""
    fields = ", ".join(f"{k.replace('_', ' ')} {v:.4g}" if isinstance(v, float) else f"{k.replace('_', ' ')} {v}"
                       for k, v in d.items() if k not in ("kind", "trial"))
    return f"{d['kind'].replace('_', ' ')}{trial}: {fields}"


def _v1_words(d: dict[str, Any]) -> str:
    """A version-1 decision as text: its reason, else its kind with its numbers."""
    if d.get("kind") == "note" or not d.get("numbers") and d.get("reason"):
        return str(d.get("reason", ""))
    numbers = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
                        for k, v in (d.get("numbers") or {}).items())
    trial = f" (trial {d['trial']})" if d.get("trial") is not None else ""
    return f"{d.get('kind', 'decision').replace('_', ' ')}{trial}: {numbers}" + (f"; {d['reason']}" if d.get("reason") else "")
