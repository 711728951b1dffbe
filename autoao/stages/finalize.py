"""Stage 5: the incumbent applied for real, its measurement completed where time is left.

    final = finalize(bench, incumbent, decisions, cost, base, ledger, extend=True)   -> Final

The incumbent (autoao.stages.anytime) was verified on its verdicts and on rounds interleaved with the
model as it came. It is applied to the model (fresh modules, validated); on the CPU, while the time
budget leaves room (`extend`: not after an interrupt), more rounds are taken in alternation, up to
MAX_ROUNDS in all, and the speed-up is every round's paired estimate with its 95% interval
(autoao.clock.paired_speedup). A plan is shipped only while it stays shown faster (the interval's
lower bound above 1.00x): should the added rounds undo that, the model stays as it came
(KeptUnchanged). The model as it came is 1.00x by definition and not measured again. A plan for an
engine autoao only emulates (bench.pricing is FromBytes: llama.cpp's GGUF types) was not timed: it ships on its
verdicts, with the cost model's estimate said to be one (ShippedOnEstimate).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from autoao.clock import PairedSpeedup
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.decisions import (Decision, Judged, KeptUnchanged, NoneHeld, NotFaster, NothingToTry, ShippedOnEstimate,
                              Verified)
from autoao.evaluators.timing import NOT_TIMED
from autoao.ledger import RunLedger
from autoao.plan import Plan, apply
from autoao.records import MeasuredPlan, WorkloadTiming
from autoao.stages.anytime import MAX_ROUNDS, Incumbent, Speed
from autoao.stages.bench import ModelBench, Sample, interleaved
from autoao.stages.measure import Baselines, Measurements
from autoao.types import UNRESOLVED, Accuracy, FromBytes, Pricing, Timed, Verdict, pricing_words


@dataclass(frozen=True)
class Final:
    """The plan applied to the model, and its end-to-end time next to the unchanged model's."""

    plan: Plan
    accuracy: Accuracy | None  # None: the model is unchanged
    verdicts: tuple[Verdict, ...]  # every judge's verdict on the shipped plan
    baseline_us: float  # bf16: median over the interleaved rounds
    plan_us: float
    speedup: PairedSpeedup  # the rounds' paired speed-up and its interval (1.00x: unchanged)
    speedup_range: tuple[float, float]  # lowest and highest per-round ratio
    predicted_baseline_us: float
    predicted_us: float
    decisions: tuple[Decision, ...]
    measured_plans: tuple[MeasuredPlan, ...]
    pricing: Pricing = Timed()  # FromBytes: the speed-up was estimated, not measured (bench.pricing)
    workload: WorkloadTiming | None = None  # the user's workload, timed when the plan was verified

    @property
    def rounds(self) -> int:
        return self.speedup.rounds


UNCHANGED = PairedSpeedup(1.0, 1.0, 1.0, 0)


