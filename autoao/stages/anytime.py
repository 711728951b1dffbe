"""Stage 4b: the anytime run. The run holds an incumbent, the best plan verified so far, and spends
what the budget leaves on the plan most worth verifying next.

    run = Anytime(bench, judges, time_plan, ledger, base, cost)
    run.step(outcome)     # verify the study's most valuable plan; False: none is worth its time
    run.incumbent         # Incumbent: params, verdicts, measured rounds, when it was found
    run.curve             # CurvePoint per better plan verified: the anytime curve

At first the incumbent is the model as it came. A plan is verified when every judge holds on it
(autoao.stages.choose.judge_plan) and it is measured faster end to end than the model as it came, in
rounds interleaved with it (bench.interleaved, the bound of their paired speed-up above 1), and
faster than the incumbent (the paired estimate above the incumbent's); then it is the incumbent.
A plan that fails either half is not tried again. The cheaper half runs first (on the CPU the
measurement, where each side compiles the judges), so a plan that fails it costs no more.

Which plan next is decided by value: the odds that it holds (`hold_odds`: its screen drop,
scaled by the plans judged so far) times how much faster than the incumbent the cost model
predicts it. A plan predicted slower than the incumbent is never judged, nor, once a plan is
verified, one predicted less than MIN_GAIN faster (within the cost model's noise). On
the CPU, a uniform plan's measured speed-up anchors its candidate's cells (autoao.stages.anchors), so
later predictions, and the search's next trials, use them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from autoao.budget import CHECK_LOOKS, MAX_CHECKS, TimePlan
from autoao.clock import PairedSpeedup, paired_speedup
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.decisions import BestIsUnchanged, CheckDidNotFit, Decision, Judged, NoFeasiblePlan, NotFaster, Verified
from autoao.ledger import RunLedger
from autoao.plan import Plan
from autoao.records import AnchorRecord, CurvePoint, IncumbentRecord, MeasuredPlan, TrialRecord, WorkloadTiming
from autoao.stages import anchors
from autoao.stages.bench import ModelBench, Sample, interleaved, workload_rounds
from autoao.stages.choose import check_seconds, judge_plan
from autoao.stages.judges import Judges
from autoao.stages.search import SearchOutcome, plan_from_params, predicted_us
from autoao.types import BREAKS, HOLDS, Accuracy, FromBytes, Verdict

MIN_GAIN = 0.02  # a plan is judged only if predicted this much faster than the incumbent
MIN_VALUE = 0.005  # nor when its odds times that gain is below this: a search slice is worth more
SECURE_VALUE = 0.05  # before the first incumbent, a plan this valuable is verified before more trials
MIN_ROUNDS, MAX_ROUNDS = 3, 10  # interleaved rounds of a verification's measurement (CPU)
ROUNDS_SHARE = 0.5  # a measurement's rounds past MIN_ROUNDS take at most this share of the time left
HOLD_ODDS = (0.05, 0.9)  # no plan is sure to hold or to break before it is judged


@dataclass(frozen=True)
class Speed:
    """A plan measured end to end in rounds interleaved with the model as it came."""

    base: tuple[Sample, ...]  # per round: the model as it came, (median, p20, p80) us
    plan: tuple[Sample, ...]
    workload: WorkloadTiming | None = None  # the user's workload, where given

    @property
    def paired(self) -> PairedSpeedup:
        return paired_speedup([b[0] for b in self.base], [p[0] for p in self.plan])


@dataclass(frozen=True)
class Incumbent:
    """The best plan verified so far (trial None and no params: the model as it came)."""

    params: dict[str, str] = field(default_factory=dict)
    trial: int | None = None
    accuracy: Accuracy | None = None  # the deciding judge's, with its verdict
    verdicts: tuple[Verdict, ...] = ()
    speed: Speed | None = None  # None: the model as it came, or a plan priced from weight bytes
    found_s: float = 0.0
    source: str = "start"

    @property
    def speedup(self) -> float:
        return self.speed.paired.estimate if self.speed is not None else 1.0

    def record(self) -> IncumbentRecord:
        base = [list(s) for s in self.speed.base] if self.speed else []
        plan = [list(s) for s in self.speed.plan] if self.speed else []
        return IncumbentRecord(dict(self.params), self.trial, self.accuracy, list(self.verdicts), base, plan,
                               self.found_s, self.source, self.speed.workload if self.speed else None)

    @classmethod
    def from_record(cls, r: IncumbentRecord) -> Incumbent:
        speed = Speed(tuple(tuple(x) for x in r.base_rounds), tuple(tuple(x) for x in r.plan_rounds),  # type: ignore[misc]
                      r.workload) if r.base_rounds else None
        return cls(dict(r.params), r.trial, r.accuracy, tuple(r.verdicts), speed, r.found_s, "resumed")


def params_key(params: dict[str, str]) -> str:
    """A plan's identity among the study's trials: its non-unchanged choices."""
    return ";".join(f"{g}={c}" for g, c in sorted(params.items()) if c != BASELINE)


def tenths(seconds: float) -> float:
    """`seconds` rounded down to a tenth: a curve point never lies after the run's end."""
    return math.floor(seconds * 10) / 10


