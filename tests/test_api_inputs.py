"""optimize checks every argument before it measures anything, an unchanged model is 1.00x, and the
time plan and the judges spend a time budget where it buys evidence."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import autoao
from autoao import api, budget, records
from autoao.stages import bench, measure
from autoao.budget import WRITE_SECONDS, AccuracyBudget, Costs, TimePlan
from autoao.decisions import BusyCpu, HeldOutInputs, NothingToTry
from autoao.ledger import RunLedger
from autoao.types import Budget


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False))


def _nan(model):
    return math.nan


def _raises(model):
    raise RuntimeError("metric server down")


def _text(model):
    return "good"


@pytest.mark.parametrize("kwargs, message", [
    ({"budget": "5 parsecs"}, "neither a time"),
    ({"max_accuracy_drop": 2.0}, "max_accuracy_drop must be a number in [0, 1]"),
    ({"max_accuracy_drop": "1%"}, "max_accuracy_drop must be a number in [0, 1]"),
    ({"candidates": ["int3"]}, "Unknown candidate 'int3'"),
    ({"candidates": []}, "candidates is empty"),
    ({"storage": "postgresql://nobody@127.0.0.1:9/none"}, "cannot be reached"),
    ({"storage": "nonsense"}, "is not a database URL"),
    ({"accuracy": ["autoao_facts"]}, "need the model's tokenizer"),
    ({"accuracy": 42}, "accuracy must be None (the proxy decides), lm-eval task names"),
    ({"accuracy": ""}, "accuracy names no lm-eval task"),
    ({"accuracy": _nan}, "accuracy callable _nan on the unmodified model returned a value that is not finite"),
    ({"accuracy": _raises}, "accuracy callable _raises raised on the unmodified model: RuntimeError: metric server down"),
    ({"accuracy": _text}, "accuracy callable _text on the unmodified model returned str"),
    ({"seed": "0"}, "seed must be an integer"),
])
def test_bad_arguments_fail_before_any_measurement(kwargs, message, tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(api, "settle_cpu_threads", lambda *a, **k: measured.append("threads"))
    monkeypatch.setattr(api, "build_inputs", lambda *a, **k: measured.append("profile"))
    start = time.perf_counter()
    with pytest.raises(ValueError) as e:
        autoao.optimize(_model(), torch.randn(4, 64), out_dir=tmp_path / "out", progress=False, **kwargs)
    assert message in str(e.value) and measured == [] and time.perf_counter() - start < 10


def test_good_arguments_reach_the_measurements(tmp_path, monkeypatch):
    """The other side: the same call with good arguments gets past the checks to the profile."""
    class Profiled(Exception):
        pass

    def profiled(*a, **k):
        raise Profiled

    monkeypatch.setattr(api, "build_inputs", profiled)
    with pytest.raises(Profiled):
        autoao.optimize(_model(), torch.randn(4, 64), out_dir=tmp_path / "out", progress=False, accuracy=lambda m: 0.5,
                        candidates=["int8_wo"], max_accuracy_drop=0.02, seed=1)


def _said_about_inputs(d) -> bool:
    return isinstance(d, (BusyCpu, HeldOutInputs))  # notes on the machine and the inputs, not choices


def test_an_unchanged_model_is_exactly_one_x(tmp_path, monkeypatch):
    """Only bf16 allowed: the plan is empty, and its speed-up is 1.00x by definition (not a second,
    noisy measurement of the same model)."""
    calls = []
    real, real_bench = measure.measure_examples, bench.forward_timing
    monkeypatch.setattr(measure, "measure_examples", lambda *a, **k: calls.append("start") or real(*a, **k))
    monkeypatch.setattr(bench, "forward_timing", lambda *a, **k: calls.append("bench") or real_bench(*a, **k))
    result = autoao.optimize(_model(), [torch.randn(4, 64)], budget=3, candidates=["bf16"], out_dir=tmp_path / "o",
                             progress=False)
    s = result.summary
    assert not result.plan.layers and s.plan == {}
    assert s.speedup.measured == 1.0 and s.plan_ms.measured == s.baseline_ms.measured and s.rounds == 0
    assert s.speedup.predicted == 1.0 and s.speedup_range == [1.0, 1.0] and s.speedup_bound == 1.0
    assert calls == ["start"]  # bf16 once, at the start (the cost model's rest); never again
    assert [d.kind for d in s.decisions if not _said_about_inputs(d)] == ["nothing_to_try"]
    assert "no layer has a candidate other than the unchanged one" in s.notes[-1]
    assert s.verdicts == [] and s.verdict is None  # nothing shipped: no verdict needed


def test_a_budget_too_short_to_search_says_so(tmp_path, monkeypatch):
    """A time budget whose reserve leaves kernel timing, layer errors and the trials too little time
    leaves every candidate but bf16 untimed: the model is kept as it came, and the decision says
    the budget was too short, what took it, how many cells went untimed, and what budget would do."""
    monkeypatch.setitem(budget.SHARES, "kernel timing", 0.0)  # nothing for timing after the baselines
    result = autoao.optimize(_model(), [torch.randn(4, 64)], budget="20s", candidates=["bf16", "int8_wo"],
                             out_dir=tmp_path / "o", progress=False)
    s = result.summary
    assert not result.plan.layers and s.speedup.measured == 1.0
    assert [d.kind for d in s.decisions if not _said_about_inputs(d)] == ["nothing_to_try"]
    (nothing,) = [d for d in s.decisions if isinstance(d, NothingToTry)]
    untimed = records.load_context(tmp_path / "o" / "context.json").timing.not_timed
    assert untimed > 0 and nothing.not_timed == untimed and nothing.ends_unchanged
    assert nothing.stage and nothing.stage_s > 0 and nothing.suggest_s > 20
    said = nothing.describe()
    assert "the time budget is too short to try plans" in said and f"about {nothing.suggest_s:.0f} s" in said
    assert f"{untimed} timing cells never timed" in said
    assert "cells never timed" not in replace(nothing, not_timed=0).describe()  # said before timing: no count
    assert any(st.name == "kernel timing" and st.planned_s == 0.0 for st in s.stages)  # the plan, recorded


##### the time plan #############################################################################

def _plan(seconds: float | None, check_s: float = 20.0, final_s: float = 10.0, once_s: float = 0.0) -> TimePlan:
    return TimePlan(RunLedger(Budget(seconds=seconds) if seconds else Budget(trials=1), progress=False),
                    Costs(1.0, check_s, final_s, 0.1, once_s))


def test_a_time_budget_keeps_room_for_the_first_verification_and_the_end():
    """Before the first verification the reserve holds one check to its verdict (the unmodified
    model's side of it included), its measurement and the writing at the end; after it, only the
    writing is kept back. A trial budget has no deadlines, and room for every step."""
    p = _plan(250.0, once_s=7.0)
    assert p.reserve() == pytest.approx(20.0 + 7.0 + 10.0 + WRITE_SECONDS)
    assert p.final_reserve() == pytest.approx(WRITE_SECONDS)
    assert p.allows(250.0 - WRITE_SECONDS - 1.0) and not p.allows(250.0)
    trials = _plan(None)
    assert trials.deadline("kernel timing") is None and trials.allows(1e9) and trials.slice_seconds(10.0) is None
    # a search slice between verifications: a share of what is free after one more verification, or nothing
    assert p.slice_seconds(37.0) == pytest.approx(max(budget.SLICE_SHARE * (p.ledger.remaining() - 37.0 - WRITE_SECONDS),
                                                      budget.MIN_SLICE_S), rel=1e-3)
    assert p.slice_seconds(250.0) == 0.0


def test_the_time_plan_hands_each_stage_its_share_and_replans_when_the_machine_slows():
    """Each stage's deadline is its share of what the budget leaves after the reserve, among itself
    and the stages after it; a machine that runs repeated steps slower than the baselines did
    grows the reserve and shrinks the later stages instead of overrunning them."""
    p = _plan(1000.0, check_s=10.0, final_s=20.0)
    free = p.ledger.remaining() - p.reserve()
    shares = budget.SHARES
    timing = p.deadline("kernel timing") - p.ledger.clock()
    assert timing == pytest.approx(free * shares["kernel timing"] / sum(shares.values()), rel=1e-3)
    assert p.planned["kernel timing"] == pytest.approx(timing, rel=1e-3)
    search = p.deadline("search trials") - p.ledger.clock()  # the last flexible stage takes what is left
    assert search == pytest.approx(free, rel=1e-3) and not p.past("search trials")
    assert p.slowdown == 1.0
    for _ in range(3):
        p.observe(1.0, 2.0)  # steps priced at 1 s took 2 s
    assert p.slowdown == pytest.approx(2.0)
    assert p.reserve() == pytest.approx(2 * (10.0 + 0.0 + 20.0) + WRITE_SECONDS)
    assert p.deadline("search trials") - p.ledger.clock() < search
    assert p.allows(100.0) and not p.allows(p.ledger.remaining())  # a step that would eat the final reserve
    tight = _plan(60.0, check_s=30.0, final_s=30.0)  # the reserve alone is past the budget
    assert tight.past("search trials") and tight.deadline("kernel timing") <= tight.ledger.clock() + 1e-3


def test_the_time_plan_sees_another_process_take_the_cpu(monkeypatch):
    """Between two trials, how long this process's threads waited for a CPU against how long they
    ran says how much slower work runs now, relative to the costs' measurement (plan-independent:
    each plan runs at its own speed). A load that was there when the costs were measured is in
    them already and slows nothing down; a quiet window says 1, and so does a window too short to
    average the scheduler's slices."""
    clock, cpu = [0.0], [(10 * 10**9, 0)]  # (ran, lost) ns: the costs measured on a quiet machine
    monkeypatch.setattr(budget, "cpu_ran_lost_ns", lambda: cpu[0])

    def window(p, seconds, ran, lost):
        clock[0] += seconds
        cpu[0] = (cpu[0][0] + int(ran * 1e9), cpu[0][1] + int(lost * 1e9))
        p.observe_machine()

    p = _plan(1000.0)
    monkeypatch.setattr(p.ledger, "clock", lambda: clock[0])
    p.observe_machine()  # the first call only starts the window
    assert p.slowdown == 1.0
    window(p, 2.0, 2.0, 2.0)  # as long waiting as running: twice as slow
    assert p.slowdown == pytest.approx(2.0)

    cpu[0] = (10 * 10**9, 10 * 10**9)  # the costs measured under that same load
    loaded = _plan(1000.0)
    monkeypatch.setattr(loaded.ledger, "clock", lambda: clock[0])
    loaded.observe_machine()
    window(loaded, 2.0, 2.0, 2.0)
    assert loaded.slowdown == pytest.approx(1.0)
    window(loaded, 2.0, 1.0, 3.0)  # then a heavier one: 4x against the costs' 2x
    window(loaded, 2.0, 1.0, 3.0)
    assert loaded.slowdown == pytest.approx(2.0)

    cpu[0] = (10 * 10**9, 0)
    quiet = _plan(1000.0)
    monkeypatch.setattr(quiet.ledger, "clock", lambda: clock[0])
    quiet.observe_machine()
    window(quiet, 3.0, 3.0, 0.0)  # no waiting at all in 3 s
    window(quiet, 0.1, 0.1, 1.0)  # 0.1 s: too short a window to say anything
    assert quiet.slowdown == 1.0 and len(quiet._ratios) == 1
    idle = _plan(1000.0)
    monkeypatch.setattr(idle.ledger, "clock", lambda: clock[0])
    idle.observe_machine()
    window(idle, 2.0, 0.0, 0.0)  # nothing ran: nothing to say
    assert idle._ratios == []


