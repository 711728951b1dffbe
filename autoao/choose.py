"""Stage 4b: from the search's Pareto front to the plan that may ship, by verdicts.

    choice = choose(outcome, bench, judges, time_plan, ledger)   -> Choice

The front (predicted latency against the screen's drop; plans that change no layer left out) runs
from the fastest plan to the unchanged model, which holds by definition. The chooser judges plans
of it by bisection (at most MAX_CHECKS, while the time plan allows): the first is the fastest plan
the screen admits (the search's `best`); each later one halves the stretch between the slowest plan
known not to hold and the fastest known to hold. A plan holds when every judge says HOLDS:

- the deciding judge: the user's tasks or metric (tier 2), or where the proxy decides, the proxy on
  confirmation positions the search never scored (so the fastest of many plans is not judged on
  the positions that made it look best);
- for causal LMs, greedy generation with the KV cache, against the model's own noise.

A judge adds evidence look by look (more documents, more positions) until its verdict resolves,
its evidence runs out, or the time plan has no room for another look. BREAKS and UNRESOLVED are
both "did not hold": a plan ships only on HOLDS.

Where the proxy decides, plans predicted within RERANK_BAND of the chosen one and at least as good
on the screen are measured end to end, and one that runs more than RERANK_MARGIN faster replaces
it if it holds too (the cost model sums layers timed one at a time, and ranks plans a few % apart
only as well as that sum predicts the whole model).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from torch import nn

from autoao.bench import ModelBench
from autoao.budget import MAX_CHECKS, TimePlan
from autoao.common import BASELINE
from autoao.decisions import (ChoseSlower, Decision, Judged, NoFeasiblePlan, NoneHeld, OutOfTime, PlanUnmeasurable,
                              RerankChose, RerankKept)
from autoao.ledger import RunLedger
from autoao.measure import Judges
from autoao.records import MeasuredPlan, TrialRecord
from autoao.search import SearchOutcome
from autoao.types import BREAKS, HOLDS, UNRESOLVED, Accuracy, Evidence, Verdict, combine

RERANK_BAND = 0.05  # plans predicted within 5% of the chosen one are measured end to end
RERANK_PLANS = 3  # at most this many, the chosen one included
RERANK_MARGIN = 0.03  # another plan replaces the chosen one only if measured > 3% faster


@dataclass(frozen=True)
class Choice:
    """The plan that held on every judge (trial None: none did), with its verdicts."""

    trial: TrialRecord | None
    accuracy: Accuracy | None  # the deciding judge's, with its verdict
    verdicts: tuple[Verdict, ...]
    decisions: tuple[Decision, ...]
    measured_plans: tuple[MeasuredPlan, ...] = ()


def choose(outcome: SearchOutcome, bench: ModelBench, judges: Judges, plan: TimePlan, ledger: RunLedger) -> Choice:
    """The fastest plan of the front that holds (module docstring), and every decision on the way."""
    front = [r for r in outcome.pareto if any(c != BASELINE for c in r.params.values())]  # fastest first
    if not any(r.feasible for r in outcome.pareto):
        return Choice(None, None, (), (NoFeasiblePlan(),))
    unchanged = outcome.best is not None and all(c == BASELINE for c in outcome.best.params.values())
    if unchanged and (judges.tier2 is None or not front):
        # the fastest plan the screen admits changes no layer, and where the proxy decides the screen
        # is the budget itself: nothing to judge (finalize says which trial it was)
        return Choice(outcome.best, None, (), ())
    plan.plan_verdicts()
    keys = [tuple(sorted(r.params.items())) for r in front]
    best = tuple(sorted(outcome.best.params.items())) if outcome.best is not None else None
    start = keys.index(best) if best in keys else len(front) // 2

    def check(r: TrialRecord) -> Judged:
        where = (f"plan {front.index(r) + 1} of the {len(front)} on the Pareto front, fastest first" if r in front
                 else "measured faster end to end than the chosen plan")  # the re-rank's plans need not be on it
        ledger.say(f"judging trial {r.number} ({where})")
        return judge_plan(r, bench, judges, plan, ledger)

    index, decisions = bisect(front, start, check, plan, judges.check_s)
    if index is None:
        return Choice(None, None, (), tuple(decisions))
    held = next(d for d in decisions if isinstance(d, Judged) and d.trial == front[index].number)
    choice = Choice(front[index], _deciding(held, judges), held.verdicts, tuple(decisions))
    if judges.tier2 is None:
        choice = rerank(outcome, choice, bench, judges, check, plan)
    return choice


def bisect(front: list[TrialRecord], start: int, check: Callable[[TrialRecord], Judged], plan: TimePlan,
           check_s: float) -> tuple[int | None, list[Decision]]:
    """(index of the fastest plan of `front` found to hold, or None; the decisions), by bisection
    from `start`, at most MAX_CHECKS checks, each only while the time plan allows one."""
    decisions: list[Decision] = []
    lo, hi = -1, len(front)  # front[lo] did not hold (-1: none known), front[hi] held (len: the unchanged model)
    mid, checked = start, 0
    while hi - lo > 1 and checked < MAX_CHECKS:
        if checked and not plan.allows(check_s):
            decisions.append(OutOfTime(front[mid].number, "more checks"))
            break
        judged = check(front[mid])
        decisions.append(judged)
        checked += 1
        if judged.status == HOLDS:
            hi = mid
        else:
            lo = mid
        mid = (lo + hi) // 2
    judged_all = [d for d in decisions if isinstance(d, Judged)]
    unresolved = sum(d.status == UNRESOLVED for d in judged_all)
    if hi == len(front):
        decisions.append(NoneHeld(checked, unresolved))
        return None, decisions
    if hi > 0:
        decisions.append(ChoseSlower(front[hi].number, checked, hi, sum(d.status == BREAKS for d in judged_all),
                                     unresolved, hi - 1 - lo))
    return hi, decisions


def judge_plan(r: TrialRecord, bench: ModelBench, judges: Judges, plan: TimePlan, ledger: RunLedger) -> Judged:
    """Every judge's verdict on the plan of trial `r` as it would ship (fused, on its timed kernels:
    kernels round differently, and a task's score moves with it), applied once and undone after."""
    t0 = time.perf_counter()
    shipped = bench.shipped(r.params)
    key = judges.key(shipped)
    verdicts: list[Verdict] = []
    try:
        with bench.applied(shipped):
            modules = bench.modules(shipped)
            swap = _Swap(bench, modules)
            deciding, metrics = _deciding_verdict(judges, swap, key, plan, ledger)
            verdicts.append(deciding)
            if judges.generation is not None and verdicts[0].status != BREAKS:
                swap.plan()
                verdicts.append(judges.budget.judge(judges.generation.evidence(bench.model)))
    except Exception as e:  # noqa: BLE001 - a plan that cannot run does not hold
        ledger.say(f"trial {r.number} could not be judged: {type(e).__name__}: {e}")
        return Judged(r.number, r.predicted_ms, r.drop, BREAKS, tuple(verdicts), time.perf_counter() - t0)
    judged = Judged(r.number, r.predicted_ms, r.drop, combine(verdicts), tuple(verdicts), time.perf_counter() - t0,
                    metrics)
    ledger.say(judged.describe())
    return judged


