"""Profiler: every linear layer found with exact shapes, token counts and activation statistics;
tied weights reported once; GPT-2 Conv1D profiled as a linear; bad models and inputs give clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoao.profile import profile
from autoao.search_space import LayerSpec

DIM, HIDDEN, VOCAB = 16, 32, 50
# Three forwards of different lengths: 1*5 + 1*9 + 2*3 = 20 tokens through every projection.
INPUTS_SHAPES = [(1, 5), (1, 9), (2, 3)]
TOKENS = 20


class Block(nn.Module):
    """Attention (q/k/v/o) and a gated MLP (gate/up/down), like a Llama block."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q_proj, self.k_proj = nn.Linear(DIM, DIM, bias=False), nn.Linear(DIM, DIM, bias=False)
        self.v_proj, self.o_proj = nn.Linear(DIM, DIM, bias=False), nn.Linear(DIM, DIM)
        self.gate_proj, self.up_proj = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, DIM]
        h = self.norm1(x)
        att = F.scaled_dot_product_attention(self.q_proj(h), self.k_proj(h), self.v_proj(h), is_causal=True)
        x = x + self.o_proj(att)
        h = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLM(nn.Module):
    """Embedding, two blocks, lm_head tied to the embedding; block 1's k_proj shares q_proj's weight."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight
        self.blocks[1].k_proj.weight = self.blocks[1].q_proj.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [B, T] -> logits [B, T, VOCAB]
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


def token_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, shape, generator=g) for shape in INPUTS_SHAPES]


def capture_inputs(model: nn.Module, fqn: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    """Every input row [M, K] that reaches `fqn`, by a hook of the test's own."""
    seen = []
    handle = model.get_submodule(fqn).register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        for x in inputs:
            model(x)
    handle.remove()
    return torch.cat([x.reshape(-1, x.shape[-1]) for x in seen])