##### tier 2: documents follow the verdict ########################################################

class _Bench:
    """A model bench that only tracks which side is in place: the unmodified model or the plan."""

    def __init__(self) -> None:
        self.model, self.side = nn.Linear(1, 1), "reference"

    def shipped(self, params, **metadata):
        return autoao.Plan()

    @contextlib.contextmanager
    def applied(self, plan):
        self.side = "plan"
        yield self.model
        self.side = "reference"

    def modules(self, plan):
        return {"plan": self.model}

    def install(self, modules):
        self.side = "plan" if modules else "reference"


def _lm_eval_judge(monkeypatch, bench: _Bench, flipped: set[int], docs: int = 1000):
    """An LmEvalJudge of one task of `docs` documents on a fake lm-eval: the unmodified model gets
    every document right, the plan all but `flipped`; records which documents each side scored."""
    from autoao.evaluators import lmeval
    from autoao.evaluators.tier2 import LmEvalJudge

    scored: dict[str, list[int]] = {"reference": [], "plan": []}

    def evaluate(model, tokenizer, tasks, samples, per_document=False, batch_size=8):
        ids = samples["t"]
        if per_document:  # the judge's scoring; the probe's batched comparison is not counted
            scored[bench.side] += ids
        right = {d: 0.0 if bench.side == "plan" and d in flipped else 1.0 for d in ids}
        return SimpleNamespace(per_doc={"t": {d: {"score": v} for d, v in right.items()}})

    monkeypatch.setattr(lmeval, "task_sizes", lambda tasks: {"t": docs})
    monkeypatch.setattr(lmeval, "evaluate", evaluate)
    judge = LmEvalJudge(None, ["t"], cache=None)
    judge.probe(bench.model, "base")
    return judge, scored


