"""Accuracy verdicts, two-sided: a plan ships only when its verdicts hold, a plan inside the model's
own noise holds, a plan that breaks the budget is judged BREAKS, and too little evidence is never
a pass. Small random-init transformers Llama and Qwen2 models in bf16, on one-token inputs (a
decode step, as a chat-model user passes them), with the default judge (accuracy=None)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import autoao
from autoao.budget import AccuracyBudget
from autoao.stages.choose import looks as judge_looks
from autoao.evaluators.generation import GenerationJudge
from autoao.evaluators.heldout import model_samples
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import upcast
from autoao.evaluators.tier2 import LmEvalJudge
from autoao.types import BREAKS, HOLDS, UNRESOLVED, Evidence, Stratum, judge

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))


def _tiny(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
    cfg = transformers.LlamaConfig(**kw) if arch == "llama" else transformers.Qwen2Config(**kw)
    cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
    return cls(cfg).to(torch.bfloat16).eval()


def _agreement(model: torch.nn.Module, reference: torch.nn.Module, ids: list[torch.Tensor]) -> float:
    """Top-1 agreement of `model` with `reference` over every position of `ids`."""
    agree = total = 0
    with torch.no_grad():
        for x in ids:
            a, b = model(x).logits.argmax(-1), reference(x).logits.argmax(-1)
            agree, total = agree + (a == b).sum().item(), total + a.numel()
    return agree / total


def _fresh_positions(model: torch.nn.Module) -> list[torch.Tensor]:
    """2048 held-out positions no judge saw (the model's own samples of another seed)."""
    return model_samples(model, n_seqs=32, seq_len=64, seed=987)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_default_judge_on_one_token_inputs_ships_only_what_holds(arch, tmp_path):
    """optimize on a decode step's input: the returned model agrees with an untouched copy, on 2048
    fresh positions, within the budget of the model's own noise floor (bf16 vs float32). Sampling
    slack: 3 standard errors of a 2048-position agreement, sqrt(p (1 - p) / n) with p = 0.03."""
    model = _tiny(arch)
    untouched = copy.deepcopy(model)
    res = autoao.optimize(model, (torch.tensor([[7]]),), budget=40, max_accuracy_drop=0.01,
                          candidates=["fp32_compute", "int8_wo", "int4_wo"], out_dir=tmp_path / "out", progress=False)
    if res.plan.layers:  # shipped: every judge's verdict held, each with its evidence
        assert res.summary.verdicts and all(v.status == HOLDS for v in res.summary.verdicts)
        assert {v.judge for v in res.summary.verdicts} == {"proxy", "generation"}
        assert all(v.n >= 256 and v.high <= 0.01 for v in res.summary.verdicts)
    assert any(d.kind == "held_out_inputs" for d in res.summary.decisions)  # said where its positions came from
    ids = _fresh_positions(untouched)
    twin = copy.deepcopy(untouched)
    with upcast(twin):
        floor = _agreement(twin, untouched, ids)
    slack = 3 * math.sqrt(0.03 * 0.97 / 2048)
    assert _agreement(res.model, untouched, ids) >= floor - 0.01 - slack


def _judges(model: torch.nn.Module) -> tuple[ProxyEvaluator, GenerationJudge, AccuracyBudget]:
    held = model_samples(model, n_seqs=16, seq_len=64, seed=3)  # 1024 positions
    proxy = ProxyEvaluator(model, held)
    proxy.calibrate(model)
    prompts = torch.cat([h[:, :16] for h in held])  # [16, 16]
    return proxy, GenerationJudge(model, prompts, 48), AccuracyBudget.create(0.01, tier2=False)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int4_everywhere_breaks_and_a_plan_inside_the_noise_holds(arch):
    model = _tiny(arch)
    proxy, generation, budget = _judges(model)
    broken = copy.deepcopy(model)
    autoao.apply(broken, autoao.Plan.uniform(broken, "int4_wo(group_size=32)"))  # K = 64: groups of 32
    for evidence in (proxy.score(broken)[1], generation.evidence(broken)):
        verdict = budget.judge(evidence)
        assert verdict.status == BREAKS and verdict.low > 0.01, verdict.describe()
    # fp32 compute of the bf16 weights: closer to the float32 twin than bf16 is, inside the noise
    inside = copy.deepcopy(model)
    autoao.apply(inside, autoao.Plan.uniform(inside, "fp32_compute"))
    for evidence in (proxy.score(inside)[1], generation.evidence(inside)):
        verdict = budget.judge(evidence)
        assert verdict.status == HOLDS and verdict.n >= 768, verdict.describe()


def test_few_positions_are_unresolved_never_a_pass():
    """One decode step's position, even in agreement, resolves nothing."""
    one = Evidence("proxy", 1, "top-1 agreement", "positions", (Stratum((0.0,), (1,)),), 1.0, 1.0)
    assert judge(one, 0.01).status == UNRESOLVED
    none_changed = Evidence("lm-eval", 2, "acc", "documents", (Stratum((0.0,) * 100, (1,) * 100, population=1000),),
                            0.6, 0.6)
    assert judge(none_changed, 0.01).status == UNRESOLVED  # 100 of 1000 documents, none changed


class FakeTask(LmEvalJudge):
    """A 1000-document multiple-choice task on which the plan truly loses 1.5 points (15 more
    questions wrong), none of them among the first 100 documents the judge draws."""

    def __init__(self) -> None:
        self.tasks, self.cache, self.sizes = ["fake"], None, {"fake": 1000}
        self.order = {"fake": list(range(1000))}
        self.baseline_key, self.seconds_per_doc, self._scores = "base", 0.0, {}
        self.scored: list[int] = []

    def _score(self, model, key, look):  # the model is its own answer key: "base" or "plan"
        docs = self.order["fake"][:self.documents(look)["fake"]]
        lost = set(range(100, 1000, 60))  # 15 documents, from the 101st on
        self._scores[("fake", key)] = {d: {"score": 0.0 if key != "base" and d in lost else 1.0} for d in docs}
        self.scored.append(len(docs))
        return len(docs)


class _Swap:
    def reference(self):
        return "base"

    def plan(self):
        return "plan"


class _Plan:
    """A time plan with room for `looks` looks."""

    def __init__(self, looks: int) -> None:
        self.left = looks

    def allows(self, seconds: float) -> bool:
        self.left -= 1
        return self.left >= 0

    def observe(self, planned: float, took: float) -> None:
        pass


class _Judges:
    def __init__(self, task: FakeTask) -> None:
        task.check_s = 1.0
        self.checks = (task,)
        self.budget = AccuracyBudget.create(0.01, tier2=True)


class _Ledger:
    def say(self, msg: str) -> None:
        pass


@pytest.mark.parametrize("looks", [1, 2, 99])
def test_a_task_plan_losing_points_after_its_first_documents_never_ships_as_holds(looks):
    """The plan loses 1.5 points of a 1000-document task, none in its first 100 documents: with
    time for one or two looks it is unresolved, with time for all it breaks; never holds."""
    task = FakeTask()
    judges = _Judges(task)
    (deciding,) = judges.checks
    verdict, _ = judge_looks(deciding, _Swap(), "plan", judges, _Plan(looks), _Ledger())
    assert verdict.status != HOLDS
    if looks == 99:  # every document scored: exact
        assert verdict.status == BREAKS and verdict.n == 1000 and verdict.drop == pytest.approx(0.015)
        assert verdict.low == verdict.high
    else:
        assert verdict.status == UNRESOLVED and verdict.n < 1000
