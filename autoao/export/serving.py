"""SERVING.md, written into every export: how to serve the directory with each engine of its format,
whether that engine loads it as planned, and what each layer runs there."""

from __future__ import annotations

from pathlib import Path

from autoao.export.targets import Target
from autoao.search_space import Candidate


def _layers_table(rows: dict[str, Candidate | None], targets: list[Target]) -> list[str]:
    """One line per candidate: how many layers have it, a few of their names, and what each
    engine runs for it."""
    by_cand: dict[str, list[str]] = {}
    first: dict[str, Candidate | None] = {}
    for fqn, cand in rows.items():
        key = "as it came (bf16)" if cand is None or cand.family == "bf16" else cand.name
        by_cand.setdefault(key, []).append(fqn)
        first.setdefault(key, cand)
    head = "| plan | layers | " + " | ".join(t.engine for t in targets) + " |"
    lines = [head, "|" + "---|" * (2 + len(targets))]
    for key, fqns in by_cand.items():
        shown = ", ".join(f"`{f}`" for f in fqns[:3]) + (f" and {len(fqns) - 3} more" if len(fqns) > 3 else "")
        cells = " | ".join(t.describe(first[key]) for t in targets)
        lines.append(f"| `{key}` | {len(fqns)}: {shown} | {cells} |")
    return lines


def serving_md(directory: Path, chosen: Target, rows: dict[str, Candidate | None], targets: list[Target],
               problems: dict[str, list[str]], made_for: str | None) -> str:
    """The text of SERVING.md for an export made for `chosen`; targets: every target of its format.
    rows: every linear layer -> its candidate (None: unchanged);
    problems: target name -> what it would refuse ([]: loads as planned); made_for: the target the
    plan was searched for, if it says."""
    lines = [f"# Serving {directory.name}", "", chosen.format_note, ""]
    if made_for:
        lines += [f"The plan was made for `{made_for}`.", ""]
    lines += ["## Commands", ""]
    for t in targets:
        state = "loads as planned" if not problems.get(t.name) else "**would not run as planned**"
        lines += [f"- {t.engine} ({state}):", "", f"      {t.serve_command.format(dir=directory)}", ""]
        lines += [f"  {p.strip()}" for p in problems.get(t.name, [])[:20]]
        if len(problems.get(t.name, [])) > 20:
            lines.append(f"  ... and {len(problems[t.name]) - 20} more")
        if problems.get(t.name):
            lines.append("")
    lines += ["## What each layer runs", ""] + _layers_table(rows, targets) + [""]
    return "\n".join(lines)
