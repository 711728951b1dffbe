"""optimize checks every argument before it measures anything, and an unchanged model is 1.00x."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

import autoao
from autoao import stages
from autoao.runfiles import describe


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
    ({"max_accuracy_drop": 2.0}, "max_accuracy_drop must be in [0, 1]"),
    ({"candidates": ["int3"]}, "Unknown candidate 'int3'"),
    ({"storage": "postgresql://nobody@127.0.0.1:9/none"}, "cannot be reached"),
    ({"storage": "nonsense"}, "is not a database URL"),
    ({"accuracy": ["autoao_facts"]}, "need the model's tokenizer"),
    ({"accuracy": _nan}, "accuracy callable _nan returned nan"),
    ({"accuracy": _raises}, "accuracy callable _raises raised on the unmodified model: RuntimeError: metric server down"),
    ({"accuracy": _text}, "accuracy callable _text returned str"),
])
def test_bad_arguments_fail_before_any_measurement(kwargs, message, tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(stages, "profile_workload", lambda *a, **k: measured.append(1))
    start = time.perf_counter()
    with pytest.raises(ValueError) as e:
        autoao.optimize(_model(), torch.randn(4, 64), out_dir=tmp_path / "out", progress=False, **kwargs)
    assert message in str(e.value) and measured == [] and time.perf_counter() - start < 10


def test_an_unchanged_model_is_exactly_one_x(tmp_path, monkeypatch):
    """Only bf16 allowed: the plan is empty, and its speed-up is 1.00x by definition (not a second,
    noisy measurement of the same model)."""
    calls = []
    real = stages.measure_examples
    monkeypatch.setattr(stages, "measure_examples", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = autoao.optimize(_model(), [torch.randn(4, 64)], budget=3, candidates=["bf16"], out_dir=tmp_path / "o",
                             progress=False)
    s = result.summary
    assert not result.plan.layers and s.plan == {}
    assert s.speedup.measured == 1.0 and s.plan_ms.measured == s.baseline_ms.measured and s.rounds == 0
    assert s.speedup.predicted == 1.0 and s.speedup_range == [1.0, 1.0]
    assert len(calls) == 1  # bf16 once, at the start (the cost model's rest); never again
    assert [d.kind for d in s.decisions] == ["nothing_to_try"]
    assert "no layer has a candidate other than bf16" in describe(s.decisions[0])


def test_a_budget_spent_on_the_unchanged_model_says_so(tmp_path, monkeypatch):
    """A time budget that the unchanged model's measurements use up leaves every candidate but
    bf16 untimed: the model is kept as it came, and the decision says the budget was spent."""
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))  # no timings from earlier tests
    monkeypatch.setattr(stages, "TIMING_SHARE", 0.0)  # nothing left for timing after the baselines
    result = autoao.optimize(_model(), [torch.randn(4, 64)], budget="20s", candidates=["bf16", "int8_wo"],
                             out_dir=tmp_path / "o", progress=False)
    s = result.summary
    assert not result.plan.layers and s.speedup.measured == 1.0
    kinds = [d.kind for d in s.decisions]
    assert kinds == ["nothing_to_try"] and s.decisions[0].numbers["not_timed"] > 0
    assert "time budget was spent measuring the unchanged model" in describe(s.decisions[0])


def test_lm_eval_documents_fit_the_time_budget(monkeypatch):
    """Under a time budget, tier 2 runs on as many documents per task as fit its share (timed on a
    first few, from the evaluation's own recorded seconds, so a cached probe counts too), and on all of
    them when they fit."""
    from autoao.ledger import RunLedger
    from autoao.search import Budget

    class FakeLmEval(stages.LmEvalEvaluator):
        def __init__(self, per_doc):
            self.tasks, self.limit, self.per_doc = ["autoao_facts"], None, per_doc

        def measure(self, model, key=None):  # returns at once, as a cached result does
            # what the evaluation took when it ran, and the task's size (autoao_facts: 372 documents)
            return {"seconds": self.per_doc * self.limit, "documents": {"autoao_facts": 372}}

    slow = FakeLmEval(0.01)
    stages.fit_lm_eval_limit(slow, None, "k", RunLedger(Budget(seconds=10), progress=False))
    # 0.3 x ~10 s over 3 evaluations at ~0.01 s a document: about 100 documents
    assert stages.PROBE_DOCS <= slow.limit <= 110
    fast = FakeLmEval(0.00001)
    stages.fit_lm_eval_limit(fast, None, "k", RunLedger(Budget(seconds=600), progress=False))
    assert fast.limit is None
    # 0.3 x 100 s over 3 evaluations at 0.01 s a document: 1000 fit, more than the task has: all of it
    enough = FakeLmEval(0.01)
    stages.fit_lm_eval_limit(enough, None, "k", RunLedger(Budget(seconds=100), progress=False))
    assert enough.limit is None


def test_a_time_budget_keeps_room_for_as_many_tier2_checks_as_its_share_holds():
    """Each bisection step on tier 2 is kept room for, up to TIER2_CHECKS, when TIER2_SHARE of what
    is left holds it beside the baseline's evaluation; one at the least."""
    assert stages.tier2_checks(20.0, 900.0) == stages.TIER2_CHECKS  # 0.3 x 900 s holds 13 evaluations
    assert stages.tier2_checks(20.0, 250.0) == 2  # 75 s: 3 evaluations of 20 s, the baseline's among them
    assert stages.tier2_checks(60.0, 250.0) == 1
    assert stages.tier2_checks(20.0, None) == stages.TIER2_CHECKS  # a trial budget