class _Swap:
    """Within `bench.applied(plan)`: the unmodified model (for a judge's reference on new
    evidence) or the plan's modules, back and forth without applying the plan again."""

    def __init__(self, bench: ModelBench, modules: dict[str, nn.Module]) -> None:
        self.bench, self.modules = bench, modules

    def reference(self) -> nn.Module:
        self.bench.install({})
        return self.bench.model

    def plan(self) -> nn.Module:
        self.bench.install(self.modules)
        return self.bench.model


def _deciding_verdict(judges: Judges, swap: _Swap, key: str, plan: TimePlan, ledger: RunLedger
                      ) -> tuple[Verdict, dict[str, float]]:
    """The deciding judge's verdict, look by look: tier 2's documents, or the proxy's confirmation
    chunks, until it resolves, the evidence runs out, or the time plan has no room for a look; and
    the plan's metrics on the last look (tier 2: each task's accuracy on the documents scored)."""
    tier2, proxy, budget = judges.tier2, judges.proxy, judges.budget
    looks = tier2.looks if tier2 is not None else max(len(proxy.confirm_inputs), 1)
    evidence: Evidence | None = None
    verdict: Verdict | None = None
    metrics: dict[str, float] = {}
    for look in range(looks):
        price = judges.check_s / looks
        if verdict is not None and not plan.allows(price):
            ledger.say("no time for more evidence: the verdict stays unresolved")
            break
        t0 = time.perf_counter()
        if tier2 is not None:
            if hasattr(tier2, "prepare"):
                tier2.prepare(swap.reference(), look)
            acc, evidence = tier2.evidence(swap.plan(), key, look)  # cumulative: all the look's documents
            metrics = dict(acc.metrics)
        else:
            if not proxy.prepare(swap.reference(), look):
                break
            more = proxy.score(swap.plan(), key, chunk=look)[1]
            evidence = more if evidence is None else evidence.merged(more)
        plan.observe(price, time.perf_counter() - t0)
        verdict = budget.judge(evidence, looks=looks)
        if verdict.status != UNRESOLVED:
            break
    if verdict is None:  # no confirmation inputs: the screen's evidence is all there is
        acc, evidence = proxy.score(swap.plan(), key)
        verdict, metrics = budget.judge(evidence), dict(acc.metrics)
    return verdict, metrics


