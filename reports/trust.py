"""What makes a number on the page less trustworthy than it looks, and where the time went.

    warnings(context, summary, emulated, predicted_speedup)   -> tuple[str, ...] ("Read before
                                                                  trusting the numbers")
    busy(context, summary)        -> the evidence that other work had the machine during the run
    stages(context, summary)      -> StageRow per stage: the seconds planned and spent

Everything here reads what the run recorded; the thresholds only decide what is worth saying.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoao.decisions import BusyCpu, NothingToTry
from autoao.records import RunContext, RunSummary
from autoao.types import BATCH_COMPARED, BATCH_FLIPS, LMEVAL_BATCH, Budget, FromBytes

# Above this a speed-up says more about the measurement than the plan: int4 weights are 4x fewer
# bytes than bf16, and 2:4 sparsity with int8 at most about 8x fewer operations.
PLAUSIBLE_SPEEDUP = 10.0
# The unchanged model measured at the end of the run this far from the cost model's prediction (or
# from its own measurement at the start): the machine was not the one the timings were taken on.
APART = 2.0
# More disturbed timing samples than cells (at least this many): on average every cell lost the CPU.
DISTURBED_MIN = 20
# A stage that took this much longer than the time plan gave it, by at least STAGE_OVER_S seconds
# (the budget's own tolerance: a run may end 15 s past a short budget).
STAGE_OVER, STAGE_OVER_S = 1.5, 15.0
# The cell-level timings may still be sound where the model's end-to-end times differ this much.
PREDICTION_APART = 2.0
# The grid that GGUF Q4_0 / Q4_1 files leave weights on makes this candidate near lossless
# (autoao.profile's GRID_CANDIDATE; RunContext.int4_grid_layers counts the layers on the grid).
GRID_CANDIDATE = "int4_wo(group_size=32)"


@dataclass(frozen=True)
class StageRow:
    name: str
    spent_s: float
    planned_s: float | None  # None: measured before the time plan existed, or no time budget
    nothing_to_try: bool = False  # the stage that spent the budget before any plan could be tried

    @property
    def over(self) -> bool:
        """Far longer than planned (STAGE_OVER, STAGE_OVER_S)."""
        return self.planned_s is not None and self.spent_s > max(STAGE_OVER * self.planned_s,
                                                                 self.planned_s + STAGE_OVER_S)


def stages(summary: RunSummary | None) -> tuple[StageRow, ...]:
    """Planned and spent seconds per stage, in the order they ran (a run file without planned
    seconds: spent only); the stage a NothingToTry decision names is marked."""
    if summary is None:
        return ()
    culprit = next((d.stage for d in summary.decisions if isinstance(d, NothingToTry) and d.stage), None)
    if summary.stages:
        return tuple(StageRow(s.name, s.spent_s, s.planned_s, s.name == culprit) for s in summary.stages)
    return tuple(StageRow(name, sec, None, name == culprit) for name, sec in summary.stage_seconds.items())


def budget_seconds(ctx: RunContext) -> float | None:
    """The time budget in seconds (None: a trial budget, or one this autoao cannot read)."""
    try:
        return Budget.parse(ctx.budget).seconds
    except ValueError:
        return None


def busy(ctx: RunContext, summary: RunSummary | None) -> tuple[str, ...]:
    """Each sign the run recorded that other work had the machine, as a sentence."""
    out = []
    health = ctx.timing
    if health.discarded_samples >= max(DISTURBED_MIN, health.cells + 1):
        out.append(f"{health.discarded_samples:,} timing samples were dropped because the process lost the CPU "
                   f"during them, more than the {health.cells:,} timing cells")
    if summary is not None:
        out += [d.describe() for d in summary.decisions if isinstance(d, BusyCpu)]
        out += _baseline_drift(ctx, summary)
        out += [f"'{s.name}' took {s.spent_s:,.0f} s where the time plan gave it {s.planned_s:,.0f} s"
                for s in stages(summary) if s.over]
    return tuple(out)


def _baseline_drift(ctx: RunContext, summary: RunSummary) -> list[str]:
    predicted, end, start = ctx.baseline_ms.predicted, summary.baseline_ms.measured, summary.baseline_ms_at_start
    apart = [(label, v) for label, v in (("predicted", predicted), ("measured at the start", start))
             if v and end and not 1 / APART <= end / v <= APART]
    if not apart:
        return []
    said = " and ".join(f"{v:,.1f} ms {label}" for label, v in apart)
    return [f"the unchanged model measured {end:,.1f} ms at the end of the run against {said}"]


def warnings(ctx: RunContext, summary: RunSummary | None, emulated: list[str], predicted: float | None,
             base: str) -> tuple[str, ...]:
    """What the reader must know before trusting the page's numbers, most serious first."""
    out = []
    signs = busy(ctx, summary)
    if signs:
        out.append("Other work had this machine during the run, so its timings and speed-ups are less trustworthy "
                   "than they look: " + "; ".join(signs) + ". Run again on an idle machine to confirm them.")
    out += _timing_warnings(ctx)
    out += scoring_warnings(ctx)
    if ctx.int4_grid_layers:
        g32 = next((c for c in ctx.candidates if c.name == GRID_CANDIDATE), None)
        out.append(f"The weights of {ctx.int4_grid_layers} of {len(ctx.layers)} layers sit on a 4-bit grid of groups "
                   "of 32, as a GGUF Q4_0 / Q4_1 file leaves them: int4 with group size 32 re-quantizes that grid "
                   "and measures near lossless on them, as it would not on a model trained in bf16"
                   + (" (it was left out of this search)" if g32 is not None and g32.status == "left out" else ""))
    out += _speed_warnings(ctx, summary, emulated, predicted, base)
    return tuple(out)