def test_the_probe_counts_first_documents_that_answer_differently_when_batched(monkeypatch):
    """probe scores the first look's documents of the unmodified model a second time as lm-eval
    batches them; the documents whose outcome differs are counted, reach the run's baseline metrics,
    and the report warns only where their share exceeds the budget."""
    from autoao.evaluators import lmeval
    from autoao.evaluators.tier2 import LmEvalJudge
    from autoao.reports.trust import scoring_warnings
    from autoao.types import BATCH_COMPARED as COMPARED, BATCH_FLIPS as FLIPS

    moved = {3, 17}  # batched, these documents answer wrong

    def evaluate(model, tokenizer, tasks, samples, per_document=False, batch_size=8):
        ids = samples["t"]
        wrong = set() if per_document else moved
        return SimpleNamespace(per_doc={"t": {d: {"score": 0.0 if d in wrong else 1.0} for d in ids}})

    monkeypatch.setattr(lmeval, "task_sizes", lambda tasks: {"t": 1000})
    monkeypatch.setattr(lmeval, "evaluate", evaluate)
    judge = LmEvalJudge(None, ["t"], cache=None)
    judge.order["t"] = list(range(1000))  # the first look: documents 0..63
    judge.probe(object(), "base")
    assert judge.batching == {"t": (2, 64)}
    _, metrics = judge.baseline_scores(0)
    assert metrics[f"t/{FLIPS}"] == 2.0 and metrics[f"t/{COMPARED}"] == 64.0 and metrics["t/acc"] == 1.0

    def ctx(max_drop):
        return SimpleNamespace(accuracy=SimpleNamespace(baseline_tier2_metrics=metrics), max_accuracy_drop=max_drop)

    (said,) = scoring_warnings(ctx(0.01))  # 2 of 64 is 3.1%, over a 1-point budget
    assert said.startswith("On t, 2 of the 64 documents first scored answer differently") and "3.12%" in said
    assert scoring_warnings(ctx(0.05)) == []  # within a 5-point budget: nothing to say