def _deciding(judged: Judged, judges: Judges) -> Accuracy:
    """The held plan's accuracy on the deciding tier, from its verdict."""
    v = judged.verdicts[0]
    return Accuracy(judges.budget.tier, v.score, v.drop, dict(judged.metrics), judges.describe(), v)


def rerank(outcome: SearchOutcome, choice: Choice, bench: ModelBench, judges: Judges,
           check: Callable[[TrialRecord], Judged], plan: TimePlan) -> Choice:
    """The chosen plan, or a plan predicted nearly as fast and at least as good on the screen that
    runs faster end to end and holds too (module docstring)."""
    chosen = choice.trial
    assert chosen is not None
    near = [r for r in _distinct_feasible(outcome) if r.params != chosen.params and r.drop <= chosen.drop
            and r.predicted_us <= (1 + RERANK_BAND) * chosen.predicted_us][:RERANK_PLANS - 1]
    if not near:
        return choice
    if not plan.allows((len(near) + 1) * plan.costs.run_s):
        return Choice(chosen, choice.accuracy, choice.verdicts, choice.decisions + (OutOfTime(chosen.number, "the re-rank"),))
    decisions, times = list(choice.decisions), []
    for r in [chosen, *near]:
        try:
            times.append(bench.measure(r.params))
        except Exception as e:  # noqa: BLE001 - one plan failing must not lose the search's result
            decisions.append(PlanUnmeasurable(r.number, f"{type(e).__name__}: {e}"))
            times.append(math.inf)
    plans = [chosen, *near]
    best = min(range(len(plans)), key=lambda i: times[i])
    if best and times[best] * (1 + RERANK_MARGIN) < times[0] and plan.allows(judges.check_s):
        judged = check(plans[best])
        decisions.append(judged)
        if judged.status == HOLDS:
            rows = tuple(MeasuredPlan(r.number, r.predicted_ms, t / 1e3, i == best) for i, (r, t) in enumerate(zip(plans, times)))
            decisions.append(RerankChose(plans[best].number, times[best] / 1e3, chosen.number, times[0] / 1e3,
                                         chosen.predicted_ms))
            return Choice(plans[best], _deciding(judged, judges), judged.verdicts, tuple(decisions), rows)
    rows = tuple(MeasuredPlan(r.number, r.predicted_ms, t / 1e3, i == 0) for i, (r, t) in enumerate(zip(plans, times)))
    decisions.append(RerankKept(chosen.number, times[0] / 1e3, RERANK_BAND, RERANK_MARGIN,
                                {r.number: t / 1e3 for r, t in zip(plans[1:], times[1:])}))
    return Choice(chosen, choice.accuracy, choice.verdicts, tuple(decisions), rows)


def _distinct_feasible(outcome: SearchOutcome) -> list[TrialRecord]:
    """The feasible trials, fastest predicted first (then least drop), each plan once."""
    seen: set[tuple] = set()
    out = []
    for r in sorted((r for r in outcome.trials if r.feasible), key=lambda r: (r.predicted_us, r.drop)):
        key = tuple(sorted(r.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out
