"""Stage 5: the chosen plan applied for real and measured against the model as it came.

    final = finalize(bench, choice, cost, base, ledger)   -> Final

bf16 and the plan are measured in alternation, round by round, and the speed-up is the rounds'
paired estimate with its 95% interval (autoao.clock.paired_speedup). A plan is shipped only when
shown faster (the interval's lower bound above 1.00x): per-layer timings summed can promise a
speed-up the whole model does not deliver (SmolLM2 at M=2048 on the H200, 2:4 everywhere predicted
1.03x, measured 0.87x). On the CPU rounds continue from MIN_ROUNDS up to MAX_ROUNDS or what the time
budget leaves, until the bound is above 1 or the estimate is not; each CPU round runs the workload
once per side (the same bf16 demo workload measured 2.1 to 2.8 s in consecutive rounds on a quiet
Xeon). Compiled (CUDA), each side is compiled once and its CUDA-graph replays alternate with the
other's. An empty plan is the unchanged model: 1.00x by definition, not measured again. A plan for
an engine autoao only emulates (bench.estimate: llama.cpp's GGUF types) is not timed either: it
ships on its verdicts, with the cost model's estimate said to be one (ShippedOnEstimate).

With the user's workload (optimize's `workload`, e.g. a `generate()` call), a plan shown faster on
the forward pass is then timed in it, call by call in alternation with the model as it came, in the
user's own mode (eager, or compiled by their code), and ships only if shown faster there too
(WorkloadNotFaster): on the H200 a plan measured 1.88x on the forward pass ran 0.81x in an eager
`generate()` (benchmarks/results/2026-12-03-h200/generate-1b/).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from autoao.bench import ModelBench, Sample, interleaved, workload_rounds
from autoao.choose import Choice
from autoao.clock import PairedSpeedup, paired_speedup
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.decisions import (BestIsUnchanged, Decision, Judged, KeptUnchanged, NothingToTry, ShippedOnEstimate,
                              WorkloadNotFaster)
from autoao.ledger import RunLedger
from autoao.measure import Baselines, Measurements
from autoao.plan import Plan, apply
from autoao.records import MeasuredPlan, WorkloadTiming
from autoao.types import Accuracy, Verdict
from autoao.evaluators.timing import NOT_TIMED

MIN_ROUNDS, MAX_ROUNDS = 3, 10


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
    estimate: str = ""  # how the speed-up was estimated where it was not measured (bench.estimate)
    workload: WorkloadTiming | None = None  # the user's workload, timed after the forward pass showed a gain

    @property
    def rounds(self) -> int:
        return self.speedup.rounds


UNCHANGED = PairedSpeedup(1.0, 1.0, 1.0, 0)


def finalize(bench: ModelBench, choice: Choice, meas: Measurements, cost: CostModel, base: Baselines,
             notes: tuple[Decision, ...], ledger: RunLedger) -> Final:
    """Apply the chosen plan (fresh modules, validated) and compare it with the model as it came,
    measured in alternation (module docstring); a plan not shown faster leaves the model unchanged."""
    model = bench.model
    tried = any(isinstance(d, Judged) for d in choice.decisions)
    # the time plan's early word that the budget was too short stands only if nothing was judged
    decisions = [d for d in (*notes, *choice.decisions) if not (tried and isinstance(d, NothingToTry))]
    bench.restore()
    trial = choice.trial
    plan = bench.shipped(trial.params if trial else {}, trial=trial.number if trial else None)
    predicted_base = cost.predict(Plan())
    if not plan.layers:
        not_timed = sum(r.timing.error == NOT_TIMED for r in meas.table.rows)
        short = [i for i, d in enumerate(decisions) if isinstance(d, NothingToTry)]
        if short:  # the time plan said the budget cannot hold a search, before timing: now with its untimed cells
            decisions[short[0]] = replace(decisions[short[0]], not_timed=not_timed)
        elif all(ch == [BASELINE] for ch in meas.choices.values()):
            decisions.append(NothingToTry(not_timed))
        elif trial is not None:  # the best plan that held changes no layer
            decisions.append(BestIsUnchanged(trial.number))
            plan = bench.shipped({})
        return Final(plan, None, (), base.bf16_us, base.bf16_us, UNCHANGED, (1.0, 1.0), predicted_base,
                     predicted_base, tuple(decisions), choice.measured_plans)
    apply(model, plan, calibration=bench.calibration)
    if bench.estimate:
        predicted = cost.predict(plan)
        decisions.append(ShippedOnEstimate(plan.metadata.get("trial"), predicted_base / predicted, bench.estimate))
        ledger.say(decisions[-1].describe())
        return Final(plan, choice.accuracy, choice.verdicts, base.bf16_us, base.bf16_us, UNCHANGED, (1.0, 1.0),
                     predicted_base, predicted, tuple(decisions), choice.measured_plans, estimate=bench.estimate)
    rounds = MAX_ROUNDS if not base.compile else MIN_ROUNDS
    got_base, got_plan = interleaved(bench, bench.modules(plan), _rounds(base, ledger, rounds), settled=_settled)
    paired, spread, base_us, plan_us = _compare(got_base, got_plan)
    workload: WorkloadTiming | None = None
    refused: Decision | None = None
    if paired.low <= 1.0:
        refused = KeptUnchanged(plan.metadata.get("trial"), plan_us / 1e3, base_us / 1e3, spread[0], spread[1],
                                paired.rounds, paired.estimate, paired.low)
    elif bench.workload is not None:
        workload = _workload(bench, plan, base, ledger)
        if workload.bound <= 1.0:
            refused = WorkloadNotFaster(plan.metadata.get("trial"), paired.estimate, workload.baseline_ms,
                                        workload.plan_ms, workload.speedup, workload.bound, workload.rounds)
    if refused is not None:
        decisions.append(refused)
        ledger.say(refused.describe())
        bench.restore()
        rows = tuple(MeasuredPlan(r.trial, r.predicted_ms, r.measured_ms, False) for r in choice.measured_plans)
        return Final(bench.shipped({}), None, (), base_us, base_us, UNCHANGED, (1.0, 1.0), predicted_base,
                     predicted_base, tuple(decisions), rows)
    return Final(plan, choice.accuracy, choice.verdicts, base_us, plan_us, paired, spread, predicted_base,
                 cost.predict(plan), tuple(decisions), choice.measured_plans, workload=workload)


def _workload(bench: ModelBench, plan: Plan, base: Baselines, ledger: RunLedger) -> WorkloadTiming:
    """The user's workload with the unchanged model and with the plan (applied), in alternation:
    rounds from MIN_ROUNDS up to MAX_ROUNDS or what the time budget leaves, until they decide."""
    ledger.say("your workload, as the model came and with the plan, in alternation")
    remaining = ledger.remaining()
    fits = MAX_ROUNDS if remaining is None else int(remaining / max(2 * base.workload_s, 1e-3))
    got_base, got_plan = workload_rounds(bench, bench.modules(plan), max(MIN_ROUNDS, min(MAX_ROUNDS, fits)),
                                         settled=_settled)
    paired, spread, base_us, plan_us = _compare(got_base, got_plan)
    return WorkloadTiming(base_us / 1e3, plan_us / 1e3, paired.estimate, paired.low, spread[0], spread[1],
                          paired.rounds)


def _compare(base: list[Sample], planned: list[Sample]) -> tuple[PairedSpeedup, tuple[float, float], float, float]:
    """Interleaved rounds -> (their paired speed-up, the lowest and highest per-round ratio taken
    from the sides' p20 / p80, each side's median us)."""
    spread = (min(b[1] / p[2] for b, p in zip(base, planned)), max(b[2] / p[1] for b, p in zip(base, planned)))
    return (_paired(base, planned), spread, statistics.median(b[0] for b in base),
            statistics.median(p[0] for p in planned))


def _settled(base: list[Sample], planned: list[Sample]) -> bool:
    """Whether the rounds so far decide: after MIN_ROUNDS, the plan is shown faster (lower bound
    above 1) or not faster on average (estimate at most 1), which more rounds would rarely overturn."""
    if len(base) < MIN_ROUNDS:
        return False
    paired = _paired(base, planned)
    return paired.low > 1.0 or paired.estimate <= 1.0


def _paired(base: list[Sample], planned: list[Sample]) -> PairedSpeedup:
    """The rounds' paired speed-up, from each side's (median, p20, p80) us per round."""
    return paired_speedup([b[0] for b in base], [p[0] for p in planned])


def _rounds(base: Baselines, ledger: RunLedger, most: int) -> int:
    """The most rounds that fit in what is left of a time budget (at least MIN_ROUNDS)."""
    remaining = ledger.remaining()
    if remaining is None:
        return most
    run = base.e2e_seconds / 3 if base.compile else base.bf16_us / 1e6
    return max(MIN_ROUNDS, min(most, int((remaining - run) / max(2 * run, 1e-3))))
