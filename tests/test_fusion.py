"""Sibling fusion: layers that read one input run as one module, with the same numbers.

Covers the profile's sibling detection, kernels.FusedRows (numbers, state_dict, memory, compile),
and plans that carry fusions (JSON, validation, apply, save/load)."""

from __future__ import annotations

import copy
import gc
import io
import weakref

import pytest
import torch
from torch import nn

import autoao
from autoao import search_space
from autoao.kernels import FusedRows, QuantizedLinear, forwards, fuse_problem
from autoao.kernels.fused import member
from autoao.plan import Plan, PlanError, plan_of
from autoao.profile import profile

# every family whose numbers are row-wise, as it runs on the CPU (some emulated: same numbers)
FUSABLE = ["int8_dyn", "int8_wo", "int4_wo(group_size=32)", "fp8_dyn(granularity=row)", "fp8_wo", "sparse24",
           "sparse24_int8_dyn", "sparse24_fp8"]


class Attn(nn.Module):
    """q/k/v read the normed input (siblings); o reads something else."""

    def __init__(self, dim: int = 64, kv: int = 32, bias: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv, bias=False)
        self.v_proj = nn.Linear(dim, kv, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):  # x: [B, T, dim]
        h = self.norm(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)  # [B, T, dim], [B, T, kv] x2
        att = (q[..., : k.shape[-1]] * k).sum(-1, keepdim=True)  # [B, T, 1]
        return x + self.o_proj(q * att + v.repeat(1, 1, q.shape[-1] // v.shape[-1]))


QKV = ("q_proj", "k_proj", "v_proj")


def quantized(cand: str, bias: bool = False, seed: int = 0) -> tuple[Attn, torch.Tensor]:
    torch.manual_seed(seed)
    model = Attn(bias=bias).to(torch.bfloat16)
    plan = Plan.for_model(model, {f: search_space.get(cand) for f in (*QKV, "o_proj")})
    autoao.apply(model, plan)
    return model, torch.randn(2, 5, 64, dtype=torch.bfloat16)


##### profile: which layers are siblings ##########################################################

def test_profile_finds_layers_reading_one_input():
    assert profile(Attn(), torch.randn(1, 3, 64)).siblings == [QKV]


def test_profile_finds_qkv_and_gate_up_in_a_llama_stack():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "lib"))
    from llama_stack import LlamaShape, LlamaStack

    prof = profile(LlamaStack(LlamaShape.tiny()), torch.randint(0, 256, (1, 4)))
    assert prof.siblings == [tuple(f"layers.{i}.{p}" for p in names) for i in range(2)
                             for names in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                                           ("mlp.gate_proj", "mlp.up_proj"))]


