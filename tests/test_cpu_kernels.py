"""The CPU's alternative kernels and per-token-count routes: every kernel and route computes its
candidate's numbers (eager, compiled, after save/load), bad routes are refused before anything
changes, and timing routes each token count to the kernel fastest there."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoao
from autoao import search_space
from autoao.cli import main
from autoao.evaluators import harness, timing
from autoao.evaluators.cache import Timing
from autoao.kernels import cpu_int8, cpu_isa
from autoao.kernels.routes import describe_route, parse_route, route_from_timings, route_text
from autoao.plan import Plan, PlanError

# (candidate, kernel or route) for every CPU kernel of every candidate that has several, plus a
# route over each shared layout; the rows tested (1 and 8) fall on both sides of the cut 4
KERNELS = [
    ("int8_wo", "int8pack"), ("int8_wo", "dequant"), ("int8_wo", "int8pack<=4,dequant"),
    ("int8_dyn", "int_mm"), ("int8_dyn", "bf16_mm"), ("int8_dyn", "int_mm<=4,bf16_mm"),
    ("int8_dyn(act=tensor)", "fbgemm"), ("int8_dyn(act=tensor)", "onednn"),
    ("int4_wo(group_size=64)", "tinygemm_cpu"), ("int4_wo(group_size=64)", "dequant"),
    ("int4_wo(group_size=64)", "tinygemm_cpu<=4,dequant"),
    ("fp32_compute", "fp32"), ("fp32_compute", "native"), ("fp32_compute", "fp32<=4,native"),
]
KERNEL_VS_REFERENCE_DB = 40


def sqnr(ref: torch.Tensor, y: torch.Tensor) -> float:
    ref, y = ref.double(), y.double()
    noise = (ref - y).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(ref.pow(2).sum() / noise))


def skip_without_engine(route: str) -> None:
    for kern, _ in parse_route(route):
        if kern in cpu_int8.ENGINES and (problem := cpu_int8.engine_missing(kern)):
            pytest.skip(problem)


def make_linear(k: int = 256, n: int = 96) -> nn.Linear:
    torch.manual_seed(0)
    lin = nn.Linear(k, n).to(torch.bfloat16)
    nn.init.normal_(lin.bias, std=0.5)
    return lin


def build(name: str, route: str) -> nn.Module:
    return search_space.get(name).build(make_linear(), fqn="layer").set_kernel(route)


@pytest.mark.parametrize("name, route", KERNELS, ids=lambda v: str(v))
def test_kernel_matches_reference_eager_and_compiled(name, route):
    skip_without_engine(route)
    lin = make_linear()
    m = search_space.get(name).build(lin, fqn="layer").set_kernel(route)
    assert m.kernel == route
    torch._dynamo.reset()  # one compiled module per test (the shared forward's recompile limit)
    compiled = torch.compile(m, fullgraph=True)
    with torch.no_grad():
        for rows in (1, 8):
            x = torch.randn(rows, 256, dtype=torch.bfloat16)
            ideal = nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
            y, yc = m(x), compiled(x)
            assert y.dtype == yc.dtype == torch.bfloat16 and y.shape == (rows, 96)
            assert sqnr(m.reference(x), y) >= KERNEL_VS_REFERENCE_DB, (rows, m.kernel_at(rows))
            assert sqnr(m.reference(x), yc) >= KERNEL_VS_REFERENCE_DB, (rows, m.kernel_at(rows))
            assert sqnr(ideal, y) >= search_space.get(name).sqnr_bound_db, (rows, m.kernel_at(rows))


def test_route_runs_each_kernel_on_its_rows():
    m = build("int8_wo", "int8pack<=4,dequant")
    assert [m.kernel_at(r) for r in (1, 4, 5, 256)] == ["int8pack", "int8pack", "dequant", "dequant"]
    calls = []
    real = torch._weight_int8pack_mm
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "_weight_int8pack_mm", lambda *a: calls.append(a[0].shape[0]) or real(*a))
        with torch.no_grad():
            m(torch.randn(3, 256, dtype=torch.bfloat16))
            m(torch.randn(2, 7, 256, dtype=torch.bfloat16))  # 14 rows: dequant
    assert calls == [3]


@pytest.mark.parametrize("name, route", KERNELS, ids=lambda v: str(v))
def test_kernel_survives_save_and_load_bit_exactly(name, route, tmp_path):
    skip_without_engine(route)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32, bias=False)).to(torch.bfloat16)
    fresh = copy.deepcopy(model)
    plan = Plan.uniform(model, name)
    plan.kernels = {fqn: route for fqn in plan.layers}
    autoao.apply(model, plan)
    autoao.save(model, tmp_path)
    for p in fresh.parameters():
        nn.init.normal_(p)
    autoao.load(fresh, tmp_path)
    assert {fresh.get_submodule(f).kernel for f in plan.layers} == {route_text(parse_route(route))}
    with torch.no_grad():
        for rows in (1, 8):
            x = torch.randn(rows, 128, dtype=torch.bfloat16)
            assert torch.equal(model(x), fresh(x))
    a, b = model.state_dict(), fresh.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_deep_copies_pack_a_weight_of_their_own():
    skip_without_engine("fbgemm")
    m = build("int8_dyn(act=tensor)", "fbgemm")
    twin = copy.deepcopy(m)
    assert twin._handle != m._handle  # timing's streaming copies read their own packed weights
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(m(x), twin(x))


def test_per_tensor_candidate_names_and_where_it_runs():
    assert search_space.get("int8_dyn").name == "int8_dyn"  # the per-token default keeps its name
    assert search_space.get("int8_dyn(act=tensor)").to_dict() == {"family": "int8_dyn", "params": {"act": "tensor"}}
    with pytest.raises(ValueError, match="act must be one of token, tensor"):
        search_space.get("int8_dyn", act="row")
    spec = search_space.LayerSpec("l", 256, 96, False, torch.bfloat16)
    assert "CPU" in search_space.get("int8_dyn(act=tensor)").supports(spec, "cuda")
    assert "float32" in search_space.get("fp32_compute").supports(
        search_space.LayerSpec("l", 256, 96, False, torch.float32), "cpu")
    assert not search_space.get("int8_dyn(act=tensor)").fusable  # one scale over every row


##### routes ####################################################################################

def test_parse_route_and_its_inverse():
    assert parse_route("int8pack<=16,dequant") == (("int8pack", 16), ("dequant", None))
    assert parse_route(" a <= 2 , b<=64, c ") == (("a", 2), ("b", 64), ("c", None))
    assert parse_route("fp32") == (("fp32", None),)
    for text in ("int8pack<=16,dequant", "a<=2,b<=64,c", "fp32"):
        assert route_text(parse_route(text)) == text
    assert describe_route("int8pack<=16,dequant") == "int8pack up to 16 rows, dequant above"
    assert describe_route("a<=2,b<=64,c") == "a up to 2 rows, b up to 64, c above"


@pytest.mark.parametrize("text, message", [
    ("a<=16,b<=4,c", "cuts must increase"),
    ("a<=0,b", "not a positive row count"),
    ("a<=x,b", "not a positive row count"),
    ("a,b", "needs '<=rows'"),
    ("a<=4,b<=8", "has no '<=rows'"),
    ("a<=4,a", "appears twice"),
    ("", "a kernel name or"),
    ("a<=4,,b", "has no kernel name"),
])
def test_bad_routes_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_route(text)


def test_modules_refuse_unknown_kernels_mixed_layouts_and_mixed_devices():
    m = build("int8_wo", "int8pack")
    with pytest.raises(ValueError, match="no kernel 'int8pak'.*did you mean 'int8pack'"):
        m.set_kernel("int8pak<=16,dequant")
    with pytest.raises(ValueError, match="mixes kernels of different devices"):
        m.set_kernel("triton<=8,int8pack")
    with pytest.raises(ValueError, match="cuts must increase"):
        m.set_kernel("int8pack<=16,dequant<=4,int8pack")
    assert m.kernel == "int8pack"  # unchanged by the refusals
    skip_without_engine("fbgemm<=4,onednn")
    d = build("int8_dyn(act=tensor)", "fbgemm")
    with pytest.raises(ValueError, match="mixes runtime layouts"):
        d.set_kernel("fbgemm<=4,onednn")


def test_another_devices_kernel_runs_this_devices_default():
    # a plan made on a GPU ("triton") applies on a CPU: the CPU module runs its own default
    m = build("int8_wo", "triton")
    assert m.kernel == "triton" and m._route == (("int8pack", None),)
    with torch.no_grad():
        x = torch.randn(2, 256, dtype=torch.bfloat16)
        assert sqnr(m.reference(x), m(x)) >= KERNEL_VS_REFERENCE_DB


def test_a_plan_with_a_bad_route_is_refused_before_any_swap():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)).to(torch.bfloat16)
    plan = Plan.uniform(model, "int8_wo")
    plan.kernels = {"0": "int8pack<=16,dequant", "2": "int8pack<=16,dequnt"}
    with pytest.raises(PlanError) as e:
        autoao.apply(model, plan)
    assert "  2: int8_wo has no kernel 'dequnt'" in str(e.value) and "did you mean 'dequant'" in str(e.value)
    assert all(isinstance(model.get_submodule(f), nn.Linear) for f in ("0", "2"))
    plan.kernels = {"0": "int8pack<=16,dequant"}
    autoao.apply(model, plan)
    assert autoao.plan_of(model).kernels == {"0": "int8pack<=16,dequant"}  # "2" runs the default


def test_route_from_timings_cuts_at_the_geometric_mean():
    assert route_from_timings({1: "a", 256: "b"}) == "a<=16,b"
    assert route_from_timings({1: "a", 4: "a", 64: "b", 2048: "b"}) == "a<=16,b"
    assert route_from_timings({1: "a", 16: "b", 256: "c"}) == "a<=4,b<=64,c"
    assert route_from_timings({1: "a", 256: "a"}) == "a"
    assert route_from_timings({1: "a", 16: "b", 256: "a"}) == "a<=4,b"  # a kernel keeps one range


def t(us: float) -> Timing:
    return Timing(us, us, us, 5)


def test_pick_route_takes_the_fastest_kernel_at_each_token_count():
    by_kernel = {"int8pack": {1: t(10), 256: t(1000)}, "dequant": {1: t(50), 256: t(100)}}
    one_layout = {k.name: k.layout for k in search_space.get("int8_wo").kernels("cpu")}
    assert timing.pick_route(by_kernel, None, one_layout) == "int8pack<=16,dequant"
    two_layouts = {k: k for k in by_kernel}
    assert timing.pick_route(by_kernel, None, two_layouts) == "dequant"  # two layouts: one kernel for all M
    near = {"int8pack": {1: t(10.1), 256: t(100)}, "dequant": {1: t(10), 256: t(100)}}
    assert timing.pick_route(near, None, one_layout) == "int8pack"  # within the margin: the first listed
    failed = {"int8pack": {1: Timing.failed("x"), 256: t(5)}, "dequant": {1: t(9), 256: t(7)}}
    assert timing.pick_route(failed, None, one_layout) == "dequant<=16,int8pack"
    assert timing.pick_route({None: {1: t(3)}}) is None
    assert timing.route_timing(by_kernel, "int8pack<=16,dequant", 256).median_us == 100


def test_measure_latencies_routes_a_shape_through_the_fastest_kernel_per_token_count(monkeypatch, tmp_path):
    fake = {"int8pack": {1: 10.0, 256: 900.0}, "dequant": {1: 40.0, 256: 120.0},
            "fbgemm": {1: 20.0, 256: 300.0}, "onednn": {1: 30.0, 256: 200.0}}
    monkeypatch.setattr(harness, "time_missing", lambda cand, kern, n, k, tokens, *a: {
        m: t(fake.get(kern, {}).get(m, 150.0)) for m in tokens})
    cands = [search_space.get(c) for c in ("bf16", "int8_wo", "int8_dyn(act=tensor)")]
    table = timing.measure_latencies([(96, 256)], [1, 256], cands, device="cpu",
                                     cache=timing.TimingCache(tmp_path / "t.sqlite"), progress=False)
    assert table.kernel_for("int8_wo", 256, 96) == "int8pack<=16,dequant"
    assert [table.get("int8_wo", m, 256, 96).median_us for m in (1, 256)] == [10.0, 120.0]
    # fbgemm and onednn pack different layouts: one kernel for both token counts, the least total
    assert table.kernel_for("int8_dyn(act=tensor)", 256, 96) == "onednn"
    assert set(table.kernel_timings[("int8_wo", 256, 96)]) == {"int8pack", "dequant"}


def test_cli_kernels_all_kernels_lists_every_cpu_kernel(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(harness, "time_missing", lambda cand, kern, n, k, tokens, *a: {
        m: t({"int8pack": 5.0 * m, "dequant": 20.0, "fp32": 4.0 * m, "native": 10.0}.get(kern, 30.0))
        for m in tokens})
    rc = main(["kernels", "--shapes", "32x64", "--tokens", "1,64", "--device", "cpu", "--quiet", "--all-kernels",
               "--candidates", "int8_wo,int8_dyn,int8_dyn(act=tensor),fp32_compute", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    for kern in ("int8pack", "dequant", "int_mm", "bf16_mm", "fbgemm", "onednn", "fp32", "native"):
        assert f"  @{kern}" in out
    assert "kernel int8pack up to 8 rows, dequant above" in out
    assert "kernel fp32 up to 8 rows, native above" in out
    chosen = [line.split()[0] for line in out.splitlines() if line.strip().startswith("@") and line.endswith("chosen")]
    assert chosen == ["@int8pack", "@dequant", "@int_mm", "@fbgemm", "@fp32", "@native"]  # ties: the first listed


##### instruction sets ##########################################################################

def test_isa_names_follow_each_librarys_dispatch_rule(monkeypatch):
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset({"avx512f", "avx2", "avx512_vnni", "avx512_bf16"}))
    assert cpu_isa.isa_of("bf16_mm") == "AVX512-BF16"
    assert cpu_isa.isa_of("onednn_int8") == "AVX512-VNNI" and not cpu_isa.fbgemm_reduce_range()
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset({"avx2"}))
    assert cpu_isa.isa_of("bf16_mm") == "bf16 converted to fp32"
    assert cpu_isa.isa_of("fbgemm") == "AVX2 (7-bit activations)" and cpu_isa.fbgemm_reduce_range()
    assert cpu_isa.describe_features() == "AVX2"
    assert "(AVX2)" in search_space.get("int8_wo").describe("cpu")
    with pytest.raises(ValueError, match="unknown CPU kernel library"):
        cpu_isa.isa_of("mkl")


def test_report_shows_a_route_in_words():
    """The run records the chosen route in words (describe_route); the report shows them."""
    from autoao.kernels.routes import describe_route
    from autoao.records import KernelTimes
    from autoao.reports.layers import _kernel

    route = "int8pack<=16,dequant"
    info = KernelTimes(route, {"int8pack": 200.0, "dequant": 150.0, route: 100.0}, describe_route(route))
    assert _kernel(info, None) == (route, "int8pack up to 16 rows, dequant above; int8pack 2.00x slower; "
                                          "dequant 1.50x slower")


# a compiled caller (transformers' compiled generate(), torch.compile(model)) evaluates dynamo's
# guards on every call, once per Python value forward read: on the H200 autoao's modules added
# 0.2-0.5 ms a token of them to SmolLM2's 211 layers (results/2026-12-03-h200/generate-smollm2-synth/)
EXTRA_GUARDS_AT_MOST = {"int8_wo": 11, "fp8_wo": 8}


# the same off the host ("meta" stands in for a GPU): the weight-only formats' one packed parameter,
# checked as nn.Linear's weight is, the key of its constants (kernels/weight_only.py, packed_forward:
# two checks of one int) and the identity of the path installed for the module (`_run`, kernels/forwards.py)
EXTRA_GUARDS_OFF_HOST_AT_MOST = {"int8_wo": 3, "fp8_wo": 3}


def _first_layer_guards(model: nn.Module, device: str) -> list[tuple[str, str]]:
    """(name, kind) of the guards a compiled call of `model` checks on its first layer."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(torch.randn(1, 256, dtype=torch.bfloat16, device=device))
    return [(g.name, g.create_fn_name()) for g in explained.out_guards if "_modules['0']" in g.name]


