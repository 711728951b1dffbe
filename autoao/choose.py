"""Judging one plan: every judge's verdict on it, as it would ship, look by look.

    judged = judge_plan(trial, bench, judges, time_plan, ledger)   -> Judged (a decision)
    check_seconds(judges, first_looks=True)                        -> what a check costs

A plan holds when every judge says HOLDS:

- the deciding judge: the user's tasks or metric (tier 2), or where the proxy decides, the proxy on
  confirmation positions the search never scored (so the fastest of many plans is not judged on
  the positions that made it look best);
- for causal LMs, greedy generation with the KV cache, against the model's own noise.

A judge adds evidence look by look (more documents, more positions) until its verdict resolves,
its evidence runs out, or the time plan has no room for another look. BREAKS and UNRESOLVED are
both "did not hold": a plan ships only on HOLDS. Which plans are judged, and when, is the anytime
run's choice (autoao.anytime).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from torch import nn

from autoao.bench import ModelBench
from autoao.budget import TimePlan
from autoao.decisions import Judged
from autoao.ledger import RunLedger
from autoao.judges import Judges, deciding_looks, look_prices
from autoao.records import TrialRecord
from autoao.types import BREAKS, UNRESOLVED, Evidence, Verdict, combine


def check_seconds(judges: Judges, first_looks: bool = False) -> float:
    """Seconds a check costs at worst: every look of every judge; with `first_looks`, each judge's
    first look (a check starts only when those fit: each later look asks the time plan again)."""
    return sum(look_prices(judges)) if first_looks else judges.check_s


def judge_plan(r: TrialRecord, bench: ModelBench, judges: Judges, time_plan: TimePlan, ledger: RunLedger) -> Judged:
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
                verdict, got = _looks(judge, judges, time_plan, ledger, after_s=sum(j.price for j in runs[i + 1:]))
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

    deciding_price, generation_price = look_prices(judges)
    out = [_Judge(deciding, deciding_looks(judges), deciding_price)]
    if generation is not None:
        out.append(_Judge(generated, generation.looks, generation_price))
    return out


def _looks(judge: _Judge, judges: Judges, time_plan: TimePlan, ledger: RunLedger,
           after_s: float = 0.0) -> tuple[Verdict, dict[str, float]]:
    """A judge's verdict, look by look, until it resolves, its evidence runs out, or the time plan
    has no room for another look and `after_s` (the later judges' first looks, which always run);
    and the plan's metrics on the last look."""
    verdict: Verdict | None = None
    metrics: dict[str, float] = {}
    for look in range(judge.looks):
        if verdict is not None and not time_plan.allows(judge.price + after_s):
            ledger.say("no time for more evidence: the verdict stays unresolved")
            break
        t0 = time.perf_counter()
        got = judge.step(look)
        if got is None:
            break
        evidence, metrics = got
        time_plan.observe(judge.price, time.perf_counter() - t0)
        verdict = judges.budget.judge(evidence, looks=judge.looks)
        if verdict.status != UNRESOLVED:
            break
    assert verdict is not None, "every judge has a first look"
    return verdict, metrics