class Tricky(nn.Module):
    """a/b: the input is modified in place between them; c twice on one input; d/e together in one
    call and apart in the next (mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d, self.e = (nn.Linear(8, 8) for _ in range(5))
        self.mode = 0

    def forward(self, x):
        h = x * 1
        y = self.a(h)
        h.mul_(2)  # b reads other numbers than a did: fusing them would be wrong
        y = y + self.b(h) + self.c(x) + self.c(x)
        g = x - 1
        y = y + self.d(g) + (self.e(g) if self.mode == 0 else self.e(g + 1))
        self.mode += 1
        return y


def test_profile_lists_only_groups_that_hold_on_every_input():
    assert profile(Tricky(), [torch.randn(2, 8), torch.randn(2, 8)]).siblings == []
    assert profile(Tricky(), [torch.randn(2, 8)]).siblings == [("d", "e")]  # one forward: d/e did share


##### kernels.FusedRows ###########################################################################

@pytest.mark.parametrize("cand", FUSABLE)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_fused_siblings_compute_the_same_numbers(cand, bias):
    model, x = quantized(cand, bias)
    with torch.no_grad():
        before = model(x)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        group = FusedRows([model.get_submodule(f) for f in QKV])
        after = model(x)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert group.module.owed is None  # nothing held after the forward
    # the state dict is the members' own, unchanged: save/load and plan_of see per-layer tensors
    now = model.state_dict()
    assert now.keys() == state.keys() and all(torch.equal(now[k], state[k]) for k in state)
    # members keep no runtime tensors; their canonical rows are views of the fused module's
    fused_canon = group.module.canonical()
    for m in (model.get_submodule(f) for f in QKV):
        assert [n for n in m._buffers if n != "_device_anchor"] == []
        for name, t in m.canonical().items():
            assert t.untyped_storage().data_ptr() == fused_canon[name].untyped_storage().data_ptr()


@pytest.mark.parametrize("cand", ["int8_dyn", "int8_wo", "sparse24_fp8", "sparse24"])
def test_fused_siblings_keep_the_gradient_contract(cand):
    # int8_wo and sparse24 pass x's gradient (fused or not, the same); the others raise at backward
    model, x = quantized(cand)
    group = FusedRows([model.get_submodule(f) for f in QKV])
    with torch.no_grad():
        want = model(x)
    xg = x.clone().requires_grad_()
    y = model(xg)
    torch.testing.assert_close(y.detach(), want, rtol=2e-2, atol=2e-2)
    if cand in ("int8_wo", "sparse24"):
        y.float().sum().backward()
        unfused, _ = quantized(cand)
        xr = x.clone().requires_grad_()
        unfused(xr).float().sum().backward()
        torch.testing.assert_close(xg.grad, xr.grad, rtol=2e-2, atol=2e-2)
    else:
        with pytest.raises(RuntimeError, match="has no backward"):
            y.float().sum().backward()
    assert group.module.owed is None  # nothing owed after the forward
    # each member's output may be changed in place while autograd records (`q *= scale`), fused or not
    h, grads = x.clone().requires_grad_(), []
    for each in (quantized(cand)[0], model):  # unfused, then the fused model
        h.grad = None
        q, k, v = (each.get_submodule(f)(h) for f in QKV)
        q.mul_(2)
        k.add_(1)
        if cand in ("int8_wo", "sparse24"):
            (q.float().sum() + k.float().sum() + v.float().sum()).backward()
            grads.append(h.grad.clone())
    if grads:
        torch.testing.assert_close(grads[1], grads[0], rtol=2e-2, atol=2e-2)


def test_fused_model_compiles_to_one_matmul_per_group():
    # int8_dyn runs torch._int_mm on the CPU: count them in the graph dynamo captures
    model, x = quantized("int8_dyn")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    plan = plan_of(model)
    plan.fusions = [QKV]
    autoao.plan.fuse_layers(model, plan.fusions)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend=backend)(x)
        compiled2 = torch.compile(model, fullgraph=True, backend=backend)(x)  # no recompile needed
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(compiled2, eager)
    group = model.q_proj.fused[0]
    assert group.module.owed is None  # the compiled forward left nothing owed on the group
    int_mms = [n for n in graphs[0].graph.nodes if n.target is torch._int_mm]
    assert len(int_mms) == 2  # q/k/v as one, o_proj
    assert len(graphs) == 1


def test_members_called_on_another_input_recompute():
    model, x = quantized("int8_wo")
    group = FusedRows([model.get_submodule(f) for f in QKV])
    with torch.no_grad():
        q1 = model.q_proj(x)
        k2 = model.k_proj(x + 1)  # not the input q saw: the group runs again
        h = x + 1
        v2 = model.v_proj(h)
    # each `x + 1` is a new tensor, so v ran the group again too: q's and k's outputs for h are owed,
    # in the group's one slot (what was owed for x and for k's input is gone)
    owed = group.module.owed
    assert owed[0] is h and sorted(owed[2]) == [0, 1]
    with torch.no_grad():
        alone, _ = quantized("int8_wo")
        torch.testing.assert_close(q1, alone.q_proj(x), rtol=0, atol=0)
        torch.testing.assert_close(k2, alone.k_proj(x + 1), rtol=0, atol=0)
        torch.testing.assert_close(v2, alone.v_proj(x + 1), rtol=0, atol=0)


def test_a_fused_group_run_twice_gives_each_call_its_own_outputs():
    model, x = quantized("int8_wo")
    alone, _ = quantized("int8_wo")
    FusedRows([model.get_submodule(f) for f in QKV])
    x2 = torch.randn_like(x)
    with torch.no_grad():
        first = [model.get_submodule(f)(x) for f in QKV]
        second = [model.get_submodule(f)(x2) for f in reversed(QKV)][::-1]  # another member first
        for f, a, b in zip(QKV, first, second):
            torch.testing.assert_close(a, alone.get_submodule(f)(x), rtol=0, atol=0)
            torch.testing.assert_close(b, alone.get_submodule(f)(x2), rtol=0, atol=0)
        assert not torch.equal(first[0], second[0])


def test_a_forward_leaves_no_activation_on_the_group():
    """After the parent's forward nothing references the group's output or its input; an
    interrupted call (one sibling only) is held only until the group's next call."""
    model, x = quantized("int8_wo")
    group = FusedRows([model.get_submodule(f) for f in QKV])
    with torch.no_grad():
        h = x.clone()
        y = model(h)
        q = model.q_proj(h)  # k and v are owed their outputs for h...
        seen = weakref.ref(h), weakref.ref(q)
        assert group.module.owed[0] is h
        del y, q, h
        assert seen[0]() is not None  # ...so the group holds h (and k's, v's columns) until its next call
        model(x)  # the next call replaces it
    gc.collect()
    assert group.module.owed is None and seen[0]() is None and seen[1]() is None