def _two_linears() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 256, bias=False))
    return model.to(torch.bfloat16).eval().requires_grad_(False)


@pytest.mark.parametrize("name", sorted(EXTRA_GUARDS_AT_MOST))
def test_compiled_module_reads_little_python_state(name):
    model = _two_linears()
    linear = len(_first_layer_guards(model, "cpu"))
    planned = autoao.apply(copy.deepcopy(model), Plan.uniform(model, name))
    assert not isinstance(planned[0], nn.Linear)
    extra = len(_first_layer_guards(planned, "cpu")) - linear
    assert 0 < extra <= EXTRA_GUARDS_AT_MOST[name], f"{name}: {extra} guards more than nn.Linear's {linear}"


@pytest.mark.parametrize("name", sorted(EXTRA_GUARDS_OFF_HOST_AT_MOST))
def test_a_weight_only_module_off_the_host_gives_a_compiled_caller_one_tensor(name):
    model = _two_linears()
    on_host = autoao.apply(copy.deepcopy(model), Plan.uniform(model, name))
    tensors = sorted(g for g, kind in _first_layer_guards(on_host, "cpu") if kind == "TENSOR_MATCH")
    assert tensors == ["L['fn']._modules['0']._buffers['w_q']", "L['fn']._modules['0']._buffers['w_scale']"]
    off_host = on_host.to("meta")
    guards = _first_layer_guards(off_host, "meta")
    assert [g for g, kind in guards if kind == "TENSOR_MATCH"] == ["L['fn']._modules['0']._parameters['w_packed']"]
    assert not [g for g, kind in guards if "_buffers" in g or kind == "NO_TENSOR_ALIASING"]
    linear = len(_first_layer_guards(copy.deepcopy(model).to("meta"), "meta"))
    assert 0 < len(guards) - linear <= EXTRA_GUARDS_OFF_HOST_AT_MOST[name], (len(guards), linear)
    # the packed parameter is runtime, not state: state_dict holds the canonical tensors as on the
    # host, and a strict load needs nothing more
    assert off_host.state_dict().keys() == on_host.state_dict().keys()
    off_host.load_state_dict(on_host.state_dict())
    assert not off_host[0].w_packed.requires_grad and off_host[0].w_packed.dtype == torch.uint8
    # eager calls read the views; dropping the runtime tensors drops them too (a fused member's)
    layer = off_host[0]
    assert layer.w_q.shape == (256, 256) and layer.w_q.untyped_storage().nbytes() == layer.w_packed.numel()
    layer.drop_runtime()
    assert not any(hasattr(layer, t) for t in ("w_q", "w_scale", "w_packed"))


