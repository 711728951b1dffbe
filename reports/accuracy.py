"""What the report says about accuracy: the recorded verdicts first, then the measurements behind
them, each metric with its own description.

    rows = metric_rows(context, summary, shown_trial, unchanged)   -> tuple[MetricRow, ...]
    judged(summary)                                                -> the Judged decisions

"Within budget" is never decided here: it is the status of a recorded `Verdict` (holds / breaks /
unresolved, with its n and interval); a measured drop is shown with the number of positions,
documents or items behind it, or said to have none recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoao.decisions import Judged
from autoao.records import RunContext, RunSummary, TrialRecord
from autoao.types import BATCH_COMPARED, BATCH_FLIPS, UNMODIFIED_ACC, Verdict

# The proxy's metrics (keys of AccuracySpec.baseline_tier1 and of a trial's Accuracy.metrics):
# (label, what it measures, higher is better). {base}: the unchanged model's name on the page.
PROXY_METRICS: dict[str, tuple[str, str, bool]] = {
    "agreement": ("top-1 agreement with {base}",
                  "share of held-out positions where the plan's most likely next token is {base}'s", True),
    "kl": ("KL divergence from {base} (nats/token)",
           "KL({base} ‖ plan) of the next-token distributions, averaged over the held-out positions; 0 = identical",
           False),
    "next_token": ("next-token accuracy on held-out text",
                   "share of held-out positions where the plan's most likely token is the text's actual next token",
                   True),
    "loss": ("loss on held-out text (nats/token)",
             "cross-entropy of the text's actual next tokens under the plan, per token", False),
    "cosine": ("mean cosine similarity to {base}'s embeddings",
               "cosine similarity of each held-out row's embedding to {base}'s, averaged over the rows", True),
    "cosine_min": ("least cosine similarity to {base}'s embeddings",
                   "the lowest cosine similarity of any held-out row's embedding to {base}'s", True),
    "nn_agreement": ("nearest-neighbour agreement with {base}",
                     "share of held-out rows whose nearest other row is the same as under {base}", True),
    "rel_error": ("relative output error vs {base}",
                  "L2 norm of the output difference over the L2 norm of {base}'s outputs, all rows together", False),
    "row_error": ("mean row error vs {base}",
                  "relative L2 error of each output row against {base}'s, averaged over the rows", False),
    "noise_agreement": ("{base} vs itself in float32: top-1 agreement",
                        "the agreement {base}'s own float32 twin reaches: the floor its drop is measured from", True),
    "noise_kl": ("{base} vs itself in float32: KL (nats/token)",
                 "KL between {base} and its float32 twin: its own numerical noise", False),
}
BASELINE_ONLY = ("noise_agreement", "noise_kl")  # properties of the unchanged model, never of a plan


@dataclass(frozen=True)
class MetricRow:
    """One measurement of the unchanged model and of the shown plan, with what it is."""

    metric: str
    description: str  # this metric's own words
    tier: int
    source: str  # "proxy", "lm-eval: autoao_facts", "user metric: f1"
    baseline: float | None
    plan: float | None  # None: `missing` says why
    missing: str
    higher_is_better: bool | None
    evidence: Verdict | None = None  # the verdict whose positions, documents or items the plan's value is over


def metric_rows(ctx: RunContext, summary: RunSummary | None, shown: TrialRecord | None, unchanged: bool,
                base: str) -> tuple[MetricRow, ...]:
    """Every recorded metric of the unchanged model next to the shown plan's: the proxy's from the
    shown plan's trial (the screen), tier 2's from the summary. `unchanged`: the shown plan is the
    model as it came (nothing measured on it: the rows say so, never "0")."""
    acc = ctx.accuracy
    measured = shown.accuracy.metrics if shown is not None and shown.accuracy is not None else None
    screen = shown.accuracy.verdict if shown is not None and shown.accuracy is not None else None
    missing = "unchanged model" if unchanged else "not recorded" if summary is not None else "at the end"
    rows = []
    lm = "kl" in acc.baseline_tier1  # a causal LM's proxy accuracy is its top-1 agreement: one row, not two
    for key, value in acc.baseline_tier1.items():
        if lm and key == "agreement":
            continue
        label, what, higher = _proxy_metric("agreement" if lm and key == "accuracy" else key, acc.proxy, base)
        plan = None if unchanged or key in BASELINE_ONLY or measured is None else measured.get(key)
        why = "–" if key in BASELINE_ONLY else missing  # a property of the unchanged model alone
        rows.append(MetricRow(label, what, 1, "proxy", value, plan, why, higher, screen if plan is not None else None))
    if acc.tier == 2:
        rows += _tier2_rows(ctx, summary, unchanged, missing)
    return tuple(rows)


def _proxy_metric(key: str, proxy: str, base: str) -> tuple[str, str, bool | None]:
    """(label, description, higher is better) of one proxy metric; "accuracy" is what the proxy's
    drop is measured on, as the run described it (AccuracySpec.proxy, shown as written)."""
    if key == "accuracy":
        return "proxy accuracy (what its drop is measured on)", proxy or "the proxy's accuracy", True
    if key == "agreement" and proxy:
        return PROXY_METRICS[key][0].format(base=base), proxy, True
    if key in PROXY_METRICS:
        label, what, higher = PROXY_METRICS[key]
        return label.format(base=base), what.format(base=base), higher
    return key, "a proxy metric this report has no description of", None


def _tier2_rows(ctx: RunContext, summary: RunSummary | None, unchanged: bool, missing: str) -> list[MetricRow]:
    acc = ctx.accuracy
    final = summary.accuracy if summary is not None and not unchanged else None
    final = final if final is not None and final.tier == 2 else None
    score, on = (final.accuracy, final.verdict) if final is not None else (None, None)
    if not acc.tasks:
        name = acc.metric or "metric"
        return [MetricRow(name, f"what your callable {name}(model) returned (higher is better)", 2,
                          f"user metric: {name}", acc.baseline_tier2, score, missing, True, on)]
    source = f"lm-eval: {', '.join(acc.tasks)}"
    # the unchanged model's side of a row is on the plan's documents where the verdict paired them
    # (the baseline metrics are the first look's alone, fewer documents than a verdict may take)
    paired = final.metrics if final is not None else {}
    base = on.baseline if on is not None else acc.baseline_tier2
    rows = [MetricRow("mean headline accuracy of the tasks", f"each task's headline metric, averaged over the tasks "
                      f"({', '.join(acc.tasks)})", 2, source, base, score, missing, True, on)]
    for key, value in acc.baseline_tier2_metrics.items():
        task, _, name = key.partition("/")
        if name in (BATCH_FLIPS, BATCH_COMPARED):  # the scoring's comparison, not a metric: a warning where it matters
            continue
        plan = paired.get(key)
        if name == "acc":  # summaries without the paired scores: one task's is the verdict's own
            value = paired.get(f"{task}/{UNMODIFIED_ACC}", base if len(acc.tasks) == 1 else value)
        elif name == "documents" and plan is not None:  # paired: both sides scored the same documents
            value = plan
        rows.append(MetricRow(key, f"lm-eval task {task}, its metric {name or key}", 2, source, value, plan, missing,
                              "perplexity" not in key and "bits" not in key, on if plan is not None else None))
    return rows


def judged(summary: RunSummary | None) -> tuple[Judged, ...]:
    """The plans the accuracy judges checked before one could ship, in the order they were judged."""
    return tuple(d for d in summary.decisions if isinstance(d, Judged)) if summary is not None else ()