def test_members_called_on_an_input_written_in_place_since_recompute():
    model, x = quantized("int8_wo")
    FusedRows([model.get_submodule(f) for f in QKV])
    alone, _ = quantized("int8_wo")
    h = x.clone()
    with torch.no_grad():
        q = model.q_proj(h)
        h.mul_(-2)  # the same tensor object, other numbers: k and v owe nothing for it
        k, v = model.k_proj(h), model.v_proj(h)
        torch.testing.assert_close(q, alone.q_proj(x), rtol=0, atol=0)
        torch.testing.assert_close(k, alone.k_proj(x * -2), rtol=0, atol=0)
        torch.testing.assert_close(v, alone.v_proj(x * -2), rtol=0, atol=0)


def test_copies_of_a_fused_model_never_mix_outputs():
    model, x = quantized("int8_wo")
    FusedRows([model.get_submodule(f) for f in QKV])
    twin = copy.deepcopy(model)
    assert twin.k_proj._fused_unit is twin.q_proj._fused_unit is not model.q_proj._fused_unit
    assert type(twin.k_proj) is type(model.k_proj)  # the same path's variant, each its own group's state
    alone, _ = quantized("int8_wo")
    y = x.flip(0)
    with torch.no_grad():  # their calls interleave: each member reads only its own group's
        q, k_twin = model.q_proj(x), twin.k_proj(y)
        k, q_twin, v, v_twin = model.k_proj(x), twin.q_proj(y), model.v_proj(x), twin.v_proj(y)
        for got, f, inp in [(q, "q_proj", x), (k, "k_proj", x), (v, "v_proj", x), (q_twin, "q_proj", y),
                            (k_twin, "k_proj", y), (v_twin, "v_proj", y)]:
            torch.testing.assert_close(got, alone.get_submodule(f)(inp), rtol=0, atol=0)
        # the same input object for both copies: still each its own weights' numbers
        twin.q_proj.set_canonical({**twin.q_proj.canonical(), "scale": twin.q_proj.canonical()["scale"] * 2})
        q, q_twin, k, k_twin = model.q_proj(x), twin.q_proj(x), model.k_proj(x), twin.k_proj(x)
        torch.testing.assert_close(q_twin, 2 * q, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(k, k_twin, rtol=0, atol=0)


def runs(m: torch.nn.Module):
    """The forward m's class runs (the path installed for it)."""
    return type(m).forward


def test_each_module_runs_the_path_installed_for_it():
    model, _ = quantized("int8_dyn")  # not differentiable: the grad check, then the path
    assert model.q_proj._path is forwards.own and runs(model.q_proj) is forwards.own_refusing_grad
    FusedRows([model.get_submodule(f) for f in QKV])  # the group's module refuses for its members
    assert runs(model.k_proj) is member and runs(model.k_proj._fused_unit) is forwards.own_refusing_grad
    wo, _ = quantized("int8_wo")  # differentiable: the path itself
    assert runs(wo.q_proj) is wo.q_proj._path is forwards.own
    FusedRows([wo.get_submodule(f) for f in QKV])
    assert runs(wo.q_proj) is member and runs(wo.o_proj) is forwards.own
    assert runs(wo.q_proj._fused_unit) is forwards.own
    smooth = search_space.get("int8_dyn", algorithm="smoothquant").module_cls(
        64, 64, False, torch.bfloat16, algorithm="smoothquant")  # x / act_scale first
    assert smooth._path is forwards.own_scaled and runs(smooth) is forwards.own_scaled_refusing_grad


def test_a_path_variant_is_its_format_by_name_and_pickles_as_it():
    """A module's class is the variant of its format for its path: named as the format, found by
    candidate_of, and pickled (torch.save of a whole model) as the format, its path installed again
    on load; a fused model so loaded runs its own groups."""
    model, x = quantized("int8_wo")
    FusedRows([model.get_submodule(f) for f in QKV])
    fmt = search_space.get("int8_wo").module_cls
    assert type(model.q_proj) is not fmt and isinstance(model.q_proj, fmt)
    assert model.q_proj.format_class() is fmt and type(model.q_proj).__qualname__ == fmt.__qualname__
    assert repr(model.q_proj).startswith(fmt.__name__ + "(")
    assert search_space.candidate_of(model.q_proj) == search_space.get("int8_wo")
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert runs(loaded.q_proj) is member and runs(loaded.o_proj) is forwards.own
    assert loaded.q_proj._fused_unit is not model.q_proj._fused_unit
    with torch.no_grad():
        for f in (*QKV, "o_proj"):
            torch.testing.assert_close(loaded.get_submodule(f)(x), model.get_submodule(f)(x), rtol=0, atol=0)


def test_a_fused_group_costs_a_compiled_caller_no_aliasing_check():
    """Members reach their group's module by its key in one table (forwards.FUSED_UNITS), not each
    by an attribute of its own: two paths to one object would cost a compiled caller an aliasing
    check (an identity comparison in Python) per sibling and call. Only the member called first
    reads the group's tensors; off the host ("meta" stands in for a GPU) the group gives the caller
    one packed weight for three."""
    def guards(model: nn.Module) -> list[tuple[str, str]]:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(torch.randn(1, 1, 64, dtype=torch.bfloat16, device="meta"))
        return [(g.name, g.create_fn_name()) for g in explained.out_guards]

    unfused, _ = quantized("fp8_wo")
    fused, _ = quantized("fp8_wo")
    FusedRows([fused.get_submodule(f) for f in QKV])
    alone, grouped = guards(unfused.to("meta")), guards(fused.to("meta"))
    aliasing = [{name for name, kind in g if kind == "DUPLICATE_INPUT"} for g in (alone, grouped)]
    assert aliasing[1] == aliasing[0]  # the group adds none (both: torch reached from two modules' globals)
    assert not [name for name, _ in grouped if "_fused_unit" in name]
    tensors = [[name for name, kind in g if kind == "TENSOR_MATCH" and ("_proj" in name or "FUSED_UNITS" in name)]
               for g in (alone, grouped)]
    assert len(tensors[0]) == 4 and len(tensors[1]) == 2  # q, k, v, o: the group's one and o's


def test_a_fused_group_leaves_the_table_with_its_model():
    model, x = quantized("int8_wo")
    FusedRows([model.get_submodule(f) for f in QKV])
    slots = [model.get_submodule(f)._fused_slot for f in QKV]  # the group's key + each one's index
    key = slots[0]
    assert slots == [key, key + 1, key + 2] and key % forwards.GROUP_SLOTS == 0
    assert forwards.FUSED_UNITS[key] is model.q_proj._fused_unit
    twin = copy.deepcopy(model)  # a copy's members register their own group
    twin_key = twin.q_proj._fused_slot
    assert twin.k_proj._fused_slot == twin_key + 1 and twin_key != key
    assert forwards.FUSED_UNITS[twin_key] is twin.q_proj._fused_unit
    del model
    gc.collect()
    assert key not in forwards.FUSED_UNITS and twin_key in forwards.FUSED_UNITS
    with torch.no_grad():
        twin(x)


def test_fuse_problem_names_what_differs():
    int8 = [search_space.get("int8_wo").build(nn.Linear(16, 16), fqn="x") for _ in range(2)]
    int4 = search_space.get("int4_wo", group_size=32).build(nn.Linear(32, 16), fqn="y")
    tensor = [search_space.get("fp8_dyn", granularity="tensor").build(nn.Linear(16, 16), fqn="z") for _ in range(2)]
    assert fuse_problem(int8) is None
    assert "at least two" in fuse_problem(int8[:1])
    assert "at most 16 layers, not 17" in fuse_problem(int8[:1] * 17)  # a member's slot holds its index
    assert "differ in class" in fuse_problem([int8[0], int4])
    assert "not row-wise" in fuse_problem(tensor)
    assert "only autoao's quantized layers" in fuse_problem([int8[0], nn.Linear(16, 16)])
    int8[1].set_kernel("dequant")
    assert "differ in kernel: int8pack, dequant" in fuse_problem(int8)
    with pytest.raises(ValueError, match="cannot fuse"):
        FusedRows([int8[0], int4])


def test_set_kernel_on_a_member_switches_the_group():
    model, _ = quantized("int4_wo(group_size=32)")
    group = FusedRows([model.get_submodule(f) for f in QKV])
    model.k_proj.set_kernel("triton")
    assert group.module.kernel == "triton" and {model.get_submodule(f).kernel for f in QKV} == {"triton"}
    assert plan_of(model).kernels == {f: "triton" for f in QKV}


def test_load_state_dict_into_a_fused_model_reaches_the_fused_module():
    src, x = quantized("int8_wo", seed=1)
    model, _ = quantized("int8_wo", seed=2)
    FusedRows([model.get_submodule(f) for f in QKV])
    model.load_state_dict(src.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(x), src(x), rtol=0, atol=0)


def test_dtype_cast_moves_the_group_once():
    model, x = quantized("int8_dyn", bias=True)
    alone, _ = quantized("int8_dyn", bias=True)
    FusedRows([model.get_submodule(f) for f in QKV])
    model.float()
    alone.float()
    assert model.q_proj.fused[0].module.bias.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(model(x.float()), alone(x.float()), rtol=0, atol=0)


##### plans with fusions ##########################################################################

def test_plan_fuse_takes_groups_with_one_fusable_candidate():
    int8, int4 = search_space.get("int8_wo"), search_space.get("int4_wo", group_size=32)
    layers = {"q_proj": int8, "k_proj": int8, "v_proj": int8, "o_proj": int8}
    assert Plan(dict(layers)).fuse([QKV]).fusions == [QKV]
    assert Plan({**layers, "v_proj": int4}).fuse([QKV]).fusions == []  # mixed candidates
    assert Plan({**layers, "q_proj": search_space.get("bf16")}).fuse([QKV]).fusions == []  # the baseline
    assert Plan(dict(layers), kernels={"q_proj": "dequant"}).fuse([QKV]).fusions == []  # mixed kernels
    tensor = search_space.get("fp8_dyn", granularity="tensor")
    assert Plan({f: tensor for f in QKV}).fuse([QKV]).fusions == []  # one scale per tensor


def test_plan_with_fusions_round_trips_and_applies(tmp_path):
    torch.manual_seed(0)
    model = Attn().to(torch.bfloat16)
    ref_model = Attn().to(torch.bfloat16)
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    plan = Plan.for_model(model, {f: search_space.get("int8_dyn") for f in (*QKV, "o_proj")}).fuse([QKV])
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.fusions == [QKV]
    autoao.apply(model, again)
    autoao.apply(ref_model, Plan.for_model(ref_model, plan.layers))  # the same, unfused
    assert model.q_proj.fused is not None and ref_model.q_proj.fused is None
    assert plan_of(model).fusions == [QKV]
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref_model(x), rtol=0, atol=0)
    autoao.save(model, tmp_path / "m")
    loaded = autoao.load(Attn().to(torch.bfloat16), tmp_path / "m")
    assert loaded.q_proj.fused is not None and plan_of(loaded).fusions == [QKV]
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_validate_lists_every_bad_fusion():
    model = Attn()
    int8, int4 = search_space.get("int8_wo"), search_space.get("int4_wo", group_size=32)
    plan = Plan({"q_proj": int8, "k_proj": int4, "v_proj": int8, "o_proj": int8},
                fusions=[("q_proj", "k_proj"), ("v_proj", "norm"), ("o_proj",), ("v_proj", "o_proj")])
    with pytest.raises(PlanError) as e:
        autoao.apply(model, plan)
    msg = str(e.value)
    assert "different candidates (int8_wo, int4_wo(group_size=32))" in msg
    assert "norm not in the plan's layers" in msg
    assert "at least two layers" in msg
    assert "v_proj: in two fusions" in msg
    assert all(isinstance(model.get_submodule(f), nn.Linear) for f in QKV)  # nothing applied
    bad_kernel = Plan({f: int8 for f in QKV}, kernels={"q_proj": "dequant"}, fusions=[QKV])
    with pytest.raises(PlanError, match="different kernels"):
        autoao.apply(Attn(), bad_kernel)
    with pytest.raises(PlanError, match="'fusions' must be a list of lists"):
        Plan.from_dict({"autoao_plan_version": 1, "layers": {}, "fusions": "q_proj,k_proj"})


