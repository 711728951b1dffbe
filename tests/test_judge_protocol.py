"""Judges behind one protocol (autoao.evaluators.judge): a new kind of judge is one class and one
registry line, the run judges plans with it end to end, and the package never asks which kind of
judge it holds (no isinstance / hasattr on judges outside evaluators/)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from autoao.evaluators import judge as judge_mod
from autoao.evaluators.judge import Judge, JudgeContext, JudgeRecord
from autoao.options import Options
from autoao.types import Evidence, Stratum

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Agreement:
    """What a user passes as `accuracy=` for the judge below: rows [B, K] to compare outputs on."""

    rows: torch.Tensor


class AgreementJudge(Judge):
    """Per row, whether the plan's argmax output matches the unmodified model's (one look)."""

    looks = 1
    calls: list[str] = []

    def __init__(self, rows: torch.Tensor, reference: nn.Module) -> None:
        self.rows = rows
        with torch.no_grad():
            self.expected = reference(rows).argmax(-1)

    @classmethod
    def accepts(cls, accuracy):
        return isinstance(accuracy, Agreement)

    @classmethod
    def create(cls, accuracy, context: JudgeContext) -> Judge:
        return cls(accuracy.rows, context.model)

    def evidence_through(self, model, key, look):
        AgreementJudge.calls.append(key)
        with torch.no_grad():
            same = (model(self.rows).argmax(-1) == self.expected).float()
        diffs = tuple(float(1 - s) for s in same)
        stratum = Stratum(diffs, (1,) * len(diffs), population=len(diffs), changed=sum(d != 0 for d in diffs))
        score = float(same.mean())
        return Evidence("agreement", 2, "argmax agreement", "rows", (stratum,), 1.0, score), {"agreement": score}

    def describe(self) -> str:
        return f"argmax agreement on {len(self.rows)} rows"

    def record(self) -> JudgeRecord:
        return JudgeRecord(1.0, metric="agreement")


def _check(accuracy):
    return Options.check(budget=4, accuracy=accuracy, tokenizer=None, max_accuracy_drop=0.05, candidates=["int8_wo"],
                         eval_inputs=None, storage=None, out_dir="out", seed=0, progress=False)


def test_a_judge_added_by_one_class_and_one_line_judges_the_plans_of_a_run(tmp_path, monkeypatch):
    from autoao import api
    from autoao.stages import bench, measure
    from autoao.evaluators import harness
    from autoao.evaluators.timing import Timing
    from autoao.kernels import QuantizedLinear

    rows = torch.randn(512, 256)
    with pytest.raises(ValueError, match="accuracy"):  # not a judge anyone registered
        _check(Agreement(rows))
    monkeypatch.setattr(judge_mod, "DECIDING", list(judge_mod.DECIDING))
    judge_mod.register(AgreementJudge)  # the one line
    assert _check(Agreement(rows)).accuracy == Agreement(rows)

    # timings as data: int8_wo a quarter of bf16 per layer, and the model holding it twice as fast
    monkeypatch.setattr(harness, "time_missing", lambda cand, kern, n, k, tokens, *a: {
        m: Timing(100.0 if cand.family == "int8_wo" else 400.0, 0.0, 0.0, 5) for m in tokens})
    fast = lambda model, examples, *a, **kw: (500.0 if any(  # noqa: E731
        isinstance(m, QuantizedLinear) for m in model.modules()) else 1000.0,) * 3
    monkeypatch.setattr(bench, "forward_timing", fast)
    monkeypatch.setattr(measure, "forward_timing", fast)
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    AgreementJudge.calls = []
    torch.manual_seed(0)
    result = api.optimize(nn.Sequential(nn.Linear(256, 256, bias=False)), [torch.randn(8, 256)], budget=4,
                          candidates=["int8_wo"], accuracy=Agreement(rows), max_accuracy_drop=0.05,
                          out_dir=tmp_path / "out", progress=False)
    assert AgreementJudge.calls  # the run judged plans with it
    from autoao.records import load_context

    spec = load_context(tmp_path / "out" / "context.json").accuracy
    assert (spec.metric, spec.tier, spec.baseline_tier2) == ("agreement", 2, 1.0)
    summary = result.summary
    assert result.plan.layers and summary.verdict is not None
    assert [v.judge for v in summary.verdicts][0] == "agreement" and summary.verdicts[0].n == 512


JUDGE_CLASSES = {"Judge", "LmEvalJudge", "MetricJudge", "GenerationLooks", "GenerationJudge", "ProxyConfirmation",
                 "ProxyEvaluator"}


def _kind_checks(path: Path) -> list[str]:
    """Lines where `path` asks which kind of judge it holds: isinstance on a judge class, hasattr
    on a judge's method name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2):
            continue
        what = node.args[1]
        names = {n.id for n in ast.walk(what) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(what) if isinstance(n, ast.Attribute)}
        if node.func.id == "isinstance" and names & JUDGE_CLASSES:
            found.append(f"{path.name}:{node.lineno}")
        if node.func.id == "hasattr" and isinstance(what, ast.Constant) and what.value in (
                "prepare", "evidence", "evidence_through", "probe", "set_baseline", "baseline_scores"):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_package_never_asks_which_kind_of_judge_it_holds(tmp_path):
    found = [hit for path in sorted((ROOT / "autoao").rglob("*.py")) for hit in _kind_checks(path)]
    assert found == []
    planted = tmp_path / "planted.py"
    planted.write_text("def f(j):\n    return isinstance(j, LmEvalJudge) or hasattr(j, 'prepare')\n")
    assert _kind_checks(planted) == ["planted.py:2", "planted.py:2"]
