"""Plans: JSON round trip, validation that lists every problem, apply that never half-applies."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import autoao
from autoao import search_space
from autoao.kernels import QuantizedLinear
from autoao.plan import PLAN_FILE, WEIGHTS_FILE, Plan, PlanError


class TinyBlock(nn.Module):
    """Two attention-ish projections and an MLP: enough names and shapes to plan over."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.odd = nn.Linear(dim, 20)  # N=20: int4 unsupported on CPU (N % 16)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):  # x: [B, T, dim]
        h = self.norm(x)
        h = self.q_proj(h) + self.k_proj(h)
        return x + self.down(torch.relu(self.up(h))) + self.odd(h).sum(-1, keepdim=True)


def test_plan_json_round_trip():
    model = TinyBlock()
    plan = Plan.for_model(model, {"q_proj": search_space.get("int4_wo", group_size=32),
                                  "up": search_space.get("fp8_dyn", granularity="tensor")}, note="hi")
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert json.loads(plan.to_json())["autoao_plan_version"] == 1


def test_uniform_plan_skips_unsupported_layers_with_reason():
    plan = Plan.uniform(TinyBlock(), "int4_wo(group_size=64)")
    assert "odd" not in plan.layers
    assert "N=20 not a multiple of 16" in plan.metadata["skipped"]["odd"]
    assert set(plan.layers) == {"q_proj", "k_proj", "up", "down"}


def test_validate_lists_every_problem_and_apply_changes_nothing():
    model = TinyBlock()
    before = copy.deepcopy(model.state_dict())
    plan = Plan(layers={
        "q_proj": search_space.get("int8_dyn"),                  # fine
        "v_proj": search_space.get("int8_dyn"),                  # no such layer
        "norm": search_space.get("int8_wo"),                     # not linear
        "odd": search_space.get("int4_wo", group_size=32),       # unsupported shape
    })
    with pytest.raises(PlanError) as e:
        autoao.apply(model, plan)
    msg = str(e.value)
    assert "3 problem(s)" in msg
    assert "v_proj: no such module" in msg
    assert "norm: is a LayerNorm, not a linear layer" in msg
    assert "odd (20x64" in msg and "N=20" in msg
    # nothing half-applied: q_proj (valid) was not swapped either
    assert type(model.q_proj) is nn.Linear
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_apply_quantizes_exactly_the_planned_layers():
    model = TinyBlock()
    x = torch.randn(2, 5, 64)
    ref = model(x)
    plan = Plan.for_model(model, {"up": search_space.get("int8_dyn"), "down": search_space.get("int8_wo")})
    autoao.apply(model, plan)
    assert isinstance(model.up, QuantizedLinear) and isinstance(model.down, QuantizedLinear)
    assert type(model.q_proj) is nn.Linear
    y = model(x)
    assert ((y - ref).norm() / ref.norm()) < 0.05
    assert autoao.plan_of(model).layers == plan.layers
    with pytest.raises(PlanError, match="already quantized"):
        autoao.apply(model, plan)


def test_tied_layers_cannot_both_be_planned():
    model = TinyBlock()
    model.k_proj.weight = model.q_proj.weight
    plan = Plan(layers={"q_proj": search_space.get("int8_wo"), "k_proj": search_space.get("int8_wo")})
    with pytest.raises(PlanError, match="share one weight"):
        autoao.apply(model, plan)


def test_uniform_plan_covers_tied_layers_once():
    model = TinyBlock()
    model.k_proj.weight = model.q_proj.weight
    plan = Plan.uniform(model, "int8_wo")
    assert "q_proj" in plan.layers and "k_proj" not in plan.layers
    assert "shares its weight with q_proj" in plan.metadata["skipped"]["k_proj"]
    autoao.apply(model, plan)  # does not trip the shared-weight check


def test_save_load_keeps_tied_weights(tmp_path):
    model = TinyBlock()
    model.k_proj.weight = model.q_proj.weight
    autoao.apply(model, Plan.for_model(model, {"up": search_space.get("int8_dyn")}))
    autoao.save(model, tmp_path)
    fresh = TinyBlock()
    fresh.k_proj.weight = fresh.q_proj.weight
    autoao.load(fresh, tmp_path)
    assert fresh.k_proj.weight is fresh.q_proj.weight
    assert torch.equal(fresh.q_proj.weight, model.q_proj.weight)
    x = torch.randn(3, 64)
    assert torch.equal(fresh(x), model(x))


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    ('{"layers": {}}', "not an autoao plan"),
    ('{"autoao_plan_version": 99, "layers": {}}', "version 99 is not supported"),
    ('{"autoao_plan_version": 1, "layers": {"up": {"family": "int3", "params": {}}}}', "Did you mean"),
    ('{"autoao_plan_version": 1, "layers": {"up": {"family": "int4_wo", "params": {"group_size": 7}}}}',
     "group_size must be one of"),
])
def test_bad_plan_files_give_clear_errors(tmp_path, content, match):
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(PlanError, match=match) as e:
        Plan.load(path)
    assert str(path) in str(e.value)


def test_missing_plan_file(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "nope.json")


