"""Held-out inputs for the label-free judges: from the caller's eval_inputs when they hold enough,
else the tokenizer's bundled held-out text, the model's own samples or inputs like the examples;
of the requested size, deterministic per seed, disjoint from the examples and from earlier parts."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from tiny_models import TinyLM

import autoao.models
from autoao.evaluators.heldout import (EVAL, LIKE, MIN_LM_POSITIONS, MIN_ROWS, SAMPLES, TEXT, bundled_text,
                                       bundled_tokens, held_out_inputs, is_causal_lm, like_examples, model_samples,
                                       more)

VOCAB = 256


class ByteTokenizer:
    """text -> {"input_ids": [1, n]} byte ids (a vocabulary of 256)."""

    def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([list(text.encode())], dtype=torch.long)}


class ShortTokenizer(ByteTokenizer):
    """A tokenizer whose text holds only its first 300 bytes."""

    def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": super().__call__(text)["input_ids"][:, :300]}


class Prefers(nn.Module):
    """A causal LM of fixed next-token probabilities `probs` [V], whatever the context."""

    def __init__(self, probs: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("logp", probs.log())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.logp.expand(*ids.shape, -1).clone()  # [B, T, V]


def _lm() -> nn.Module:
    torch.manual_seed(0)
    return TinyLM(vocab=VOCAB).to(torch.bfloat16).eval()


def _llama() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


DECODE_STEPS = [torch.tensor([[3]]), torch.tensor([[17]]), torch.tensor([[42]])]  # one token each


def _positions(inputs: list) -> int:
    return sum((x["input_ids"] if isinstance(x, dict) else x).numel() for x in inputs)


##### choosing the source #######################################################################

def test_a_causal_lm_with_a_tokenizer_gets_the_bundled_held_out_text():
    held = held_out_inputs(_lm(), DECODE_STEPS, tokenizer=ByteTokenizer())
    assert held.source == TEXT and held.unit == "token positions"
    assert held.positions == _positions(held.inputs) >= MIN_LM_POSITIONS
    text = bundled_tokens(ByteTokenizer(), held_out=True)
    assert torch.equal(torch.cat([t[0] for t in held.inputs]), text[:held.positions])  # its held-out half
    calibration = bundled_tokens(ByteTokenizer(), held_out=False)
    assert not torch.equal(text[:held.positions], calibration[:held.positions])
    assert held.describe().startswith(f"{held.positions} token positions of tokenizer text")


def test_a_causal_lm_without_a_tokenizer_gets_its_own_samples():
    held = held_out_inputs(_lm(), DECODE_STEPS)
    assert held.source == SAMPLES and held.positions == _positions(held.inputs) >= MIN_LM_POSITIONS
    assert all(t.dtype == torch.int64 and t.dim() == 2 for t in held.inputs)
    starts = torch.cat([t[:, 0] for t in held.inputs])
    assert len(set(starts.tolist())) == len(starts) == 4  # varied, distinct starts: 4 x 64 positions


def test_no_sample_starts_where_an_example_does():
    """So no held-out position has the context of an example's: with the examples starting at
    tokens 0..250, the 4 samples start among the 5 tokens left."""
    examples = [torch.arange(251)[:, None], torch.tensor([[7, 8, 9]])]
    held = held_out_inputs(_lm(), examples)
    starts = set(torch.cat([t[:, 0] for t in held.inputs]).tolist())
    assert len(starts) == 4 and starts <= {251, 252, 253, 254, 255}


def test_eval_inputs_are_used_when_they_hold_enough_and_only_then():
    g = torch.Generator().manual_seed(1)
    enough = [torch.randint(0, VOCAB, (2, 128), generator=g)]
    held = held_out_inputs(_lm(), DECODE_STEPS, eval_inputs=enough)
    assert held.source == EVAL and held.inputs[0] is enough[0] and held.positions == 256
    few = [torch.randint(0, VOCAB, (1, 16), generator=g)]
    assert held_out_inputs(_lm(), DECODE_STEPS, eval_inputs=few).source == SAMPLES
    assert held_out_inputs(_lm(), DECODE_STEPS, eval_inputs=few, positions=16).source == EVAL


def test_a_module_that_is_not_a_causal_lm_gets_inputs_like_the_examples():
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    examples = [torch.randn(2, 16)]
    assert not is_causal_lm(mlp, examples) and is_causal_lm(_lm(), DECODE_STEPS)
    held = held_out_inputs(mlp, examples)
    assert held.source == LIKE and held.unit == "rows" and held.positions == MIN_ROWS
    assert sum(x.shape[0] for x in held.inputs) == MIN_ROWS
    mlp(held.inputs[0])  # they run


def test_a_transformers_lm_gets_samples_in_the_examples_form():
    examples = [{"input_ids": torch.tensor([[5]]), "attention_mask": torch.tensor([[1]])}]
    model = _llama()
    held = held_out_inputs(model, examples, positions=128)
    assert held.source == SAMPLES and set(held.inputs[0]) == {"input_ids", "attention_mask"}
    assert held.positions == _positions(held.inputs) >= 128
    assert all(int(x["input_ids"][r, 0]) != 5 for x in held.inputs for r in range(len(x["input_ids"])))
    model(**held.inputs[0])  # they run


##### determinism and disjoint parts ############################################################

@pytest.mark.parametrize("tokenizer", [None, ByteTokenizer()], ids=["samples", "text"])
def test_held_out_inputs_are_deterministic_per_seed(tokenizer):
    model = _lm()
    a = held_out_inputs(model, DECODE_STEPS, tokenizer=tokenizer, seed=3)
    b = held_out_inputs(model, DECODE_STEPS, tokenizer=tokenizer, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    if tokenizer is None:  # the text is the text; samples follow the seed
        c = held_out_inputs(model, DECODE_STEPS, seed=4)
        assert not torch.equal(a.inputs[0], c.inputs[0])


def test_more_samples_start_elsewhere():
    model = _lm()
    first = held_out_inputs(model, DECODE_STEPS)
    second = more(model, DECODE_STEPS, first)
    assert second.source == SAMPLES and second.part == 1 and second.positions == first.positions
    s1 = {int(s) for t in first.inputs for s in t[:, 0]}
    s2 = {int(s) for t in second.inputs for s in t[:, 0]}
    assert not s1 & s2 and not s2 & {3, 17, 42}


def test_more_text_is_the_next_text_then_the_models_own_samples():
    model, tok = _lm(), ByteTokenizer()
    held = held_out_inputs(model, DECODE_STEPS, tokenizer=tok)
    text = bundled_tokens(tok, held_out=True)
    seen = held.positions
    for _ in range(3):
        held = more(model, DECODE_STEPS, held, tokenizer=tok)
        assert held.source == TEXT and torch.equal(torch.cat([t[0] for t in held.inputs]),
                                                   text[seen:seen + held.positions])
        seen += held.positions
    short = ShortTokenizer()  # 300 tokens: one part of 256 positions, then the text is spent
    spent = held_out_inputs(model, DECODE_STEPS, tokenizer=short)
    assert spent.source == TEXT and spent.positions == 256
    after = more(model, DECODE_STEPS, spent, tokenizer=short)
    assert after.source == SAMPLES and after.part == 0 and after.positions >= 256
    with pytest.raises(ValueError, match="needs that tokenizer"):
        more(model, DECODE_STEPS, spent)


def test_more_after_eval_inputs_builds_held_out_inputs():
    evals = [torch.randint(0, VOCAB, (4, 64), generator=torch.Generator().manual_seed(2))]
    held = held_out_inputs(_lm(), DECODE_STEPS, eval_inputs=evals)
    assert held.source == EVAL
    assert more(_lm(), DECODE_STEPS, held, tokenizer=ByteTokenizer()).source == TEXT


##### the model's own samples ###################################################################

def test_samples_follow_the_model():
    """A model that prefers token 7 says mostly 7; one of probabilities (0.5, 0.3, 0.2) says each
    about that often (temperature 1: not the argmax, not flattened)."""
    probs = torch.full((32,), 1e-6)
    probs[7] = 1.0
    sevens = torch.cat([t[:, 1:] for t in model_samples(Prefers(probs / probs.sum()), n_seqs=8, seq_len=32, seed=0)])
    assert (sevens == 7).float().mean() > 0.99
    probs = torch.tensor([0.5, 0.3, 0.2])
    seqs = torch.cat([t[:, 1:] for t in model_samples(Prefers(probs), n_seqs=3, seq_len=1001, seed=0)])  # 3000 draws
    freq = torch.bincount(seqs.flatten(), minlength=3).float() / seqs.numel()
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_samples_are_of_the_requested_size_deterministic_and_batched():
    model = _lm()
    seqs = model_samples(model, n_seqs=10, seq_len=12, seed=1)
    assert [tuple(t.shape) for t in seqs] == [(8, 12), (2, 12)] and all(t.dtype == torch.int64 for t in seqs)
    again = model_samples(model, n_seqs=10, seq_len=12, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(seqs, again))
    starts = torch.cat([t[:, 0] for t in seqs])
    assert len(set(starts.tolist())) == 10


def test_kv_cache_samples_equal_recomputed_samples():
    """A transformers model samples through its KV cache; the same model as a plain module
    (prefix recomputed) draws the same tokens for the same seed."""
    model = _llama()

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(ids).logits

    cached = model_samples(model, n_seqs=4, seq_len=24, seed=0)
    plain = model_samples(Plain(), n_seqs=4, seq_len=24, seed=0, vocab_size=VOCAB)
    assert torch.equal(cached[0], plain[0])


def test_samples_leave_the_global_rng_and_training_flag_alone():
    model = _lm().train()
    state = torch.get_rng_state()
    model_samples(model, n_seqs=2, seq_len=4, seed=0)
    assert torch.equal(torch.get_rng_state(), state) and model.training


def test_a_model_with_non_finite_logits_cannot_be_sampled():
    with pytest.raises(ValueError, match="not finite at sampling step 0"):
        model_samples(Prefers(torch.tensor([0.5, -1.0])), n_seqs=1, seq_len=3, seed=0)


##### inputs like the examples ##################################################################

def test_like_examples_draws_each_feature_from_the_examples_statistics():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g) * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor([0.0, 10.0, -5.0])
    drawn = torch.cat(like_examples([x[:32], x[32:]], rows=4096, seed=0))  # [4096, 3]
    assert drawn.shape == (4096, 3) and drawn.dtype == x.dtype
    assert torch.allclose(drawn.mean(0), x.mean(0), atol=0.15)
    assert torch.allclose(drawn.std(0), x.std(0), rtol=0.1)
    assert not (drawn[:, None, :] == x[None]).all(-1).any()  # no row of an example


def test_like_examples_keeps_the_structure():
    ids = torch.tensor([[101, 7, 9, 102], [101, 2000, 5, 102]])
    example = ({"input_ids": ids, "attention_mask": torch.ones(2, 4, dtype=torch.long),
                "keep": torch.tensor([[True, False, True, True], [False, False, True, True]]),
                "scale": torch.tensor(0.5), "bias": torch.randn(5), "name": "x"},)
    out = like_examples([example], rows=40, seed=0)
    assert [o[0]["input_ids"].shape[0] for o in out] == [32, 8]  # exactly `rows`, LIKE_BATCH at a time
    kw = out[0][0]
    assert isinstance(out[0], tuple) and set(kw) == set(example[0])
    assert kw["input_ids"].dtype == torch.int64  # uniform over the examples' [5, 2000]
    assert 5 <= int(kw["input_ids"].min()) < 200 and 1800 < int(kw["input_ids"].max()) <= 2000
    assert bool((kw["attention_mask"] == 1).all())  # [1, 1]: stays ones
    assert torch.equal(kw["keep"], example[0]["keep"].repeat(16, 1))  # booleans copied, rows repeated
    assert kw["scale"] is example[0]["scale"] and kw["name"] == "x"  # 0-dim and non-tensors copied
    assert kw["bias"].shape == (5,) and not torch.equal(kw["bias"], example[0]["bias"])  # not a batch dim: drawn
    again = like_examples([example], rows=40, seed=0)
    assert torch.equal(again[1][0]["input_ids"], out[1][0]["input_ids"])
    other = like_examples([example], rows=40, seed=0, part=1)
    assert not torch.equal(other[0][0]["input_ids"], kw["input_ids"])


def test_like_examples_names_what_it_cannot_use():
    with pytest.raises(ValueError, match="holds no tensor with a batch dim"):
        like_examples([("text", 3)], rows=4, seed=0)
    with pytest.raises(ValueError, match="at least one example"):
        like_examples([], rows=4, seed=0)


##### the bundled text ##########################################################################

def test_text_inputs_is_the_bundled_text():
    tok = ByteTokenizer()
    for held_out in (False, True):
        a = autoao.models.text_inputs(tok, seq_len=64, n_seqs=3, held_out=held_out)
        b = bundled_text(tok, seq_len=64, n_seqs=3, held_out=held_out)
        assert all(torch.equal(x, y) and x.shape == (1, 64) for x, y in zip(a, b))
    assert torch.equal(bundled_text(tok, seq_len=64, n_seqs=1, held_out=True, first=2)[0], b[2])


def test_too_little_text_says_how_much_there_is():
    n = bundled_tokens(ByteTokenizer(), held_out=True).numel()
    with pytest.raises(ValueError, match=f"held-out text has {n} tokens"):
        bundled_text(ByteTokenizer(), seq_len=256, n_seqs=n // 256 + 1, held_out=True)


def test_a_tokenizer_beyond_the_models_vocabulary_is_refused():
    torch.manual_seed(0)
    small = TinyLM(vocab=64).eval()  # bytes reach 126 in the prose
    with pytest.raises(ValueError, match="beyond the model's vocabulary of 64"):
        held_out_inputs(small, [torch.tensor([[3]])], tokenizer=ByteTokenizer())
