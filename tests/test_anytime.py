"""The anytime run (autoao.stages.anytime): the incumbent is the best plan verified so far, on both halves,
and the run verifies plans in order of value. Driven with fakes: a bench whose plans take known
times, and judges whose verdicts are planted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autoao.stages import anytime as A
from autoao.budget import AccuracyBudget, Costs, TimePlan
from autoao.cost import CostModel
from autoao.decisions import Judged
from autoao.ledger import RunLedger
from autoao.records import TrialRecord
from autoao.stages.search import Group, SearchOutcome, plan_from_params
from autoao.types import BREAKS, HOLDS, UNRESOLVED, Accuracy, Budget, Timed, Verdict

NAMES = ("int8_wo", "int8_dyn", "int4_wo(group_size=64)")
GROUPS = [Group(f"l{i}", (f"l{i}",), ("bf16", *NAMES)) for i in range(2)]
# us per layer: bf16 100, int8_wo 60, int8_dyn 50, int4 40; the rest of the model 0
LAYER_US = {"bf16": 100.0, "int8_wo": 60.0, "int8_dyn": 50.0, "int4_wo(group_size=64)": 40.0}


def _cost() -> CostModel:
    return CostModel({g.fqns[0]: dict(LAYER_US) for g in GROUPS})


class FakeBench:
    """Plans measure as the cost model predicts them, times `measured` where given."""

    compile, pricing, workload = False, Timed(), None
    groups = GROUPS

    def __init__(self, measured: dict[str, float] | None = None) -> None:
        self.measured = measured or {}

    def shipped(self, params, **metadata):
        return plan_from_params(GROUPS, params, **metadata)

    def applied(self, plan):
        import contextlib

        return contextlib.nullcontext(plan)

    def modules(self, plan):
        return plan


def _interleaved(bench, applied, rounds, settled=None):
    """Each round: the unchanged model 200 us, the plan its predicted time (times a planted factor)."""
    params = {fqn: c.name for fqn, c in applied.layers.items()}
    us = sum(LAYER_US[params.get(g.name, "bf16")] for g in GROUPS) * bench.measured.get(A.params_key(params), 1.0)
    jitter = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    return [(200.0 * j, 200.0 * j, 200.0 * j) for j in jitter[:rounds]], \
        [(us * j, us * j, us * j) for j in jitter[:rounds]]


def _verdict(status: str, drop: float) -> Verdict:
    return Verdict(status, "fake", 2, "fake acc", "documents", 64, drop, drop - 0.01, drop + 0.01, 0.01, 0.5,
                   0.5 - drop)


def _record(number: int, params: dict, drop: float, warm: bool = False) -> TrialRecord:
    us = sum(LAYER_US[c] for c in params.values())
    return TrialRecord(number, "COMPLETE", params, us, Accuracy(1, 0.5 - drop, drop, {}, "fake proxy"), True,
                       warm_start=warm)


def _run(monkeypatch, holds: set[int], measured: dict[str, float] | None = None, seconds: float | None = None,
         unresolved: set[int] = frozenset()):
    """An Anytime over the fake bench whose judge holds trials in `holds`; returns it and the trials judged."""
    judged: list[int] = []

    def judge_plan(r, bench, judges, time_plan, ledger):
        judged.append(r.number)
        status = HOLDS if r.number in holds else UNRESOLVED if r.number in unresolved else BREAKS
        drop = 0.004 if status == HOLDS else 0.03
        return Judged(r.number, r.predicted_ms, r.drop, status, (_verdict(status, drop),), 0.1)

    monkeypatch.setattr(A, "judge_plan", judge_plan)
    monkeypatch.setattr(A, "interleaved", _interleaved)
    budget = Budget(seconds=seconds) if seconds else Budget(trials=1)
    ledger = RunLedger(budget, progress=False)
    judges = SimpleNamespace(budget=AccuracyBudget.create(0.01, tier2=True), check_s=1.0, once_s=0.0, first_s=0.5,
                             describe=lambda: "fake")
    time_plan = TimePlan(ledger, Costs(0.01, 1.0, 0.5))
    return A.Anytime(FakeBench(measured), judges, time_plan, ledger, _cost(), 0.5), judged


def _outcome(trials: list[TrialRecord]) -> SearchOutcome:
    return SearchOutcome(None, GROUPS, trials, trials, None, 0.0, "")


def test_a_planted_plan_that_breaks_never_becomes_the_incumbent(monkeypatch):
    """The fastest plan is measured faster but breaks the budget: the model as it came stays the
    incumbent, the plan is not tried again, and the next plan is the one verified."""
    trials = [_record(0, {"l0": "int4_wo(group_size=64)", "l1": "int4_wo(group_size=64)"}, 0.01, warm=True),
              _record(1, {"l0": "int8_wo", "l1": "int8_wo"}, 0.01, warm=True)]
    run, judged = _run(monkeypatch, holds={1})
    assert run.step(_outcome(trials)) is trials[0]
    assert run.incumbent.params == {} and run.incumbent.speedup == 1.0 and run.tried == {A.params_key(trials[0].params): BREAKS}
    assert [p.plan for p in run.curve] == ["the model as it came"]
    assert run.step(_outcome(trials)) is trials[1] and judged == [0, 1]
    assert run.incumbent.trial == 1 and run.incumbent.verdicts[0].status == HOLDS
    assert run.incumbent.speedup == pytest.approx(200 / 120, rel=0.02) and run.incumbent.source == "uniform"
    assert len(run.curve) == 2 and run.curve[-1].trial == 1 and run.curve[-1].bound > 1.0
    assert run.step(_outcome(trials)) is None  # nothing left predicted faster than the incumbent
    assert [d.kind for d in run.decisions] == ["judged", "judged", "verified"]


def test_a_run_whose_first_uniform_check_breaks_still_ships_a_slower_plan_that_holds(monkeypatch):
    """Every uniform plan but the slowest breaks; a mixed plan predicted between them holds. The run
    goes on past the breaks to the slower plans and ends with the fastest that held."""
    trials = [_record(0, {"l0": "int4_wo(group_size=64)", "l1": "int4_wo(group_size=64)"}, 0.01, warm=True),
              _record(1, {"l0": "int8_dyn", "l1": "int8_dyn"}, 0.01, warm=True),
              _record(2, {"l0": "int8_wo", "l1": "int8_wo"}, 0.01, warm=True),
              _record(3, {"l0": "int8_dyn", "l1": "int8_wo"}, 0.01)]
    run, judged = _run(monkeypatch, holds={2, 3})
    while run.step(_outcome(trials)) is not None:
        pass
    assert judged[:2] == [0, 1] and run.incumbent.trial in (2, 3)
    assert run.incumbent.trial == 3 or A.params_key(trials[3].params) in run.tried
    assert all(run.tried[A.params_key(t.params)] == BREAKS for t in trials[:2])
    assert run.curve[-1].speedup > 1.0 and [p.speedup for p in run.curve] == sorted(p.speedup for p in run.curve)


def test_a_plan_not_measured_faster_than_the_incumbent_is_not_verified_and_not_judged(monkeypatch):
    """On the CPU the measurement is the cheaper half and runs first: a plan predicted faster but
    measured slower than the incumbent is rejected without its check."""
    slow = {"l0": "int4_wo(group_size=64)", "l1": "int4_wo(group_size=64)"}
    # int8_wo first: its odds (no screen drop) outweigh int4's larger predicted gain (drop near the limit)
    trials = [_record(0, {"l0": "int8_wo", "l1": "int8_wo"}, 0.0, warm=True), _record(1, slow, 0.04)]
    run, judged = _run(monkeypatch, holds={0, 1}, measured={A.params_key(slow): 2.0})  # int4 runs 160 us, not 80
    run.step(_outcome(trials))
    assert run.incumbent.trial == 0
    assert run.step(_outcome(trials)) is trials[1] and judged == [0]  # trial 1 measured, never judged
    assert run.incumbent.trial == 0 and run.tried[A.params_key(slow)] == "not faster"
    said = run.decisions[-1]
    assert said.kind == "not_faster" and "not shown faster than the best plan so far" in said.describe()


def test_plans_are_verified_in_order_of_value_and_never_when_predicted_slower_than_the_incumbent(monkeypatch):
    """A fast plan whose screen drop is near the screen's limit is worth less than a slower one well
    inside it; a plan predicted under MIN_GAIN faster than the incumbent is not a candidate."""
    risky = _record(0, {"l0": "int4_wo(group_size=64)", "l1": "int4_wo(group_size=64)"}, 0.045)
    safe = _record(1, {"l0": "int8_wo", "l1": "int8_wo"}, 0.005)
    run, _ = _run(monkeypatch, holds={1})
    ranked = run.ranked(_outcome([risky, safe]))
    assert [r.number for _, r in ranked] == [1, 0]
    run.step(_outcome([risky, safe]))
    assert run.incumbent.trial == 1
    tiny = _record(2, {"l0": "int8_wo", "l1": "int8_wo"}, 0.0)  # the incumbent's own plan: no gain
    assert all(r.number != 2 for _, r in run.ranked(_outcome([risky, safe, tiny])))


def test_hold_odds_fall_with_the_screen_drop_and_learn_from_the_plans_judged():
    """Unjudged, the odds fall from high to low across the screen's limit; a plan screened no worse
    than one that held is likely to hold, one no better than one that broke likely to break, and a
    break scales the drops between them."""
    low, high = A.HOLD_ODDS
    odds = [A.hold_odds(d, [], 0.1) for d in (0.0, 0.02, 0.05, 0.09, 0.2)]
    assert odds == sorted(odds, reverse=True) and odds[0] == high and odds[-1] == low
    held = Judged(1, 1.0, 0.04, HOLDS, (_verdict(HOLDS, 0.004),))
    broke = Judged(2, 1.0, 0.08, BREAKS, (_verdict(BREAKS, 0.02),))
    assert A.hold_odds(0.03, [held], 0.1) == high and A.hold_odds(0.09, [broke], 0.1) == low
    # the break used 2 budgets at a screen drop of 0.08: 25 budgets per unit of screen drop
    assert A.hold_odds(0.02, [broke], 0.1) == pytest.approx(max(low, 1 - 0.02 * 25))
    assert A.hold_odds(0.06, [held, broke], 0.1) == low


def test_the_first_check_that_did_not_fit_is_named_with_a_budget_that_holds_it(monkeypatch):
    """A run that ends before any verification fits says which plan it would have verified, what
    that needed, and a budget that would have held it; a run that verified something says nothing."""
    trials = [_record(0, {"l0": "int8_wo", "l1": "int8_wo"}, 0.0, warm=True)]
    run, judged = _run(monkeypatch, holds={0}, seconds=3.0)
    run.time_plan = TimePlan(run.ledger, Costs(0.01, 60.0, 20.0))
    run.judges.check_s, run.judges.first_s = 60.0, 30.0
    assert run.step(_outcome(trials)) is None and judged == []
    run.conclude(_outcome(trials))
    (said,) = run.decisions
    assert said.kind == "check_did_not_fit" and said.ends_unchanged and said.trial == 0
    assert said.needed_s >= 60.0 + 5.0 and said.suggest_s >= said.needed_s and "a budget of about" in said.describe()


def test_candidates_not_measured_take_the_median_anchor_factor():
    """A measured uniform plan scales its candidate's cells to the measured speed-up; a candidate not
    measured takes the median of the measured factors, the unchanged layers none."""
    from autoao.stages import anchors

    cells = _cost()
    plan = plan_from_params(GROUPS, {"l0": "int8_wo", "l1": "int8_wo"})
    record = anchors.anchor(cells, "int8_wo", plan, 2.5, 3)  # cells predict 200/120 = 1.67x
    assert record.predicted == pytest.approx(200 / 120) and record.factor == pytest.approx(80 / 120)
    cost = anchors.anchored(cells, [record])
    assert cost.predict(plan) == pytest.approx(80.0)
    assert cost.layer_us["l0"]["int8_dyn"] == pytest.approx(50.0 * 80 / 120) and cost.layer_us["l0"]["bf16"] == 100.0
    assert anchors.anchored(cells, []) is cells


def test_the_first_slice_ends_once_a_plan_is_worth_securing(monkeypatch):
    """Before the first incumbent, a plan with good odds and a large predicted gain ends the search's
    first slice (its check comes before more trials); a plan worth little does not; once a plan is
    verified, nothing ends a slice early."""
    run, _ = _run(monkeypatch, holds={0})
    good = _record(0, {"l0": "int8_wo", "l1": "int8_wo"}, 0.0, warm=True)
    poor = _record(1, {"l0": "int8_wo", "l1": "bf16"}, 0.045, warm=True)  # near the screen's limit, little gain
    assert not run.worth_securing(None) and not run.worth_securing(_outcome([poor]))
    assert run.worth_securing(_outcome([poor, good]))
    run.step(_outcome([good]))
    assert run.incumbent.trial == 0 and not run.worth_securing(_outcome([good, poor]))


def test_a_time_limit_stops_a_slow_step_and_lets_a_quick_one_finish():
    import time

    from autoao.ledger import RunLedger, TooSlow

    with RunLedger.time_limit(5.0):
        time.sleep(0.01)
    with pytest.raises(TooSlow, match="scoring took longer than the 0 s it had"):
        with RunLedger.time_limit(0.05, "scoring"):
            time.sleep(2.0)
    with RunLedger.time_limit(None):  # no limit
        time.sleep(0.01)