def test_fused_members_are_quantized_linears():
    model, _ = quantized("int8_wo")
    FusedRows([model.get_submodule(f) for f in QKV])
    assert all(isinstance(model.get_submodule(f), QuantizedLinear) for f in QKV)
    assert "fused=1/3" in repr(model.k_proj)


def test_report_says_which_layers_run_fused():
    """The report reads fusion from the shipped plan (what the run decided: the cost model fused a
    group only where its fused time was faster, test_search), not from the timings again: the
    members of a fused group run as one kernel with their siblings; a group that shares one
    choice but was not fused is shown as shared; a layer of no group has no siblings."""
    from autoao.records import (AccuracySpec, DeviceInfo, FusedRecord, GroupRecord, LayerRecord, Latency, ModelInfo,
                                RunContext)
    from autoao.reports.layers import explain

    names = (*QKV, "o_proj")
    layers = [LayerRecord(f, 8, 8, 1, {1: 1}, {"bf16": 10.0, "int8_wo": 6.0}, {}, {}, [], {}, ["bf16", "int8_wo"], {})
              for f in names]
    ctx = RunContext("2026-12-01T00:00:00+00:00", ModelInfo("Attn", 1, 1, "bfloat16", 4), DeviceInfo("cpu", "x", "eager"),
                     {}, "9 trials", 0.01, 0, None, AccuracySpec(1), "sqlite:///x.db", "s", Latency(1.0, 1.0), 0.2, [],
                     [GroupRecord("{q_proj,k_proj,v_proj}", list(QKV), ["bf16", "int8_wo"]),
                      GroupRecord("o_proj", ["o_proj"], ["bf16", "int8_wo"])],
                     [FusedRecord(list(QKV), {"bf16": 25.0, "int8_wo": 12.0})], layers)
    plan = {f: "int8_wo" for f in names}
    fused = {lay.fqn: lay for lay in explain(ctx, plan, [list(QKV)], {})}
    assert all(fused[f].fused and set(fused[f].siblings) == set(QKV) - {f} for f in QKV)
    assert fused["k_proj"].siblings == ("q_proj", "v_proj") and fused["k_proj"].chosen == "int8_wo"
    assert not fused["o_proj"].fused and fused["o_proj"].siblings == ()
    shared = {lay.fqn: lay for lay in explain(ctx, plan, [], {})}  # one choice, not run as one kernel
    assert not any(lay.fused for lay in shared.values()) and shared["k_proj"].siblings == ("q_proj", "v_proj")
