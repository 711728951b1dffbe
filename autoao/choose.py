"""Stage 4b: from the search's Pareto front to the plan that may ship, by verdicts.

    choice = choose(outcome, bench, judges, time_plan, ledger)   -> Choice

The front (predicted latency against the screen's drop; plans that change no layer left out) runs
from the fastest plan to the unchanged model, which holds by definition. The chooser judges plans
of it by bisection (at most MAX_CHECKS, while the time plan allows): the first is the fastest plan
the screen admits (the search's `best`); each later one lies between the slowest plan known not to
hold and the fastest known to hold: the fastest of them the screen predicts to hold once scaled by
the plans judged so far (`next_index`), else the one halfway. A plan holds when every judge says HOLDS:

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
only as well as that sum predicts the whole model). Not where the cost model is an estimate for an
engine autoao only emulates (llama.cpp): there an end-to-end time would measure the emulation.
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

    index, decisions = bisect(front, start, check, plan, sum(_look_prices(judges)))
    if index is None:
        return Choice(None, None, (), tuple(decisions))
    held = next(d for d in decisions if isinstance(d, Judged) and d.trial == front[index].number)
    choice = Choice(front[index], _deciding(held, judges), held.verdicts, tuple(decisions))
    if judges.tier2 is None and not bench.estimate:  # an estimate's plans cannot be timed here
        choice = rerank(outcome, choice, bench, judges, check, plan)
    return choice


def bisect(front: list[TrialRecord], start: int, check: Callable[[TrialRecord], Judged], plan: TimePlan,
           first_looks_s: float) -> tuple[int | None, list[Decision]]:
    """(index of the fastest plan of `front` found to hold, or None; the decisions), by bisection
    from `start`, at most MAX_CHECKS checks. A check after the first starts only while the time plan
    allows `first_looks_s`, the first look of every judge: not the check at worst, since each later
    look asks the plan again and a check cut short ends unresolved, which ships nothing."""
    decisions: list[Decision] = []
    lo, hi = -1, len(front)  # front[lo] did not hold (-1: none known), front[hi] held (len: the unchanged model)
    mid, checked = start, 0
    while hi - lo > 1 and checked < MAX_CHECKS:
        if checked and not plan.allows(first_looks_s):
            decisions.append(OutOfTime(front[mid].number, "more checks"))
            break
        judged = check(front[mid])
        decisions.append(judged)
        checked += 1
        if judged.status == HOLDS:
            hi = mid
        else:
            lo = mid
        mid = next_index(front, lo, hi, [d for d in decisions if isinstance(d, Judged)])
    judged_all = [d for d in decisions if isinstance(d, Judged)]
    unresolved = sum(d.status == UNRESOLVED for d in judged_all)
    if hi == len(front):
        decisions.append(NoneHeld(checked, unresolved))
        return None, decisions
    if hi > 0:
        decisions.append(ChoseSlower(front[hi].number, checked, hi, sum(d.status == BREAKS for d in judged_all),
                                     unresolved, hi - 1 - lo))
    return hi, decisions


def next_index(front: list[TrialRecord], lo: int, hi: int, judged: list[Judged]) -> int:
    """The plan of `front` (fastest first) to judge next, strictly between front[lo] (did not hold;
    -1: none known) and front[hi] (held; len(front): the unchanged model): the fastest the screen
    predicts to hold, scaled by the plans judged so far, else the one halfway.

    The screen's drop (its own metric, on its own positions) and the deciding judge's drop move
    together but not one to one. Each plan the deciding judge found to break gives a scale: the
    fraction of the budget its drop used, per unit of its screen drop. The largest scale is used,
    so a plan is picked only if every broken plan's scale puts it within the budget (a plan that
    held bounds nothing: its drop may sit anywhere below the limit). Plain halving can step far
    past a plan nearly as fast: after SmolLM2's fastest screened plan broke at 1.34 points of 1, the
    plan halfway was predicted 1.8x slower than uniform int8_wo, whose screen drop was under half the
    broken plan's (results/2026-12-03-h200/ceiling-smollm2-decode/search-0.01/pareto.json)."""
    scales = [v.drop / v.max_drop / j.proxy_drop for j in judged if j.verdicts and j.proxy_drop > 0
              for v in j.verdicts[:1] if v.status == BREAKS and v.max_drop > 0]
    if scales:
        scale = max(scales)
        within = [i for i in range(lo + 1, hi) if scale * max(front[i].drop, 0.0) <= 1.0]
        if within:
            return within[0]
    return (lo + hi) // 2