def test_finds_every_linear_with_exact_shapes_and_token_counts():
    """One profile per Linear weight, in module order, with (K, N), bias, dtype, device, the exact
    shape -> call count map and tokens summed over inputs of different lengths."""
    model = TinyLM()
    prof = profile(model, token_inputs())
    layers = prof.by_fqn()
    expected = {f"blocks.{b}.{name}" for b in (0, 1) for name in
                ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
    expected = (expected - {"blocks.1.k_proj"}) | {"lm_head"}  # k_proj shares block 1's q_proj weight
    assert set(layers) == expected
    assert [p.fqn for p in prof.layers] == [n for n, m in model.named_modules() if n in expected]
    assert prof.num_forward == 3 and prof.seconds > 0

    for fqn, p in layers.items():
        linear = model.get_submodule(fqn)
        assert (p.in_features, p.out_features) == (linear.in_features, linear.out_features)
        assert p.bias == (linear.bias is not None)
        assert p.dtype == torch.float32 and p.device == torch.device("cpu")
        assert p.shapes == {(b, t, p.in_features): 1 for b, t in INPUTS_SHAPES}
        assert p.tokens == TOKENS
        assert p.stats.act_norm.shape == p.stats.act_absmax.shape == (p.in_features,)
        assert p.spec == LayerSpec(fqn, p.in_features, p.out_features, p.bias, torch.float32)
    assert layers["blocks.0.down_proj"].shapes[(1, 9, HIDDEN)] == 1
    assert layers["lm_head"].out_features == VOCAB


def test_tuple_dict_and_single_tensor_inputs_follow_the_convention():
    """A tensor -> model(t), a tuple -> model(*args), a dict -> model(**kwargs): same statistics."""
    model, ids = TinyLM(), token_inputs()[1]
    results = [profile(model, ex).by_fqn()["blocks.0.up_proj"] for ex in (ids, (ids,), {"ids": ids})]
    for p in results:
        assert p.tokens == 9 and p.shapes == {(1, 9, DIM): 1}
        torch.testing.assert_close(p.stats.act_norm, results[0].stats.act_norm, rtol=0, atol=0)


def test_act_norm_and_absmax_match_hand_computed():
    """act_norm is the per-input-channel L2 norm over every row seen; act_absmax the max |x|."""
    model, inputs = TinyLM(), token_inputs()
    rows = capture_inputs(model, "blocks.1.down_proj", inputs)  # [20, HIDDEN]
    prof = profile(model, inputs)
    p = prof.by_fqn()["blocks.1.down_proj"]
    assert p.stats.act_norm.dtype == torch.float32 and p.stats.act_norm.device == torch.device("cpu")
    torch.testing.assert_close(p.stats.act_norm, rows.square().sum(0).sqrt())
    torch.testing.assert_close(p.stats.act_absmax, rows.abs().amax(0), rtol=0, atol=0)
    assert prof.calibration["blocks.1.down_proj"] is p.stats  # what autoao.apply takes for Wanda
    assert set(prof.calibration.layers) == set(prof.by_fqn())


def test_sample_is_bounded_real_rows_and_deterministic():
    """At most max_sample_rows rows, each a real input row, spread over calls; same on every run."""
    model, inputs = TinyLM(), token_inputs()
    rows = capture_inputs(model, "blocks.1.up_proj", inputs)  # [20, DIM], call 0 = rows 0..4, etc.
    p = profile(model, inputs, max_sample_rows=8).by_fqn()["blocks.1.up_proj"]
    assert p.stats.sample.shape == (8, DIM) and p.stats.sample.dtype == torch.float32
    where = [int(((rows == r).all(1)).nonzero()[0]) for r in p.stats.sample]  # raises if a row is not real
    assert len(set(where)) == 8
    calls = {0 if i < 5 else 1 if i < 14 else 2 for i in where}
    assert len(calls) > 1
    again = profile(model, inputs, max_sample_rows=8).by_fqn()["blocks.1.up_proj"]
    assert torch.equal(p.stats.sample, again.stats.sample)

    everything = profile(model, inputs, max_sample_rows=64).by_fqn()["blocks.1.up_proj"]
    assert everything.stats.sample.shape == (TOKENS, DIM)  # fewer rows than the cap: all of them, in order
    assert torch.equal(everything.stats.sample, rows)
    assert profile(model, inputs, max_sample_rows=0).layers[0].stats.sample.shape == (0, DIM)


def test_one_position_steps_count_as_tokens_but_calibrate_only_alone():
    """Decode steps run without their KV cache ([B, 1] ids: first-position rows) count in the token
    counts timing reads, but the statistics come from the inputs with context when there are any."""
    model = TinyLM()
    g = torch.Generator().manual_seed(2)
    prefill = torch.randint(0, VOCAB, (1, 12), generator=g)
    steps = [torch.randint(0, VOCAB, (1, 1), generator=g) for _ in range(4)]
    mixed = profile(model, [prefill, *steps]).by_fqn()["blocks.1.down_proj"]
    assert mixed.tokens == 12 + 4 and mixed.shapes[(1, 1, HIDDEN)] == 4
    ctx_rows = capture_inputs(model, "blocks.1.down_proj", [prefill])  # [12, HIDDEN]
    assert torch.equal(mixed.stats.sample, ctx_rows)
    torch.testing.assert_close(mixed.stats.act_norm, ctx_rows.square().sum(0).sqrt())
    torch.testing.assert_close(mixed.stats.act_mean, ctx_rows.abs().mean(0))
    # only one-position inputs: those are the statistics there are
    alone = profile(model, steps).by_fqn()["blocks.1.down_proj"]
    lone_rows = capture_inputs(model, "blocks.1.down_proj", steps)  # [4, HIDDEN]
    assert alone.tokens == 4 and torch.equal(alone.stats.sample, lone_rows)
    # a 2-D input has no positions: every row counts, one row a call or more
    lin = nn.Linear(DIM, DIM)
    flat = profile(lin, [torch.randn(1, DIM), torch.randn(3, DIM)]).layers[0]
    assert flat.stats.sample.shape == (4, DIM)


def test_tied_weights_reported_once_with_their_other_names():
    """Two Linears sharing a weight: the first reported, the other in its `tied`. A Linear tied to an
    Embedding (lm_head) is reported, with the embedding named in `tied`."""
    layers = profile(TinyLM(), token_inputs()).by_fqn()
    assert "blocks.1.k_proj" not in layers
    assert layers["blocks.1.q_proj"].tied == ["blocks.1.k_proj"]
    assert layers["lm_head"].tied == ["embed"]
    assert layers["blocks.0.q_proj"].tied == []


def test_layer_never_called_has_zero_tokens():
    """A Linear the forward does not reach is still reported, with no tokens and an empty sample."""
    model = TinyLM()
    model.unused = nn.Linear(DIM, 8)
    p = profile(model, token_inputs()).by_fqn()["unused"]
    assert p.tokens == 0 and p.shapes == {}
    assert p.stats.sample.shape == (0, DIM) and not p.stats.act_norm.any()


class Conv1D(nn.Module):
    """Stand-in for transformers' GPT-2 Conv1D: weight stored [in, out], out size in `nf`."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


def test_conv1d_is_profiled_as_a_linear_with_its_weight_transposed():
    """GPT-2 Conv1D (weight stored [K, N]) is a linear layer: profiled with K and N read the right way."""
    model = nn.Sequential(Conv1D(3 * DIM, DIM), nn.Linear(3 * DIM, DIM))
    prof = profile(model, torch.randn(2, 4, DIM))
    conv, lin = prof.layers
    assert (conv.fqn, conv.in_features, conv.out_features, conv.bias) == ("0", DIM, 3 * DIM, True)
    assert (lin.in_features, lin.out_features) == (3 * DIM, DIM) and conv.tokens == 8
    assert conv.stats.act_norm.shape == (DIM,)


class NoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids).relu()


def test_model_without_linear_layers_is_an_error_naming_the_class():
    """Nothing to quantize is an error, not an empty profile."""
    with pytest.raises(ValueError, match="NoLinears has no nn.Linear layers.*only quantizes linear"):
        profile(NoLinears(), token_inputs())


def test_empty_example_inputs_is_an_error():
    """An empty list runs nothing: an error, not an empty profile."""
    with pytest.raises(ValueError, match="example_inputs is an empty list"):
        profile(TinyLM(), [])
    with pytest.raises(ValueError, match="max_sample_rows must be >= 0"):
        profile(TinyLM(), token_inputs(), max_sample_rows=-1)


def test_failing_example_input_names_its_index_and_restores_the_model():
    """The error names the input's index, what it was and the original error (chained); hooks are
    removed and training flags restored even so."""
    mlp = nn.Sequential(nn.Linear(DIM, 8), nn.ReLU())
    with pytest.raises(ValueError, match=r"example input #1 \(a tensor \[2, 17\] float32 on cpu\) "
                                         r"failed to run: RuntimeError: mat1 and mat2 shapes"):
        profile(mlp, [torch.randn(2, DIM), torch.randn(2, DIM + 1)])  # wrong hidden size

    model = TinyLM().train()
    bad = (torch.randn(1, 4), torch.zeros(2))  # two arguments for a forward(ids)
    with pytest.raises(ValueError, match=r"example input #2 \(a tuple of 2 values: tensor \[1, 4\] float32 "
                                         r"on cpu, tensor \[2\] float32 on cpu\) failed to run: TypeError") as info:
        profile(model, [*token_inputs()[:2], bad])
    assert isinstance(info.value.__cause__, TypeError)
    assert all(m.training for m in model.modules())
    assert_no_hooks(model)


def assert_no_hooks(model: nn.Module) -> None:
    for name, m in model.named_modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, name
        assert not m._forward_hooks_with_kwargs and not m._forward_pre_hooks_with_kwargs, name


def test_training_flags_restored_and_hooks_removed():
    """Profiling runs in eval mode but leaves every module's training flag and hooks as they were."""
    model = TinyLM().train()
    model.blocks[0].eval()  # mixed flags must come back mixed, not all True
    flags = {n: m.training for n, m in model.named_modules()}
    seen_training = []
    handle = model.blocks[1].register_forward_pre_hook(lambda m, args: seen_training.append(m.training))
    profile(model, token_inputs())
    handle.remove()
    assert seen_training == [False, False, False]
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert_no_hooks(model)


def _on_grid(w: torch.Tensor, group: int = 32) -> torch.Tensor:
    """w [N, K] rounded to an affine 4-bit grid per `group` columns (as GGUF Q4_1 stores it), in bf16."""
    g = w.float().reshape(w.shape[0], -1, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    step = (hi - lo) / 15
    return (((g - lo) / step).round() * step + lo).reshape(w.shape).to(torch.bfloat16)


def test_weights_on_a_4_bit_group_grid_are_recognised():
    from autoao.profile import int4_grid_layers, on_int4_grid

    torch.manual_seed(0)
    w = torch.randn(64, 128)
    assert not on_int4_grid(w.to(torch.bfloat16))  # ordinary weights
    assert on_int4_grid(_on_grid(w))  # dequantized Q4_1-style, bf16 rounding included
    assert not on_int4_grid(_on_grid(w, group=64))  # a 64-column grid is not one of 32
    assert not on_int4_grid(torch.randn(8, 48))  # K not a multiple of 32
    model = nn.Sequential(nn.Linear(128, 64, bias=False), nn.Linear(64, 32, bias=False)).to(torch.bfloat16)
    with torch.no_grad():
        model[0].weight.copy_(_on_grid(model[0].weight))
    prof = profile(model, [torch.randn(2, 128, dtype=torch.bfloat16)])
    assert int4_grid_layers(model, prof) == ["0"]
    conv = nn.Sequential(Conv1D(64, 128)).to(torch.bfloat16)  # weight [K=128, N=64]
    with torch.no_grad():
        conv[0].weight.copy_(_on_grid(conv[0].weight.t().float()).t())  # the grid runs along K
    assert int4_grid_layers(conv, profile(conv, [torch.randn(2, 128, dtype=torch.bfloat16)])) == ["0"]