@pytest.mark.parametrize("flips, status, documents", [
    (0, "holds", 256),  # no document changed: 256 of 1000 bound the drop within 1 point
    (4, "breaks", 64),  # 1 in 4 flipped: the first look's 64 documents already show it
])
def test_lm_eval_documents_follow_the_verdicts_interval(monkeypatch, flips, status, documents):
    """A tier-2 check scores the task's documents in looks (LOOK_DOCS, then doubling) until the
    drop's interval settles the verdict, so a check costs as many documents as its verdict needs and
    no more (no time-fitted limit); the unmodified model is scored on the same documents."""
    from autoao.stages.choose import judge_plan
    from autoao.evaluators.tier2 import LOOK_DOCS
    from autoao.types import UNMODIFIED_ACC

    b = _Bench()
    flipped = set(range(0, 1000, flips)) if flips else set()
    judge, scored = _lm_eval_judge(monkeypatch, b, flipped)
    assert LOOK_DOCS == 64 and judge.looks == 5 and judge.documents(2) == {"t": 256} and judge.documents(9) == {"t": 1000}
    judge.check_s = 1.0
    judges = SimpleNamespace(checks=(judge,), budget=AccuracyBudget.create(0.01, tier2=True), key=lambda plan: "plan")
    record = SimpleNamespace(number=7, params={}, predicted_ms=1.0, drop=0.02)
    judged = judge_plan(record, b, judges, _plan(None), RunLedger(Budget(trials=1), progress=False))
    (verdict,) = judged.verdicts
    assert judged.status == verdict.status == status and (verdict.unit, verdict.tier) == ("documents", 2)
    assert verdict.n == documents and verdict.population == 1000 and verdict.looks == judge.looks
    assert len(scored["plan"]) == len(set(scored["plan"])) == documents  # no document scored twice
    assert set(scored["reference"]) == set(scored["plan"])  # paired: the same documents on both sides
    assert verdict.drop == pytest.approx(sum(d in flipped for d in scored["plan"]) / documents)
    # the plan's metrics carry the unmodified model's side on the same documents (the report pairs them)
    assert judged.metrics["t/documents"] == documents
    assert judged.metrics[f"t/{UNMODIFIED_ACC}"] == pytest.approx(verdict.baseline)


