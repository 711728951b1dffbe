"""The label-free tier-1 proxy of a causal LM: top-1 agreement with the unmodified model on any
token count, a floor at the model's own float32-vs-bf16 noise (a plan that differs from bf16 less
than that is never rejected for accuracy), and held-out inputs when the example inputs are one token."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from tiny_models import TinyLM

import autoao
from autoao import records
from autoao.budget import AccuracyBudget
from autoao.decisions import HeldOutInputs
from autoao.evaluators import heldout
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import upcast
from autoao.stages.inputs import build_inputs


def _tiny_bf16() -> nn.Module:
    torch.manual_seed(0)
    return TinyLM(vocab=256, dim=64, hidden=128).to(torch.bfloat16).eval()


class Between(nn.Module):
    """Logits part-way from the bf16 model's to its float32 run's: every position where both pick the
    same token picks it here too, so this agrees with bf16 at least as often as float32 does."""

    def __init__(self, bf16: nn.Module, fp32: nn.Module, t: float) -> None:
        super().__init__()
        self.bf16, self.fp32, self.t = bf16, fp32, t

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        a, b = self.bf16(ids).float(), self.fp32(ids).float()
        return a + self.t * (b - a)


def test_upcast_restores_every_tensor_bit_exact():
    model = _tiny_bf16()
    model.register_buffer("freq", torch.arange(4, dtype=torch.float32))  # an fp32 buffer stays fp32
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with upcast(model) as changed:
        assert changed and model.head.weight.dtype == torch.float32 and model.freq.dtype == torch.float32
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


def test_a_plan_within_the_models_own_noise_is_never_rejected():
    model = _tiny_bf16()
    g = torch.Generator().manual_seed(1)
    held = [torch.randint(0, 256, (8, 64), generator=g)]
    proxy = ProxyEvaluator(model, held)
    proxy.calibrate(model)
    assert proxy.noise == "float32-vs-bf16" and 0.5 < proxy.floor < 1.0  # bf16 rounding flips some tokens
    assert proxy.baseline["accuracy"] == 1.0 and proxy.baseline["noise_agreement"] == proxy.floor
    fp32 = copy.deepcopy(model).float()
    strict = AccuracyBudget.create(0.0, tier2=False)
    for t in (0.5, 1.0):
        a, evidence = proxy.score(Between(model, fp32, t))
        assert a.drop <= 1e-12  # its point estimate holds max_accuracy_drop=0 itself ...
        # ... and no position is worse than the float32 twin's, so no verdict rejects it
        assert max(evidence.strata[0].diffs) <= 0 and strict.judge(evidence).status != "breaks"
    assert "points below" in a.source and "top-1 agreement" in a.source
    # a plan that changes more than the noise does is measured as a drop in the same units
    q = copy.deepcopy(model)
    autoao.apply(q, autoao.Plan.uniform(q, "int4_wo(group_size=32)"))
    worse = proxy(q)
    assert worse.drop == pytest.approx(proxy.floor - worse.metrics["agreement"])


class ByteTokenizer:
    """A tokenizer of the kind text_inputs needs: text -> {"input_ids": [1, n]} byte ids."""

    def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([list(text.encode())], dtype=torch.long)}


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), None], ids=["tokenizer", "no-tokenizer"])
def test_one_token_inputs_are_judged_on_held_out_positions_in_stated_units(tokenizer, tmp_path):
    """Three one-token decode steps are too few positions to judge a plan on: the judges score
    held-out positions instead (the tokenizer's held-out prose, else the model's own samples), the
    decisions say so, and the proxy's units name the count."""
    model = _tiny_bf16()
    steps = [torch.tensor([[i]]) for i in (3, 17, 42)]  # three decode steps, one token each
    r = autoao.optimize(model, steps, budget=3, accuracy=None, tokenizer=tokenizer, candidates=["int8_wo"],
                        out_dir=tmp_path, progress=False)
    note = next(d for d in r.summary.decisions if isinstance(d, HeldOutInputs))
    assert note.given is None and heldout.MIN_LM_POSITIONS <= note.minimum <= note.positions  # none given: built
    ctx = records.load_context(tmp_path / "context.json")
    assert ctx.accuracy.tier == 1 and "top-1 agreement with the unmodified model" in ctx.accuracy.proxy
    assert f"on {note.positions} tokens" in ctx.accuracy.proxy and "points below" in ctx.accuracy.proxy
    source = heldout.TEXT if tokenizer is not None else heldout.SAMPLES
    assert source in note.source and source in ctx.accuracy.held_out
    assert "no held-out inputs were given" in note.describe() and source in note.describe()
    # inputs given, but too few (the three steps as eval_inputs): said as such, the same inputs built
    work = build_inputs(_tiny_bf16(), steps, eval_inputs=steps, tokenizer=tokenizer, confirm=False)
    (given,) = [d for d in work.notes if isinstance(d, HeldOutInputs)]
    assert given.given == 3 and "hold 3 positions, fewer than the" in given.describe()
    assert source in work.held_out.source and given.positions == work.held_out.positions