def hold_odds(drop: float, judged: list[Judged], screen: float) -> float:
    """The odds that a plan whose screen drop is `drop` holds on every judge, in HOLD_ODDS. A plan
    screened no worse than one that held is likely to hold; no better than one that broke, likely
    to break. Otherwise the drop is scaled to the deciding judge's budget: by the largest ratio a
    plan that broke showed (its deciding drop over the budget, per unit of its screen drop, as the
    screen and the deciding judge move together but not one to one), else by the screen's own
    limit (`screen`): the odds fall linearly from 1 at no drop to 0 at the budget."""
    low, high = HOLD_ODDS
    if any(j.status == HOLDS and drop <= j.proxy_drop for j in judged):
        return high
    broke = [j for j in judged if j.status == BREAKS]
    if any(drop >= j.proxy_drop for j in broke):
        return low
    scales = [v.drop / v.max_drop / j.proxy_drop for j in broke if j.proxy_drop > 0
              for v in j.verdicts[:1] if v.max_drop > 0 and v.status == BREAKS]
    used = max(drop, 0.0) * (max(scales) if scales else 1.0 / max(screen, 1e-9))
    return min(high, max(low, 1.0 - used))


class Anytime:
    """The incumbent and how it gets better (module docstring). `on_better(incumbent)` is called
    after each new incumbent (the caller writes it to disk)."""

    def __init__(self, bench: ModelBench, judges: Judges, time_plan: TimePlan, ledger: RunLedger, cost: CostModel,
                 measure_s: float, *, incumbent: Incumbent | None = None, tried: dict[str, str] | None = None,
                 on_better: Callable[[Incumbent], None] | None = None) -> None:
        """measure_s: what a verification's measurement costs (both sides, MIN_ROUNDS rounds, their
        compiles); incumbent and tried: what an earlier run of the same command verified and tried."""
        self.bench, self.judges, self.time_plan, self.ledger = bench, judges, time_plan, ledger
        self.cells, self.cost, self.measure_s, self.on_better = cost, cost, measure_s, on_better
        # the model as it came, or an earlier run's incumbent, is this run's from its start
        self.incumbent = replace(incumbent, found_s=0.0) if incumbent else Incumbent()
        self.tried: dict[str, str] = dict(tried or {})
        self.judged: list[Judged] = []
        self.decisions: list[Decision] = []
        self.anchors: list[AnchorRecord] = []
        self.measured: list[MeasuredPlan] = []  # every plan measured end to end while verifying
        self.verifications = 0  # plans this run set out to verify
        self.curve = [CurvePoint(tenths(self.incumbent.found_s), self.incumbent.speedup, self._bound(self.incumbent),
                                 self._words(self.incumbent.params), self.incumbent.trial, self.incumbent.source)]

    ##### what to verify next ###################################################################

    def predicted_us(self, params: dict[str, str]) -> float:
        return predicted_us(self.bench.groups, self.cost, params)

    def ranked(self, outcome: SearchOutcome) -> list[tuple[float, TrialRecord]]:
        """(value, trial) of every feasible plan of the study not tried yet and predicted faster than
        the incumbent (by more than MIN_GAIN once a plan is verified), most valuable first; value =
        hold_odds x the predicted gain over the incumbent."""
        base = self.predicted_us(self.incumbent.params)
        least = MIN_GAIN if self.incumbent.params else 0.0  # anything faster beats the model as it came
        out, seen = [], set()
        for r in outcome.trials:
            key = params_key(r.params)
            if r.state != "COMPLETE" or not r.feasible or not key or key in self.tried or key in seen:
                continue
            seen.add(key)
            gain = base / self.predicted_us(r.params) - 1.0
            if gain > least:
                out.append((hold_odds(r.drop, self.judged, self.judges.budget.limit(1)) * gain, r))
        return sorted(out, key=lambda vr: -vr[0])

    def worth_securing(self, outcome: SearchOutcome | None) -> bool:
        """Before the first incumbent: whether `outcome` already holds a plan worth verifying now
        (value at least SECURE_VALUE, e.g. even odds of holding and 10% predicted faster), so the
        search's first slice ends for its check."""
        return (outcome is not None and not self.incumbent.params
                and any(value >= SECURE_VALUE for value, _ in self.ranked(outcome)[:1]))

    def price(self) -> float:
        """Seconds a verification is expected to cost: CHECK_LOOKS looks of every judge (never more
        than its check at worst, the unmodified model's side included before the first check) and
        the measurement: what the time plan reserves for the first one."""
        once = self.judges.once_s if not self.judged else 0.0
        worst = self.judges.check_s + once
        return min(CHECK_LOOKS * check_seconds(self.judges, first_looks=True), worst) + self.measure_s

    def first_price(self) -> float:
        """Seconds the cheapest verification costs: each judge's first look and the measurement."""
        return check_seconds(self.judges, first_looks=True) + self.measure_s

    ##### verifying #############################################################################

    def step(self, outcome: SearchOutcome) -> TrialRecord | None:
        """Verify the most valuable plan of `outcome` if its value is at least MIN_VALUE and its
        first looks and measurement fit the time plan (without a time budget: while fewer than
        MAX_CHECKS plans were tried); the trial tried, or None (nothing worth it, or no room)."""
        ranked = self.ranked(outcome)
        if not ranked or ranked[0][0] < MIN_VALUE or not self.time_plan.allows(self.first_price()):
            return None
        if self.ledger.remaining() is None and self.verifications >= MAX_CHECKS:
            return None
        self.verifications += 1
        r = ranked[0][1]
        self.verify(r, source=_source(r, self.bench.groups))
        return r

    def measured_plans(self) -> tuple[MeasuredPlan, ...]:
        """The plans measured end to end while verifying, the incumbent's marked chosen."""
        return tuple(replace(m, chosen=m.trial == self.incumbent.trial) for m in self.measured)

    def conclude(self, outcome: SearchOutcome) -> None:
        """Where the run ends with nothing verified, why: the plan it would have verified next did
        not fit (what that needed and a budget that would have held it), or no plan was worth
        verifying (none screened within the budget, or the best changes no layer)."""
        if self.incumbent.params or self.judged or self.measured or all(len(g.choices) == 1 for g in self.bench.groups):
            return  # (nothing to choose from: finalize says so)
        ranked = self.ranked(outcome)
        feasible = [r for r in outcome.trials if r.state == "COMPLETE" and r.feasible]
        if ranked and self.ledger.remaining() is not None:
            r = ranked[0][1]
            needed = self.time_plan.slowdown * self.price() + self.time_plan.final_reserve()
            left = max(self.ledger.remaining() or 0.0, 0.0)
            suggest = math.ceil((self.ledger.elapsed() + needed) / 30) * 30
            self._say(CheckDidNotFit(r.number, self._words(r.params), needed, left, suggest))
        elif not ranked and feasible:
            best = min(feasible, key=lambda r: (self.predicted_us(r.params), r.drop))
            self._say(BestIsUnchanged(best.number))
        elif not feasible and outcome.trials:
            self._say(NoFeasiblePlan())

    def verify(self, r: TrialRecord, source: str) -> bool:
        """Both halves of verifying trial r's plan, the cheaper first; True when it is the new incumbent."""
        key = params_key(r.params)
        self.ledger.say(f"verifying trial {r.number} ({source}: {self._words(r.params)}; predicted "
                        f"{self.predicted_us(self.incumbent.params) / self.predicted_us(r.params):.2f}x the best so far)")
        speed: Speed | None = None
        judged: Judged | None = None
        for half in self._order():
            if half == "speed":
                speed = self._speed(r)
                if speed is None:
                    self.tried[key] = "not faster"
                    return False
            else:
                judged = judge_plan(r, self.bench, self.judges, self.time_plan, self.ledger)
                self.judged.append(judged)
                self.decisions.append(judged)
                if judged.status != HOLDS:
                    self.tried[key] = judged.status
                    return False
        assert judged is not None
        self.tried[key] = "verified"
        self._better(Incumbent(dict(r.params), r.number, _deciding(judged, self.judges), judged.verdicts, speed,
                               self.ledger.elapsed(), source))
        return True

    def _order(self) -> tuple[str, ...]:
        """The cheaper half first: the measurement, or (where each side compiles) the judges. A plan
        priced from weight bytes is not measured."""
        if isinstance(self.bench.pricing, FromBytes):
            return ("accuracy",)
        judging = check_seconds(self.judges, first_looks=True)
        return ("speed", "accuracy") if self.measure_s <= judging else ("accuracy", "speed")

    def _speed(self, r: TrialRecord) -> Speed | None:
        """The plan as it ships, measured in interleaved rounds (and in the user's workload, where
        given); None, with the decision said, when it is not shown faster than the model as it came
        and the incumbent. A uniform plan anchors its candidate's cells (CPU)."""
        shipped = self.bench.shipped(r.params, trial=r.number)
        t0 = time.perf_counter()
        rounds = self._rounds()
        with self.bench.applied(shipped):
            applied = self.bench.modules(shipped)
            base, planned = interleaved(self.bench, applied, rounds, settled=self._settled)
            speed = Speed(tuple(base), tuple(planned))
            paired = speed.paired
            if paired.low > 1.0 and paired.estimate > self.incumbent.speedup and self.bench.workload is not None:
                speed = replace(speed, workload=self._workload(applied))
        self.time_plan.observe(self.measure_s * len(base) / MIN_ROUNDS, time.perf_counter() - t0)
        self.measured.append(MeasuredPlan(r.number, self.predicted_us(r.params) / 1e3,
                                          statistics.median(p[0] for p in planned) / 1e3, False))
        self._anchor(r, shipped, statistics.median(b[0] / q[0] for b, q in zip(base, planned)), len(base))
        work = speed.workload
        if paired.low <= 1.0 or paired.estimate <= self.incumbent.speedup or (work is not None and work.bound <= 1.0):
            est, low = (work.speedup, work.bound) if work is not None else (paired.estimate, paired.low)
            self._say(NotFaster(r.number, est, low, paired.rounds, self.incumbent.speedup, work is not None))
            return None
        return speed

    def _rounds(self) -> int:
        """Interleaved rounds a measurement may take (it stops once they decide: _settled): up to
        MAX_ROUNDS on the CPU within ROUNDS_SHARE of what is left after a check's first looks and
        the end, MIN_ROUNDS where each side compiles (each replays many rounds)."""
        if self.bench.compile:
            return MIN_ROUNDS
        per_round = self.measure_s / (MIN_ROUNDS + 0.5)  # a round is two runs; the warm-up one more
        left = self.ledger.remaining()
        if left is None:
            return MAX_ROUNDS
        room = left - self.time_plan.final_reserve() - check_seconds(self.judges, first_looks=True)
        return max(MIN_ROUNDS, min(MAX_ROUNDS, int(ROUNDS_SHARE * room / max(per_round, 1e-3))))

    def _settled(self, base: list[Sample], planned: list[Sample]) -> bool:
        """The rounds so far decide: after MIN_ROUNDS, shown faster than the model as it came (the
        bound above 1), or not faster on average with most rounds agreeing (their median ratio too:
        one disturbed round does not end a measurement that more rounds would decide)."""
        if len(base) < MIN_ROUNDS:
            return False
        paired = paired_speedup([b[0] for b in base], [p[0] for p in planned])
        median = statistics.median(b[0] / p[0] for b, p in zip(base, planned))
        return paired.low > 1.0 or (paired.estimate <= 1.0 and median <= 1.0)

    def _workload(self, applied: dict) -> WorkloadTiming:
        """The user's workload as the model came and with the plan, call by call in alternation."""
        self.ledger.say("your workload, as the model came and with the plan, in alternation")
        base, planned = workload_rounds(self.bench, applied, MAX_ROUNDS, settled=self._settled)
        speed = Speed(tuple(base), tuple(planned))
        p = speed.paired
        spread = (min(b[0] / q[0] for b, q in zip(base, planned)), max(b[0] / q[0] for b, q in zip(base, planned)))
        return WorkloadTiming(statistics.median(b[0] for b in base) / 1e3,
                              statistics.median(q[0] for q in planned) / 1e3, p.estimate, p.low, spread[0], spread[1],
                              p.rounds)

    def _anchor(self, r: TrialRecord, shipped: Plan, speedup: float, rounds: int) -> None:
        """Scale a uniform plan's candidate cells to its measured speed-up (anchors.anchor: the
        rounds' median ratio, so one disturbed round cannot set it), and every unmeasured
        candidate's by the median factor (anchors.anchored), where the cost model sums cells the
        model does not run alike (the CPU, eager)."""
        names = set(r.params.values()) - {BASELINE}
        if self.bench.compile or len(names) != 1 or any(a.candidate == next(iter(names)) for a in self.anchors):
            return
        record = anchors.anchor(self.cells, next(iter(names)), shipped, speedup, rounds)
        self.anchors.append(record)
        self.cost = anchors.anchored(self.cells, self.anchors)
        self.ledger.say(f"anchored {record.candidate}: {record.measured:.2f}x measured, {record.predicted:.2f}x from "
                        f"its cells (scaled {record.factor:.2f})")

    def _better(self, new: Incumbent) -> None:
        self.incumbent = new
        p = new.speed.paired if new.speed is not None else None
        point = CurvePoint(tenths(new.found_s), new.speedup, self._bound(new), self._words(new.params), new.trial,
                           new.source)
        self.curve.append(point)
        self._say(Verified(new.trial if new.trial is not None else -1, point.plan, point.speedup, point.bound,
                           p.rounds if p else 0, new.found_s, new.source))
        if self.on_better is not None:
            self.on_better(new)

    ##### words #################################################################################

    def _words(self, params: dict[str, str]) -> str:
        plan = plan_from_params(self.bench.groups, params)
        return plan.words() if plan.layers else "the model as it came"

    @staticmethod
    def _bound(inc: Incumbent) -> float:
        return inc.speed.paired.low if inc.speed is not None else 1.0

    def _say(self, d: Decision) -> None:
        self.decisions.append(d)
        self.ledger.say(d.describe())


def _source(r: TrialRecord, groups: list) -> str:
    """What proposed trial r's plan: the warm start's uniform or fallback seeds, or the sampler."""
    if not r.warm_start:
        return "search"
    names = set(r.params.values()) - {BASELINE}
    return "uniform" if len(names) == 1 and all(r.params[g.name] != BASELINE for g in groups
                                                  if next(iter(names)) in g.choices) else "fallback"


def _deciding(judged: Judged, judges: Judges) -> Accuracy:
    """The verified plan's accuracy on the deciding tier, from its verdict."""
    v = judged.verdicts[0]
    return Accuracy(judges.budget.tier, v.score, v.drop, dict(judged.metrics), judges.describe(), v)