def test_a_tier2_check_with_no_room_for_another_look_stays_unresolved(monkeypatch):
    """The time plan is asked before every look after the first: with no room, the verdict stays
    unresolved on what the first look scored (and a plan that does not hold is not shipped)."""
    from autoao.stages.choose import judge_plan

    class NoRoom:
        def allows(self, seconds):
            return False

        def observe(self, planned_s, took_s):
            pass

    b = _Bench()
    judge, scored = _lm_eval_judge(monkeypatch, b, set())
    judge.check_s = 1.0
    judges = SimpleNamespace(checks=(judge,), budget=AccuracyBudget.create(0.01, tier2=True), key=lambda plan: "plan")
    record = SimpleNamespace(number=7, params={}, predicted_ms=1.0, drop=0.02)
    judged = judge_plan(record, b, judges, NoRoom(), RunLedger(Budget(trials=1), progress=False))
    assert judged.status == "unresolved" and judged.verdicts[0].n == 64 and len(scored["plan"]) == 64


def test_the_reference_side_of_a_check_is_priced_by_the_documents_it_has_left(monkeypatch):
    """A check's one-off part is the unmodified model on the documents it has no score for: after
    the probe, every document but the first look's; a model never scored has all of them left."""
    judge, scored = _lm_eval_judge(monkeypatch, _Bench(), set(), docs=300)
    assert len(scored["reference"]) == 64
    assert judge.unscored("base") == 300 - 64 and judge.unscored("another plan") == 300