def scoring_warnings(ctx: RunContext) -> list[str]:
    """Tasks on which lm-eval's batched scoring changes the outcome of a larger share of the model's
    first documents than the budget: the verdicts (one document a forward) are exact for that
    scoring, and a re-score at another batch size can move the drop by about that share."""
    metrics, out = ctx.accuracy.baseline_tier2_metrics, []
    for key, flips in metrics.items():
        task, _, name = key.partition("/")
        compared = metrics.get(f"{task}/{BATCH_COMPARED}", 0.0)
        if name == BATCH_FLIPS and compared and flips / compared > ctx.max_accuracy_drop:
            out.append(f"On {task}, {flips:.0f} of the {compared:.0f} documents first scored answer differently when "
                       f"lm-eval scores them {LMEVAL_BATCH} requests a forward rather than one document a forward, "
                       f"as every verdict here does: {flips / compared:.2%} of them, more than the budget of "
                       f"{ctx.max_accuracy_drop:.2%}. The verdicts are exact for this run's scoring; a re-score at "
                       f"another batch size can move the drop by about that much (the model's numbers round "
                       f"differently with their batch-mates).")
    return out


def _timing_warnings(ctx: RunContext) -> list[str]:
    health, out = ctx.timing, []
    if health.spot_check:
        out.append(f"At start, {health.spot_check}")
    if health.unreliable:
        out.append(f"{health.unreliable} of {health.cells} timing cells could not be measured without the process "
                   f"losing the CPU: the cost model used the pessimistic end of their spread; measure on a quieter "
                   "machine for sharper predictions")
    if health.not_timed:
        out.append(f"{health.not_timed} of {health.cells} timing cells were not measured within the time budget: "
                   "the candidates they belong to were not offered on those layers (a larger budget times them)")
    return out


def _speed_warnings(ctx: RunContext, summary: RunSummary | None, emulated: list[str], predicted: float | None,
                    base: str) -> list[str]:
    pricing = ctx.pricing
    if isinstance(pricing, FromBytes):  # nothing was measured that a prediction could be checked against
        return [f"The speed-up is {pricing.reason}."]
    out = []
    pred, meas = ctx.baseline_ms.predicted, ctx.baseline_ms.measured
    if pred and meas and not 1 / PREDICTION_APART <= pred / meas <= PREDICTION_APART:
        out.append(f"The cost model predicts {pred:,.3f} ms for the {base} model but it measured {meas:,.3f} ms end "
                   f"to end ({max(pred / meas, meas / pred):,.1f}x apart): per-layer timings on this device are "
                   "unreliable, so predicted latencies and speed-ups are too; trust the measured numbers")
    if emulated:
        out.append(f"The plan uses candidates that are only emulated on this device ({', '.join(emulated)}): "
                   "their latency is not that of a fast kernel, so no speed-up is reported for them")
        return out
    measured = summary.speedup.measured if summary is not None else None
    for kind, value in (("predicted", predicted), ("measured", measured)):
        if value and value > PLAUSIBLE_SPEEDUP:
            out.append(f"The {kind} speed-up, {value:,.1f}x, is beyond what these candidates can give (4-bit "
                       "weights move 4x fewer bytes, 2:4 sparsity halves the work): the timings were likely "
                       "disturbed, e.g. by other processes on the machine; measure again on an idle one")
    if predicted and measured and not 2 / 3 <= predicted / measured <= 1.5:
        out.append(f"The cost model predicted a {predicted:.2f}x speed-up but the plan measured {measured:.2f}x end to "
                   "end: trust the measured number; latencies in the Pareto front and the layer table are predictions")
    if summary is not None and measured and measured < 1.0 and summary.plan:
        out.append(f"The chosen plan measured slower than {base} end to end (speed-up {measured:.2g}x)")
    return out
