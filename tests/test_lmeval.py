"""lm-eval adapter: our CausalLM scores exactly like lm-eval's HFLM, the bundled tasks run offline,
and bad input (unknown task, missing tokenizer) fails with a message that says what to do.

Models here are tiny and random (a 2-layer LlamaForCausalLM) or a toy module whose next token is
always `last + 1`, with a byte-level tokenizer built in memory: nothing is downloaded. One test
uses the built-in demo model when its package is installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import requires_demo_model
import torch
from torch import nn

from autoao.evaluators import lmeval

transformers = pytest.importorskip("transformers")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

MAX_LENGTH = 32  # small, so rolling perplexity needs several windows


def byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per byte (GPT-2's byte alphabet, no merges) plus <eos>: 257 tokens, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def tiny_llama(vocab_size: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=MAX_LENGTH, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


class NextByte(nn.Module):
    """Toy causal LM: the next token is always the last one + 1. input_ids [B, T] -> logits [B, T, V]."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = nn.Parameter(torch.tensor(10.0))  # a parameter, so the device can be read

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.scale * nn.functional.one_hot((input_ids + 1) % self.vocab_size, self.vocab_size).float()


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def llama(tok):
    return tiny_llama(len(tok))


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


LOGLIKELIHOOD_ARGS = [
    ("Question: What is 2 plus 2?\nAnswer:", " 4"),
    ("Question: What is 2 plus 2?\nAnswer:", " five"),
    ("The cat sat on the ", "mat."),  # trailing space moves into the continuation
    ("", "Hello there"),  # empty context: scored after the prefix token
    ("a" * 40, " and a few more"),  # longer than MAX_LENGTH: context left-truncated
    ("x", "y"),
]
ROLLING_TEXTS = ["A short document.", "A longer document that spans several windows of thirty-two tokens, " * 3]


def test_causal_lm_matches_hflm(tok, llama):
    """Same model, same tokenizer: our LM and lm-eval's HFLM give the same log-likelihoods and
    greedy flags, for plain, empty-context, truncated and rolling (multi-window) requests, at
    different batch sizes (so different padding), and the same greedy generations."""
    ours = lmeval.CausalLM(llama, tok, batch_size=2, max_length=MAX_LENGTH)
    theirs = HFLM(pretrained=llama, tokenizer=tok, batch_size=4, max_length=MAX_LENGTH,
                  softmax_dtype=torch.float32)

    got = ours.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD_ARGS), disable_tqdm=True)
    want = theirs.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD_ARGS), disable_tqdm=True)
    for (g, g_greedy), (w, w_greedy), args in zip(got, want, LOGLIKELIHOOD_ARGS):
        assert g == pytest.approx(w, abs=1e-4), args
        assert g_greedy == w_greedy, args

    rolling = [(t,) for t in ROLLING_TEXTS]
    got = ours.loglikelihood_rolling(_requests("loglikelihood_rolling", rolling))
    want = theirs.loglikelihood_rolling(_requests("loglikelihood_rolling", rolling), disable_tqdm=True)
    assert got == pytest.approx(want, abs=1e-3)
    assert len(tok.encode(ROLLING_TEXTS[1])) > 3 * MAX_LENGTH  # really several windows

    # HFLM left-pads and masks, we right-pad: the greedy text must still agree row by row
    gen = [("Hello world", {"until": ["\n"], "max_gen_toks": 8}), ("Hi", {"until": ["\n"], "max_gen_toks": 8}),
           ("A much longer prompt, cut from the left", {"until": ["\n"], "max_gen_toks": 8})]
    assert ours.generate_until(_requests("generate_until", gen)) == \
        theirs.generate_until(_requests("generate_until", gen), disable_tqdm=True)


def test_generate_until_greedy_batched(tok):
    """Greedy generation honours `until` and `max_gen_toks`, and rows of different lengths in one
    right-padded batch each continue from their own last token."""
    lm = lmeval.CausalLM(NextByte(len(tok)), tok, batch_size=3, max_length=MAX_LENGTH)
    args = [("abc", {"until": ["g"], "max_gen_toks": 10}),  # d e f, stops before g
            ("a", {"until": ["g"], "max_gen_toks": 10}),  # b c d e f
            ("pq", {"until": ["zz"], "max_gen_toks": 4}),  # r s t u: cut by max_gen_toks
            ("hello", {"until": ["g"], "max_gen_toks": 10})]  # p q r s t u v w x y: 10 tokens
    out = lm.generate_until(_requests("generate_until", args))
    assert out == ["def", "bcdef", "rstu", "pqrstuvwxy"]


