"""The CUDA int4 kernel's layout (packing, on the CPU) and, where a GPU and nvcc exist, the kernel
against the dequantized reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoao import search_space
from autoao.kernels import cuda_build, cuda_int4
from autoao.kernels.ops import EAGER
from autoao.kernels.quant import dequantize_int4_groupwise, quantize_int4_groupwise


@pytest.mark.parametrize("n,k,group", [(32, 128, 32), (48, 256, 64), (16, 384, 128), (64, 192, 64)])
def test_pack_round_trips_and_dequantizes_like_the_canonical_format(n, k, group):
    torch.manual_seed(0)
    q, s, z = quantize_int4_groupwise(torch.randn(n, k), group)
    qw, sz = cuda_int4.pack_mma(q, s, z, group)
    assert qw.shape == (n // 16, k // 64, 32, 4) and qw.dtype == torch.int32
    q2, s2, z2 = cuda_int4.unpack_mma(qw, sz, group)
    assert torch.equal(q2, q.to(torch.int32)) and torch.equal(s2, s) and torch.equal(z2, z)
    ref = dequantize_int4_groupwise(q, s, z).float()
    assert torch.equal(cuda_int4.dequantize_mma(qw, sz, group, torch.float32), ref)


def test_each_nibble_and_scale_sits_where_the_kernel_reads_it():
    # The .cu header's contract: row 16T + 8ro + g, k = 64c + 32h + 8t + 4s + e sits in lane 4g + t,
    # word 2h + s, at bit (0, 16, 8, 24)[e] + 4ro; scales and zeros of (row, group) at
    # sz[T, u, g, i, ro] as (scale bits | zero bits << 16).
    n, k, group = 32, 128, 32
    for row, kk in [(0, 0), (9, 45), (31, 127), (20, 70)]:
        q = torch.zeros(n, k, dtype=torch.int32)
        q[row, kk] = 5
        s = torch.zeros(n, k // group, dtype=torch.bfloat16)
        s[row, kk // group] = 2.0  # bits 0x4000
        z = torch.zeros_like(s)
        z[row, kk // group] = -1.0  # bits 0xBF80
        qw, sz = cuda_int4.pack_mma(q, s, z, group)
        tile, ro, g = row // 16, (row % 16) // 8, row % 8
        c, h, t, sub, e = kk // 64, (kk % 64) // 32, (kk % 32) // 8, (kk % 8) // 4, kk % 4
        expected = torch.zeros_like(qw)
        expected[tile, c, 4 * g + t, 2 * h + sub] = 5 << ((0, 16, 8, 24)[e] + 4 * ro)
        assert torch.equal(qw, expected), (row, kk)
        u, i = kk // 64, (kk % 64) // group  # units of 64 k: two groups of 32 each
        (hit,) = (sz != 0).nonzero().tolist()
        assert hit == [tile, u, g, i, ro], (row, kk, hit)
        assert sz[tuple(hit)].item() & 0xFFFFFFFF == 0xBF804000


def test_unsupported_shapes_are_named():
    assert cuda_int4.unsupported(4096, 4096, 128) is None
    assert "multiple of 16" in cuda_int4.unsupported(40, 4096, 128)
    assert "multiple of 128" in cuda_int4.unsupported(4096, 576, 128)
    assert cuda_int4.unsupported(4096, 576, 64) is None
    assert "group_size 256" in cuda_int4.unsupported(4096, 4096, 256)
    with pytest.raises(ValueError, match="multiple of 16"):
        cuda_int4.pack_mma(torch.zeros(40, 128, dtype=torch.int32), torch.zeros(40, 1), torch.zeros(40, 1), 128)


def test_missing_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_build.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cuda_build, "TOOLKIT_DEFAULT", str(tmp_path))
    with pytest.raises(RuntimeError, match="the CUDA int4 kernel needs nvcc.*'tinygemm'"):
        cuda_build.nvcc(cuda_int4._WHAT, cuda_int4._INSTEAD)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        cuda_int4.library(128)


def test_module_takes_the_gemv_up_to_8_rows_and_the_dequantized_weight_above(monkeypatch):
    # The module's CUDA "cuda" branch, on the CPU: the build is skipped and the op's body replaced by
    # the layout's own dequantization, counting its calls.
    calls = []

    def fake_gemv(x, qw, sz, group_size, next_qw=None, next_sz=None):
        calls.append(x.shape[0])
        return x.to(torch.bfloat16) @ cuda_int4.dequantize_mma(qw, sz, group_size).t()

    def fake_dequant(qw, sz, group_size):
        calls.append("dequant")
        return cuda_int4.dequantize_mma(qw, sz, group_size)

    monkeypatch.setattr(cuda_int4, "library", lambda group_size, device=None: None)
    monkeypatch.setitem(EAGER, "int4_gemv_cuda", fake_gemv)  # what an eager forward calls (kernels/ops.py)
    monkeypatch.setitem(EAGER, "int4_dequant_cuda", fake_dequant)
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 48, bias=True).to(torch.bfloat16)
    mod = search_space.get("int4_wo", group_size=64).build(lin)
    mod.kernel = "cuda"
    mod._pack_mma(torch.device("cpu"))
    for shape in [(1, 256), (2, 4, 256), (20, 256)]:
        x = torch.randn(*shape).to(torch.bfloat16)
        y, ref = mod._forward(x), mod.reference(x)
        assert y.shape == ref.shape and y.dtype == torch.bfloat16
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2, shape
    assert calls == [1, 8, "dequant"]  # 20 rows: the dequantized weight in one F.linear
    calls.clear()
    x = torch.randn(1, 256).to(torch.bfloat16).requires_grad_()
    mod._forward(x).float().sum().backward()  # the GEMV has no backward: the dequantized weight carries x's gradient
    want = mod.reference(torch.eye(256)).sum(1) - mod.reference(torch.zeros(1, 256)).sum()  # each k's column sum of W
    assert calls == ["dequant"] and ((x.grad[0].float() - want).norm() / want.norm()).item() < 1e-2
    calls.clear()
    with torch.no_grad():  # nothing recorded: such an x takes the GEMV
        mod._forward(x)
    assert calls == [1]


def test_each_int4_gemv_is_told_the_next_one_to_prefetch(monkeypatch):
    # apply links every int4 module to the module that runs after it (fused siblings as their
    # group's module), and the CUDA branch hands that module's layouts to the kernel.
    import copy

    import autoao
    from autoao.plan import Plan
    from autoao.kernels import FusedRows

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(128, 64) for _ in range(3))
            self.o_proj = torch.nn.Linear(64, 128)
            self.down = torch.nn.Linear(128, 128)  # stays bf16: not in the plan

        def forward(self, x):
            return self.down(self.o_proj(self.q_proj(x) + self.k_proj(x) + self.v_proj(x)))

    model = torch.nn.Sequential(Block(), Block()).to(torch.bfloat16)
    int4 = search_space.get("int4_wo", group_size=64)
    plan = Plan.for_model(model, {f"{b}.{p}": int4 for b in "01" for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
                          fusions=[tuple(f"{b}.{p}" for p in ("q_proj", "k_proj", "v_proj")) for b in "01"])
    autoao.apply(model, plan)
    keys = set(model.state_dict())
    qkv0, qkv1 = (model.get_submodule(f"{b}.q_proj").fused[0].module for b in "01")
    o0, o1 = model[0].o_proj, model[1].o_proj
    assert isinstance(model[0].q_proj.fused[0], FusedRows)
    assert qkv0.prefetch_next is o0 and o0.prefetch_next is qkv1 and qkv1.prefetch_next is o1
    assert o1.prefetch_next is None
    assert set(model.state_dict()) == keys and "prefetch_next" not in dict(model.named_modules())
    twin = copy.deepcopy(model)  # links follow the copy, not the original
    assert twin[0].o_proj.prefetch_next is twin[1].q_proj.fused[0].module

    seen = []

    def fake_gemv(x, qw, sz, group_size, next_qw=None, next_sz=None):
        seen.append((qw.data_ptr(), None if next_qw is None else next_qw.data_ptr()))
        return x.to(torch.bfloat16) @ cuda_int4.dequantize_mma(qw, sz, group_size).t()

    monkeypatch.setattr(cuda_int4, "library", lambda group_size, device=None: None)
    monkeypatch.setattr(cuda_int4, "int4_gemv_cuda_impl", fake_gemv)  # what the custom op calls (compiled)
    monkeypatch.setitem(EAGER, "int4_gemv_cuda", fake_gemv)  # what an eager forward calls
    for m in (qkv0, o0, qkv1, o1):
        m.kernel = "cuda"
        m._pack_mma(torch.device("cpu"))
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = model(x)
        ptr = [m.qweight_mma.data_ptr() for m in (qkv0, o0, qkv1, o1)]
        assert seen == [(ptr[0], ptr[1]), (ptr[1], ptr[2]), (ptr[2], ptr[3]), (ptr[3], None)]
        seen.clear()  # dynamo traces the links (plain attributes holding modules) without a graph break
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert seen[-4:] == [(ptr[0], ptr[1]), (ptr[1], ptr[2]), (ptr[2], ptr[3]), (ptr[3], None)]


def test_python_config_list_is_what_the_library_builds():
    # a config the .cu file does not instantiate fails only at launch, on a GPU: keep the lists equal
    import re

    source = cuda_int4._SOURCE.read_text()
    macro = source[source.index("#define AUTOAO_CONFIGS(X)"):source.index("extern \"C\"")]
    built = {tuple(int(v) for v in m) for m in re.findall(r"X\((\d+), (\d+), (\d+), (\d+)\)", macro)}
    listed = {(c.rows, c.warps, c.chunks, c.min_blocks) for c in cuda_int4.CONFIGS}
    assert built == listed and cuda_int4._DEFAULT in cuda_int4.CONFIGS


@pytest.mark.parametrize("capturing", [False, True])
def test_weights_are_read_before_the_pdl_wait_only_inside_graph_capture(monkeypatch, capturing):
    # Eagerly the kernel before a GEMV may be the one that packed or copied its weights, so the
    # early loads (before griddepcontrol.wait) are asked for only while a CUDA graph is captured.
    calls = []

    class FakeLib:
        sm90 = True

        def autoao_int4_mma_gemv(self, *args):
            calls.append(args)
            return 0

    # the launch reads the capture state and the stream through torch._C (the host's share of an
    # eager decode step); CPU builds have stand-ins there
    monkeypatch.setattr(cuda_int4, "library", lambda group_size, device=None: FakeLib())
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    qw, sz = cuda_int4.pack_mma(torch.zeros(32, 128, dtype=torch.int32), torch.ones(32, 1, dtype=torch.bfloat16),
                                torch.zeros(32, 1, dtype=torch.bfloat16), 128)
    for pdl in (True, False):
        with cuda_int4.launch_options(pdl=pdl, early=True):
            cuda_int4._launch(x, qw, sz, 128, cuda_int4.Config(1, 4, 2))
    (*_, pdl_on, early_on, _), (*_, pdl_off, early_off, _) = calls
    assert (pdl_on, early_on) == (1, int(capturing)) and (pdl_off, early_off) == (0, 0)


def test_launch_options_come_from_the_environment_in_one_place():
    LaunchOptions = cuda_int4.LaunchOptions
    assert LaunchOptions.from_env({}) == LaunchOptions() == LaunchOptions(pdl=True, prefetch_mb=8.0, early=True)
    opts = LaunchOptions.from_env({"AUTOAO_CUDA_PDL": "0", "AUTOAO_CUDA_PREFETCH_MB": "24", "AUTOAO_CUDA_EARLY": "0"})
    assert opts == LaunchOptions(pdl=False, prefetch_mb=24.0, early=False) and opts.prefetch_bytes == 24 * 2 ** 20
    assert opts.tag() == "pdl=0,prefetch_mb=24,early=0" and LaunchOptions().tag() == "pdl=1,prefetch_mb=8,early=1"
    for env, match in [({"AUTOAO_CUDA_PDL": "off"}, "AUTOAO_CUDA_PDL must be 0 .* got 'off'"),
                       ({"AUTOAO_CUDA_EARLY": "2"}, "AUTOAO_CUDA_EARLY must be 0"),
                       ({"AUTOAO_CUDA_PREFETCH_MB": "-1"}, "AUTOAO_CUDA_PREFETCH_MB must be a number"),
                       ({"AUTOAO_CUDA_PREFETCH_MB": "lots"}, "AUTOAO_CUDA_PREFETCH_MB must be a number")]:
        with pytest.raises(ValueError, match=match):
            LaunchOptions.from_env(env)
    before = cuda_int4.OPTIONS
    with cuda_int4.launch_options(pdl=False) as opts:
        assert cuda_int4.OPTIONS is opts and opts == dataclasses.replace(before, pdl=False)
    assert cuda_int4.OPTIONS is before


def test_kernel_rejects_a_shape_it_cannot_run():
    lin = torch.nn.Linear(96, 32).to(torch.bfloat16)  # int4 g32 runs K=96; the CUDA kernel needs 64-k chunks
    mod = search_space.get("int4_wo", group_size=32).build(lin)
    mod.kernel = "cuda"
    with pytest.raises(ValueError, match="kernel 'cuda': in_features 96"):
        mod._pack_mma(torch.device("cpu"))


def _cuda_kernel_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        cuda_int4.library(128)
    except RuntimeError:
        return False
    return True


@pytest.mark.skipif(not _cuda_kernel_ready(), reason="needs a CUDA GPU (sm_80+) and nvcc")
@pytest.mark.parametrize("group", [32, 64, 128])
def test_cuda_kernel_matches_the_dequantized_reference(group):
    torch.manual_seed(0)
    for n, k in [(48, 256), (4096, 1024), (272, 2048)]:
        w = torch.randn(n, k, device="cuda") * k ** -0.5
        q, s, z = quantize_int4_groupwise(w, group)
        qw, sz = cuda_int4.pack_mma(q, s, z, group)
        wd = dequantize_int4_groupwise(q, s, z).double()
        for m in (1, 3, 8):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.double() @ wd.t()
            for cfg in cuda_int4.CONFIGS:
                nan = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")  # every output written
                y = cuda_int4._launch(x, qw, sz, group, cfg, out=nan)
                err = ((y.double() - ref).norm() / ref.norm()).item()
                assert err < 5e-3, (n, k, m, cfg, err)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                yg = cuda_int4.int4_gemv_cuda(x, qw, sz, group)
            graph.replay()
            torch.cuda.synchronize()
            assert ((yg.double() - ref).norm() / ref.norm()).item() < 5e-3


@pytest.mark.skipif(not _cuda_kernel_ready(), reason="needs a CUDA GPU (sm_80+) and nvcc")
@pytest.mark.parametrize("group", [32, 64, 128])
def test_dequantizing_kernel_is_bit_identical_to_the_torch_reference(group):
    torch.manual_seed(0)
    for n, k in [(48, 256), (16, 192), (272, 2048), (4096, 14336)]:
        if cuda_int4.unsupported(n, k, group):
            continue
        w = torch.randn(n, k, device="cuda") * k ** -0.5
        qw, sz = cuda_int4.pack_mma(*quantize_int4_groupwise(w, group), group)
        assert torch.equal(cuda_int4.int4_dequant_cuda(qw, sz, group), cuda_int4.dequantize_mma(qw, sz, group))


@pytest.mark.skipif(not _cuda_kernel_ready(), reason="needs a CUDA GPU (sm_80+) and nvcc")
def test_chained_launches_read_the_previous_kernels_output():
    # With programmatic dependent launch (sm_90+) each GEMV starts while the previous kernel runs and
    # must wait for it before reading x: a chain of GEMVs, each fed by the last one directly or through
    # a torch op and prefetching the next one's weights, replayed in a CUDA graph with new inputs,
    # equals the same chain run with a sync after every step and no prefetch (the kernel is
    # deterministic, split-K included).
    torch.manual_seed(0)
    n = 1024
    layers = []
    for _ in range(4):
        q, s, z = quantize_int4_groupwise(torch.randn(n, n, device="cuda") * n ** -0.5, 128)
        layers.append(cuda_int4.pack_mma(q, s, z, 128))

    def chain(h):
        for i, (qw, sz) in enumerate(layers):
            h = cuda_int4.int4_gemv_cuda(h, qw, sz, 128, *layers[(i + 1) % len(layers)])
            if i % 2:
                h = h * 2.0
        return h

    def stepwise(h):
        for i, (qw, sz) in enumerate(layers):
            h = cuda_int4.int4_gemv_cuda(h, qw, sz, 128)
            torch.cuda.synchronize()
            if i % 2:
                h = h * 2.0
                torch.cuda.synchronize()
        return h

    x = torch.randn(1, n, device="cuda").to(torch.bfloat16)
    chain(x)  # tune before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = chain(x)
    for _ in range(3):
        new = torch.randn(1, n, device="cuda").to(torch.bfloat16)
        x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, stepwise(new))


def test_tuner_times_every_config_without_idle_warps_once_and_keeps_the_fastest(monkeypatch):
    from autoao import clock

    timed = []

    def fake_launch(x, qw, sz, group_size, cfg, **kwargs):
        timed.append(cfg)

    def made_up_us(cfg):  # any order will do; ties broken by the list's order
        return (cfg.rows * 7 + cfg.warps * 3 + cfg.chunks + cfg.split * 5 + cfg.min_blocks) % 11

    monkeypatch.setattr(cuda_int4, "_launch", fake_launch)
    monkeypatch.setattr(cuda_int4, "_TUNED", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(clock, "tuning_us", lambda fn: (fn(), made_up_us(timed[-1]))[1])
    k, group = 512, 128  # 4 units of K: a config with split x warps > 4 would leave warps idle
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    qw, sz = torch.zeros(2, k // 64, 32, 4, dtype=torch.int32), torch.zeros(2, k // 128, 8, 1, 2, dtype=torch.int32)
    usable = [c for c in cuda_int4.CONFIGS if c.split * c.warps <= 4]
    assert usable and len(usable) < len(cuda_int4.CONFIGS)
    best = cuda_int4._tune(x, qw, sz, group)
    assert timed == usable and best == min(usable, key=made_up_us)
    timed.clear()
    assert cuda_int4._tune(x, qw, sz, group) == best and timed == []  # once per (shape, M, group)


def test_packing_reserves_the_split_k_scratch_before_any_call(monkeypatch):
    # Allocated at the first call, the scratch would land in the CUDA-graph pool of a
    # torch.compile(mode="reduce-overhead") warm-up, which then refuses to record.
    reserved = []
    monkeypatch.setattr(cuda_int4, "_scratch", lambda device, n, split: reserved.append((device, n, split)))
    cuda_int4.reserve_scratch(torch.device("cuda", 0), 4096, 2048, 128)
    splits = {c.split for c in cuda_int4.tuner_configs(2048, 128) if c.split > 1}
    assert splits and sorted(reserved) == [(torch.device("cuda", 0), 4096, s) for s in sorted(splits)]
    reserved.clear()
    cuda_int4.reserve_scratch(torch.device("cpu"), 4096, 2048, 128)
    assert reserved == []

    wired = []
    monkeypatch.setattr(cuda_int4, "library", lambda group_size, device=None: None)
    monkeypatch.setattr(cuda_int4, "reserve_scratch", lambda device, n, k, group: wired.append((n, k, group)))
    mod = search_space.get("int4_wo", group_size=64).build(torch.nn.Linear(256, 48).to(torch.bfloat16))
    mod.kernel = "cuda"
    mod._pack_mma(torch.device("cpu"))
    assert wired == [(48, 256, 64)]


@pytest.mark.skipif(not _cuda_kernel_ready(), reason="needs a CUDA GPU (sm_80+) and nvcc")
def test_a_fresh_layer_runs_under_reduce_overhead_compile():
    # no eager call first: the first GEMV runs inside the CUDA-graph pool's warm-up
    torch.manual_seed(0)
    lin = torch.nn.Linear(2048, 4096, bias=False, device="cuda").to(torch.bfloat16)
    mod = search_space.get("int4_wo", group_size=128).build(lin)
    mod.set_kernel("cuda")
    step = torch.compile(mod, mode="reduce-overhead")
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        y = step(x).clone()
    torch.cuda.synchronize()
    ref = mod.reference(x)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