def test_a_pickled_packed_module_keys_its_constants_where_it_is_loaded(monkeypatch):
    """A packed module keeps the key of its traced constants, which is only this process's: a module
    pickled elsewhere gets this process's key for its own constants, not whatever the old key names
    here. (Restored through __setstate__, as pickle restores it; "meta" tensors do not pickle.)"""
    from autoao.kernels import weight_only

    model = _two_linears()
    off_host = autoao.apply(copy.deepcopy(model), Plan.uniform(model, "fp8_wo")).to("meta")
    mine = off_host[0]._packed_call
    # the loading process has packed other layouts, under every key up to this module's
    others = {key: (torch.int8, torch.bfloat16, (("triton", key + 1), ("dequant", None)), True)
              for key in range(off_host[0]._traced + 1)}
    monkeypatch.setattr(weight_only, "PACKED_CALLS", dict(others))
    monkeypatch.setattr(weight_only, "_PACKED_KEYS", {call: key for key, call in others.items()})
    loaded = copy.deepcopy(off_host)
    assert weight_only.PACKED_CALLS[loaded[0]._traced] == mine and mine not in others.values()
    assert loaded[0]._traced != off_host[0]._traced


@pytest.mark.parametrize("name", sorted(EXTRA_GUARDS_OFF_HOST_AT_MOST))
def test_canonical_weights_on_the_device_are_the_packed_buffers_bytes(name):
    """Modules built to be measured (canonical_on_device) hold one copy of a weight off the host; a
    fused group's members keep viewing the buffer it runs from when it re-packs ("meta" stands in
    for a GPU: it checks which storage each tensor views, not numbers)."""
    from autoao.kernels._base import canonical_on_device
    from autoao.kernels.fused import FusedRows
    from autoao.kernels.tensors import same_storage

    cand = search_space.get(name)
    lins = [nn.Linear(64, n, bias=False).to(torch.bfloat16) for n in (32, 16)]
    with canonical_on_device():
        alone = cand.build(lins[0]).to("meta")
        alone.set_canonical(cand.build(lins[0]).canonical())
        members = [cand.build(lin).to("meta") for lin in lins]
        group = FusedRows(members)
    assert same_storage(alone.canonical()["qweight"], alone.w_packed) and same_storage(alone.w_q, alone.w_packed)
    buf = group.module.w_packed
    assert all(same_storage(m.canonical()["qweight"], buf) for m in members)
    group.repack()  # after a member wrote its rows through (load_state_dict)
    assert same_storage(group.module.w_packed, buf) and same_storage(group.module.w_q, buf)
    on_host = cand.build(lins[0])  # the host's layout: the canonical weight is the runtime one
    assert on_host.w_q is on_host.canonical()["qweight"] and not hasattr(on_host, "w_packed")


