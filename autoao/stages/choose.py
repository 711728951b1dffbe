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
run's choice (autoao.stages.anytime).
"""

from __future__ import annotations

import time

from torch import nn

from autoao.budget import TimePlan
from autoao.decisions import Judged
from autoao.evaluators.judge import Judge
from autoao.ledger import RunLedger
from autoao.records import TrialRecord
from autoao.stages.bench import ModelBench
from autoao.stages.judges import Judges
from autoao.types import BREAKS, UNRESOLVED, Verdict, combine


def check_seconds(judges: Judges, first_looks: bool = False) -> float:
    """Seconds a check costs at worst: every look of every judge; with `first_looks`, each judge's
    first look (a check starts only when those fit: each later look asks the time plan again)."""
    return judges.first_s if first_looks else judges.check_s


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
            swap = Swap(bench, bench.modules(shipped))
            checks = judges.checks
            for i, judge in enumerate(checks):
                verdict, got = looks(judge, swap, key, judges, time_plan, ledger,
                                     after_s=sum(j.look_s for j in checks[i + 1:]))
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


class Swap:
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


def looks(judge: Judge, swap: Swap, key: str, judges: Judges, time_plan: TimePlan, ledger: RunLedger,
          after_s: float = 0.0) -> tuple[Verdict, dict[str, float]]:
    """A judge's verdict on the plan `key` names, look by look (its reference side with the
    unmodified model installed, then the plan's), until it resolves, its evidence runs out, or the
    time plan has no room for another look and `after_s` (the later judges' first looks, which
    always run); and the plan's metrics on the last look."""
    verdict: Verdict | None = None
    metrics: dict[str, float] = {}
    for look in range(judge.looks):
        if verdict is not None and not time_plan.allows(judge.look_s + after_s):
            ledger.say("no time for more evidence: the verdict stays unresolved")
            break
        t0 = time.perf_counter()
        judge.prepare(swap.reference(), look)
        got = judge.evidence_through(swap.plan(), key, look)
        if got is None:
            break
        evidence, metrics = got
        time_plan.observe(judge.look_s, time.perf_counter() - t0)
        verdict = judges.budget.judge(evidence, looks=judge.looks)
        if verdict.status != UNRESOLVED:
            break
    assert verdict is not None, "every judge has a first look"
    return verdict, metrics