def judge_plan(r: TrialRecord, bench: ModelBench, judges: Judges, plan: TimePlan, ledger: RunLedger) -> Judged:
    """Every judge's verdict on the plan of trial `r` as it would ship (fused, on its timed kernels:
    kernels round differently, and a task's score moves with it), applied once and undone after."""
    t0 = time.perf_counter()
    shipped = bench.shipped(r.params)
    key = judges.key(shipped)
    verdicts: list[Verdict] = []
    metrics: dict[str, float] = {}
    try:
        with bench.applied(shipped):
            swap = _Swap(bench, bench.modules(shipped))
            runs = _judges(judges, swap, key)
            for i, judge in enumerate(runs):
                verdict, got = _looks(judge, judges, plan, ledger, after_s=sum(j.price for j in runs[i + 1:]))
                verdicts.append(verdict)
                metrics = metrics or got  # the deciding judge's, first
                if verdict.status == BREAKS:
                    break
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


@dataclass(frozen=True)
class _Judge:
    """One judge as the chooser runs it: `step(look)` -> the evidence so far and the plan's metrics
    (None: no evidence left); `looks`, its Bonferroni count; `price`, a look's seconds at worst."""

    step: Callable[[int], tuple[Evidence, dict[str, float]] | None]
    looks: int
    price: float


def _judges(judges: Judges, swap: _Swap, key: str) -> list[_Judge]:
    """The deciding judge (tier 2's documents, or the proxy's confirmation chunks) and, for causal
    LMs, the generation check: each adds evidence look by look."""
    tier2, proxy, generation = judges.tier2, judges.proxy, judges.generation
    taken: dict[str, Evidence] = {}

    def merged(name: str, more: Evidence) -> Evidence:
        taken[name] = more if name not in taken else taken[name].merged(more)
        return taken[name]

    def deciding(look: int) -> tuple[Evidence, dict[str, float]] | None:
        if tier2 is not None:
            if hasattr(tier2, "prepare"):
                tier2.prepare(swap.reference(), look)
            acc, evidence = tier2.evidence(swap.plan(), key, look)  # cumulative: all the look's documents
            return evidence, dict(acc.metrics)
        if not proxy.prepare(swap.reference(), look):  # no confirmation inputs: the screen is all there is
            if look:
                return None
            acc, evidence = proxy.score(swap.plan(), key)
            return evidence, dict(acc.metrics)
        acc, evidence = proxy.score(swap.plan(), key, chunk=look)
        return merged("proxy", evidence), dict(acc.metrics)

    def generated(look: int) -> tuple[Evidence, dict[str, float]] | None:
        assert generation is not None
        generation.prepare(swap.reference(), look)
        return merged("generation", generation.evidence(swap.plan(), look)), {}

    deciding_price, generation_price = _look_prices(judges)
    out = [_Judge(deciding, _deciding_looks(judges), deciding_price)]
    if generation is not None:
        out.append(_Judge(generated, generation.looks, generation_price))
    return out


def _deciding_looks(judges: Judges) -> int:
    return judges.tier2.looks if judges.tier2 is not None else max(len(judges.proxy.confirm_inputs), 1)


def _look_prices(judges: Judges) -> tuple[float, float]:
    """Seconds of one look at worst: the deciding judge's, the generation check's (0: none). Each
    judge's share of a check, spread evenly over its looks."""
    deciding = max(judges.check_s - judges.generation_s, 0.0) / _deciding_looks(judges)
    generation = judges.generation_s / judges.generation.looks if judges.generation is not None else 0.0
    return deciding, generation


def _looks(judge: _Judge, judges: Judges, plan: TimePlan, ledger: RunLedger,
           after_s: float = 0.0) -> tuple[Verdict, dict[str, float]]:
    """A judge's verdict, look by look, until it resolves, its evidence runs out, or the time plan
    has no room for another look and `after_s` (the later judges' first looks, which always run);
    and the plan's metrics on the last look."""
    verdict: Verdict | None = None
    metrics: dict[str, float] = {}
    for look in range(judge.looks):
        if verdict is not None and not plan.allows(judge.price + after_s):
            ledger.say("no time for more evidence: the verdict stays unresolved")
            break
        t0 = time.perf_counter()
        got = judge.step(look)
        if got is None:
            break
        evidence, metrics = got
        plan.observe(judge.price, time.perf_counter() - t0)
        verdict = judges.budget.judge(evidence, looks=judge.looks)
        if verdict.status != UNRESOLVED:
            break
    assert verdict is not None, "every judge has a first look"
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
    if best and times[best] * (1 + RERANK_MARGIN) < times[0] and plan.allows(sum(_look_prices(judges))):
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