@pytest.mark.parametrize("n,k", [(1, 1), (3, 5), (7, 13), (24, 576), (576, 1536)])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_packed_buffer_holds_weight_and_scales_and_says_its_rows(n, k, scale_dtype):
    from autoao.kernels.weight_only import packed_buffer, packed_views

    q = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    s = torch.rand(n).to(scale_dtype)
    buf = packed_buffer(q, s, "cpu")
    w, sc = packed_views(buf, n, k, torch.int8, scale_dtype)
    assert torch.equal(w, q) and torch.equal(sc, s) and w.is_contiguous() and sc.is_contiguous()
    assert w.data_ptr() == buf.data_ptr() and sc.data_ptr() + sc.nbytes == buf.data_ptr() + buf.numel()
    if k + scale_dtype.itemsize >= 16:  # Triton's pointer specialization
        assert (sc.data_ptr() - buf.data_ptr()) % 16 == 0
    assert buf.numel() // (k + scale_dtype.itemsize) == n  # what a traced call reads N from


@pytest.mark.parametrize("qdtype,scale_dtype", [(torch.int8, torch.bfloat16), (torch.float8_e4m3fn, torch.float32)],
                         ids=str)
def test_packed_views_made_in_a_compiled_graph_give_the_eager_numbers(qdtype, scale_dtype):
    """What a traced weight-only module off the host does above the GEMV's rows (the views of its
    packed buffer, the weight dequantized into one matmul), compiled by inductor here."""
    from autoao.kernels.weight_only import packed_buffer, packed_views, per_channel_weight_only

    torch.manual_seed(0)
    n, k = 48, 72
    q = (torch.randn(n, k) * 40).clamp(-127, 127).to(qdtype)
    buf = packed_buffer(q, torch.rand(n).to(scale_dtype) + 0.01, "cpu")
    x = torch.randn(16, k, dtype=torch.bfloat16)

    def layer(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return per_channel_weight_only(x, *packed_views(buf, n, k, qdtype, scale_dtype), False)

    torch._dynamo.reset()
    eager, compiled = layer(x, buf), torch.compile(layer, fullgraph=True)(x, buf)
    assert compiled.shape == (16, n) and torch.allclose(compiled.float(), eager.float(), rtol=2e-2, atol=2e-2)