def test_load_into_wrong_model_lists_layers(tmp_path):
    model = TinyBlock()
    autoao.apply(model, Plan.for_model(model, {"up": search_space.get("int8_dyn")}))
    autoao.save(model, tmp_path)
    with pytest.raises(PlanError, match="up: no such module"):
        autoao.load(nn.Sequential(nn.Linear(64, 64)), tmp_path)


def test_corrupt_weights_file(tmp_path):
    model = TinyBlock()
    autoao.apply(model, Plan.for_model(model, {"up": search_space.get("int8_dyn")}))
    autoao.save(model, tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"garbage" * 10)
    with pytest.raises(PlanError, match="cannot read"):
        autoao.load(TinyBlock(), tmp_path)


def test_saves_are_atomic_no_temp_files_left(tmp_path):
    model = TinyBlock()
    autoao.apply(model, Plan.uniform(model, "int8_wo"))
    autoao.save(model, tmp_path)
    autoao.save(model, tmp_path)  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([PLAN_FILE, WEIGHTS_FILE])


def test_get_with_params_and_errors():
    assert search_space.get("int4_wo", group_size=64) == search_space.get("int4_wo(group_size=64)")
    with pytest.raises(ValueError, match="Did you mean: int4_wo"):
        search_space.get("int4")
    with pytest.raises(ValueError, match="its parameters are: group_size"):
        search_space.get("int4_wo", groupsize=64)
    with pytest.raises(ValueError, match="granularity must be one of"):
        search_space.get("fp8_dyn", granularity="block")


def test_kernel_choices_round_trip_apply_and_save(tmp_path):
    # The plan carries each layer's CUDA kernel; apply, plan_of, save and load keep it (on CPU the
    # kernel is recorded but the CPU path runs: same numbers).
    model = TinyBlock()
    plan = Plan.for_model(model, {"q_proj": search_space.get("int4_wo", group_size=32),
                                  "up": search_space.get("int8_wo")}, kernels={"q_proj": "triton"})
    again = Plan.from_json(plan.to_json())
    assert again.kernels == {"q_proj": "triton"} and again == plan
    quantized = autoao.apply(copy.deepcopy(model), plan)
    assert quantized.q_proj.kernel == "triton" and quantized.up.kernel == plan.layers["up"].kernels("cpu")[0].name
    assert autoao.plan.plan_of(quantized).kernels == {"q_proj": "triton"}  # "up" runs int8_wo's default
    autoao.save(quantized, tmp_path)
    loaded = autoao.load(copy.deepcopy(model), tmp_path)
    assert loaded.q_proj.kernel == "triton"
    x = torch.randn(2, 3, 64)
    assert torch.equal(loaded(x), quantized(x))


def test_bad_kernel_names_are_listed_with_suggestions():
    model = TinyBlock()
    plan = Plan.for_model(model, {"q_proj": search_space.get("int4_wo", group_size=32)},
                          kernels={"q_proj": "tinygem", "up": "triton"})
    with pytest.raises(PlanError) as e:
        autoao.apply(model, plan)
    msg = str(e.value)
    assert "q_proj: int4_wo(group_size=32) has no kernel 'tinygem'" in msg and "did you mean 'tinygemm'" in msg
    assert "up: has a kernel ('triton') but no candidate" in msg
    assert isinstance(model.q_proj, nn.Linear)  # nothing applied
    with pytest.raises(PlanError, match="'kernels' must be an object"):
        Plan.from_dict({**plan.to_dict(), "kernels": ["triton"]})
    with pytest.raises(ValueError, match="has no kernel 'fast'.*has: tinygemm, cuda, triton"):
        search_space.get("int4_wo", group_size=32).build(model.q_proj).set_kernel("fast")


def test_gpt2_conv1d_layers_get_plans_and_still_run_compile_and_reload(tmp_path, monkeypatch):
    """GPT-2's Conv1D layers (weights stored [K, N]) are searched, applied, compiled and saved like
    nn.Linear ones."""
    transformers = pytest.importorskip("transformers")
    import autoao

    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    torch.manual_seed(0)

    def fresh():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()

    model, ids = fresh(), torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        ref = model(ids).logits.float()
    convs = [n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    assert len(convs) == 8
    plan = autoao.Plan.uniform(model, "int8_wo")
    assert set(convs) <= set(plan.layers)
    autoao.apply(model, plan)
    with torch.no_grad():
        out = model(ids).logits.float()
        assert (out - ref).norm() / ref.norm() < 0.05  # int8 per channel: a small error, not a transposed weight
        torch.testing.assert_close(torch.compile(model)(ids).logits.float(), out, atol=0.05, rtol=0.05)
    autoao.save(model, tmp_path / "saved")
    again = autoao.load(fresh(), tmp_path / "saved")
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    result = autoao.optimize(fresh(), [ids], budget=4, candidates=["int8_wo"], max_accuracy_drop=1.0,
                             out_dir=tmp_path / "o", progress=False)
    from autoao.records import load_context

    searched = {lay.fqn: lay.choices for lay in load_context(result.out_dir / "context.json").layers}
    assert all("int8_wo" in searched[f] for f in convs)  # offered to the search on every Conv1D layer