def finalize(bench: ModelBench, incumbent: Incumbent, decisions: list[Decision], meas: Measurements,
             cost: CostModel, base: Baselines, ledger: RunLedger, *, measured: tuple[MeasuredPlan, ...] = (),
             extend: bool = True) -> Final:
    """Apply the incumbent and complete its comparison with the model as it came (module docstring);
    `decisions`: what the run decided so far (an ending word is added where the model stays as it
    came); `measured`: the plans measured end to end while verifying."""
    bench.restore()
    plan = bench.shipped(incumbent.params, trial=incumbent.trial) if incumbent.params else bench.shipped({})
    predicted_base = cost.predict(Plan())
    if not plan.layers:
        not_timed = sum(r.timing.error == NOT_TIMED for r in meas.table.rows)
        # the time plan's early word that the budget was too short, now with the cells left untimed
        said = [replace(d, not_timed=not_timed) if isinstance(d, NothingToTry) and d.stage else d for d in decisions]
        return Final(plan, None, (), base.bf16_us, base.bf16_us, UNCHANGED, (1.0, 1.0), predicted_base,
                     predicted_base, tuple(said + _why_unchanged(said, meas)), measured)
    apply(bench.model, plan, calibration=bench.calibration)
    if isinstance(bench.pricing, FromBytes) or incumbent.speed is None:
        predicted = cost.predict(plan)
        note = ShippedOnEstimate(incumbent.trial, predicted_base / predicted, pricing_words(bench.pricing))
        ledger.say(note.describe())
        return Final(plan, incumbent.accuracy, incumbent.verdicts, base.bf16_us, base.bf16_us, UNCHANGED, (1.0, 1.0),
                     predicted_base, predicted, tuple(decisions + [note]), measured, pricing=bench.pricing)
    speed = _extended(bench, plan, incumbent.speed, base, ledger) if extend else incumbent.speed
    paired, spread = speed.paired, _spread(speed.base, speed.plan)
    base_us, plan_us = _median(speed.base), _median(speed.plan)
    if paired.low <= 1.0:  # the added rounds no longer show it faster
        kept = KeptUnchanged(incumbent.trial, plan_us / 1e3, base_us / 1e3, spread[0], spread[1], paired.rounds,
                             paired.estimate, paired.low)
        ledger.say(kept.describe())
        bench.restore()
        return Final(bench.shipped({}), None, (), base_us, base_us, UNCHANGED, (1.0, 1.0), predicted_base,
                     predicted_base, tuple(decisions + [kept]), measured)
    return Final(plan, incumbent.accuracy, incumbent.verdicts, base_us, plan_us, paired, spread, predicted_base,
                 cost.predict(plan), tuple(decisions), measured, workload=speed.workload)


def _extended(bench: ModelBench, plan: Plan, speed: Speed, base: Baselines, ledger: RunLedger) -> Speed:
    """The incumbent's rounds, and on the CPU as many more as a time budget leaves room for (up to
    MAX_ROUNDS in all: the time is the run's anyway), with the plan applied to the model (its
    modules in place afterwards). Without a time budget the verification's rounds, which decided,
    stand."""
    left = ledger.remaining()
    if bench.compile or left is None:
        return speed
    per_round = 2 * base.bf16_us / 1e6
    more = min(MAX_ROUNDS - len(speed.base), int((left - WRITE_ROOM_S) / max(per_round, 1e-3)) - 1)
    if more <= 0:
        return speed
    ledger.say(f"the final comparison: {more} more interleaved rounds of the plan and the model as it came")
    got_base, got_plan = interleaved(bench, bench.modules(plan), more)
    return Speed(speed.base + tuple(got_base), speed.plan + tuple(got_plan), speed.workload)


WRITE_ROOM_S = 5.0  # kept for saving the model and the report after the final rounds


def _why_unchanged(decisions: list[Decision], meas: Measurements) -> list[Decision]:
    """The run's last word where no plan was verified, unless one already says why (the anytime
    run's Anytime.conclude, an early word of the time plan)."""
    if any(d.ends_unchanged for d in decisions) or any(isinstance(d, Verified) for d in decisions):
        return []
    if all(ch == [BASELINE] for ch in meas.choices.values()):
        return [NothingToTry(sum(r.timing.error == NOT_TIMED for r in meas.table.rows))]
    tried = [d for d in decisions if isinstance(d, (Judged, NotFaster))]
    return [NoneHeld(len(tried), sum(isinstance(d, Judged) and d.status == UNRESOLVED for d in tried))]


def _spread(base: tuple[Sample, ...], planned: tuple[Sample, ...]) -> tuple[float, float]:
    """The lowest and highest per-round ratio, taken from the sides' p20 / p80."""
    return (min(b[1] / p[2] for b, p in zip(base, planned)), max(b[2] / p[1] for b, p in zip(base, planned)))


def _median(samples: tuple[Sample, ...]) -> float:
    return statistics.median(s[0] for s in samples)