def test_generate_until_rejects_sampling(tok):
    lm = lmeval.CausalLM(NextByte(len(tok)), tok, max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until(_requests("generate_until", [("a", {"do_sample": True, "temperature": 0.7})]))


def test_bundled_tasks_run_offline_through_both_paths(tok, llama, monkeypatch):
    """Both bundled tasks load from the package's files (network forbidden) and score through HFLM
    (transformers model) and CausalLM (plain module)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = lmeval.task_names()
    assert tasks == ["autoao_facts", "autoao_text"]
    for model, lm in ((llama, "HFLM"), (NextByte(len(tok)), "CausalLM")):
        was_training = model.training
        result = lmeval.evaluate(model, tok, tasks, limit=3, batch_size=4, max_length=MAX_LENGTH)
        assert result.config["lm"] == lm
        assert result.samples == {"autoao_facts": 3, "autoao_text": 3}
        assert 0.0 <= result.metrics["autoao_facts"]["acc"] <= 1.0
        assert {"word_perplexity", "byte_perplexity", "bits_per_byte"} <= set(result.metrics["autoao_text"])
        assert result.seconds > 0
        assert model.training == was_training  # eval mode only for the run


def test_unknown_task_lists_bundled_ones(tok, llama):
    with pytest.raises(ValueError) as err:
        lmeval.evaluate(llama, tok, ["autoao_fact"], limit=1)
    msg = str(err.value)
    assert "Unknown lm-eval task 'autoao_fact'" in msg
    assert "Did you mean: autoao_facts" in msg
    assert "autoao_facts, autoao_text" in msg and "datasets" in msg


def test_missing_tokenizer_is_a_clear_error(llama):
    with pytest.raises(ValueError, match="tokenizer is None"):
        lmeval.evaluate(llama, None, "autoao_facts")


##### the bundled data ##########################################################################

def _make_facts():
    script = Path(__file__).resolve().parents[1] / "tools" / "make_facts.py"  # the generator, not packaged
    spec = importlib.util.spec_from_file_location("make_facts", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_facts_file_is_what_the_script_writes():
    """The committed JSONL is reproducible from tools/make_facts.py; every row is a valid 4-choice question."""
    make_facts = _make_facts()
    rows = make_facts.build()
    assert (lmeval.TASKS_DIR / "autoao_facts.jsonl").read_text(encoding="utf-8") == make_facts.render(rows)
    assert len(rows) >= 300
    for r in rows:
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4, r
        assert 0 <= r["answer"] < 4, r
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["category"] for r in rows[:100]}) >= 8  # a prefix (limit=100) mixes categories


def test_text_task_has_enough_prose():
    docs = [json.loads(line) for line in (lmeval.TASKS_DIR / "autoao_text.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(docs) >= 15
    assert sum(len(d["text"].split()) for d in docs) >= 5000
    assert all(d["title"] and d["text"] for d in docs)


def test_task_yaml_names_match_files():
    import yaml

    for path in lmeval.TASKS_DIR.glob("*.yaml"):
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert cfg["task"] == path.stem
        for f in cfg["dataset_kwargs"]["data_files"].values():
            assert (lmeval.TASKS_DIR / f).is_file(), f


##### the demo model ############################################################################

@requires_demo_model
def test_demo_model_is_far_above_chance_on_facts():
    """SmolLM2-135M answers the bundled facts well above chance (25%) on 100 questions."""
    import autoao.models

    model, tok = autoao.models.load()
    result = lmeval.evaluate(model, tok, ["autoao_facts"], limit=100)
    assert result.samples == {"autoao_facts": 100}
    assert result.metrics["autoao_facts"]["acc"] >= 0.5, result.metrics


def test_a_judge_scores_the_documents_it_samples_each_on_its_own(tok, llama, monkeypatch):
    """The tier-2 judge asks for given documents of a task (`samples`), not a prefix: exactly those
    are scored, each with its own headline score (0/1 for accuracy) and, for multiple choice, the
    gold answer's log-likelihood margin; their mean is the task's accuracy on them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    picked = [9, 2, 5]
    result = lmeval.evaluate(llama, tok, ["autoao_facts"], samples={"autoao_facts": picked}, batch_size=4,
                             max_length=MAX_LENGTH)
    docs = result.per_doc["autoao_facts"]
    assert sorted(docs) == sorted(picked) and result.samples == {"autoao_facts": 3}
    assert all(d["score"] in (0.0, 1.0) and "margin" in d for d in docs.values())
    assert result.metrics["autoao_facts"]["acc"] == pytest.approx(sum(d["score"] for d in docs.values()) / 3)
    assert all((d["margin"] > 0) == (d["score"] == 1.0) for d in docs.values())  # right exactly when gold leads
    assert lmeval.task_sizes(["autoao_facts"]) == {"autoao_facts": result.documents["autoao_facts"]}


def test_per_document_scoring_gives_each_document_one_forward_of_its_own(tok, monkeypatch):
    """per_document=True: each document's requests (its choices) run in one forward pass of their
    own, so a document scores the same whichever documents are scored with it; at batch size 8 the
    same requests share forwards across documents."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model = NextByte(len(tok))
    rows: list[int] = []
    model.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    alone = lmeval.evaluate(model, tok, ["autoao_facts"], samples={"autoao_facts": [5]}, per_document=True,
                            max_length=MAX_LENGTH)
    choices = rows[:]
    assert len(choices) == 1 and choices[0] > 1  # one forward holding all of the document's choices
    rows.clear()
    together = lmeval.evaluate(model, tok, ["autoao_facts"], samples={"autoao_facts": [5, 9, 2]},
                               per_document=True, max_length=MAX_LENGTH)
    assert len(rows) == 3 and together.config["batch_size"] == "per document"
    assert together.per_doc["autoao_facts"][5] == alone.per_doc["autoao_facts"][5]
    rows.clear()
    lmeval.evaluate(model, tok, ["autoao_facts"], samples={"autoao_facts": [5, 9, 2]}, batch_size=8,
                    max_length=MAX_LENGTH)
    assert len(rows) < 3  # batched across documents: what per_document avoids
