"""The built-in full-precision encoder minilm-l6: loaded offline in fp32 with its tokenizer, its
bundled autoao_pairs task far from 100%, the encoder proxy, and a short search that returns a plan
or keeps the model with a reason."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import requires_minilm

import autoao
import autoao.models as models
from autoao.evaluators.retrieval import RetrievalTask, load_items
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import output_mode

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def minilm():
    model, tok = models.load("minilm-l6")
    return model, tok, models.encoder_inputs("minilm-l6", tok)


def test_the_committed_pairs_are_what_the_generator_writes(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tools')!r}); import make_pairs, json; "
            "print(''.join(json.dumps(it, ensure_ascii=False) + '\\n' for it in make_pairs.items()), end='')")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out == (ROOT / "evaluators" / "tasks" / "autoao_pairs.jsonl").read_text()
    items = load_items()
    assert len(items) >= 180 and len({it["topic"] for it in items}) >= 8
    assert all(it["negatives"] and it["positive"] != it["query"] for it in items)


@requires_minilm
def test_load_gives_the_fp32_encoder_and_its_tokenizer(minilm):
    model, tok, work = minilm
    assert isinstance(model, models.SentenceEncoder) and type(model.encoder).__name__ == "BertModel"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert 22.0e6 < sum(p.numel() for p in model.parameters()) < 23.5e6
    ex = work["example_inputs"]
    assert ex["input_ids"].shape[0] == 32 and ex["attention_mask"].shape == ex["input_ids"].shape
    with torch.no_grad():
        emb = model(**ex)
    assert emb.shape == (32, 384) and torch.allclose(emb.norm(dim=-1), torch.ones(32), atol=1e-5)
    assert tok.decode(tok("Quantized weights")["input_ids"], skip_special_tokens=True) == "quantized weights"
    # the proxy's held-out sentences are not the calibration batch
    held = {tuple(r.tolist()) for e in work["eval_inputs"] for r in e["input_ids"]}
    assert not held & {tuple(r.tolist()) for r in ex["input_ids"]}


@requires_minilm
def test_the_task_runs_and_fp32_is_far_from_perfect(minilm):
    model, tok, work = minilm
    task = work["accuracy"]
    value = task(model)
    m = task.last_metrics
    assert 0.4 < value < 0.85 and value == m["accuracy"] == pytest.approx((m["pairing"] + m["retrieval"]) / 2)
    assert m["pairing"] < 0.5  # the near misses are hard: word overlap wins
    assert m["cosine_to_reference"] == pytest.approx(1.0) and m["top1_agreement"] == 1.0
    assert m["pairing_agreement"] == 1.0 and m["margin_error"] == 0.0
    # a model whose embeddings lost their meaning scores far lower (on a quarter of the items: fast)
    part = RetrievalTask(tok, load_items()[::4])
    clean = part(model)
    noisy = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in noisy.encoder.encoder.parameters():
            p.add_(torch.randn_like(p) * p.std() * 2)
    assert part(noisy) < clean - 0.15 and part.last_metrics["cosine_to_reference"] < 0.9
    assert part.last_metrics["pairing_agreement"] < 0.9 and part.last_metrics["margin_error"] > 0.02


@requires_minilm
def test_the_encoder_proxy_scores_embedding_agreement(minilm):
    model, tok, work = minilm
    held = work["eval_inputs"][:2]
    proxy = ProxyEvaluator(model, held)
    assert proxy.mode == "embedding" and proxy.baseline["accuracy"] == 1.0 and proxy.baseline["nn_agreement"] == 1.0
    q = copy.deepcopy(model)
    autoao.apply(q, autoao.Plan.uniform(q, "int8_dyn"))
    a = proxy(q)
    assert 0 < a.drop < 0.05 and a.drop == pytest.approx(1 - a.metrics["cosine"])
    assert "cosine similarity" in a.source and 0 <= a.metrics["nn_agreement"] <= 1
    # the bare BertModel (a ModelOutput of hidden states) is judged the same way, mean-pooled
    bare = ProxyEvaluator(model.encoder, held)
    assert bare.mode == "embedding"


def test_output_mode_is_chosen_by_the_output_type():
    ids = torch.randint(0, 50, (4, 6))
    assert output_mode([torch.randn(4, 6, 64)], [ids]) == "lm"  # logits over a vocabulary above every id
    assert output_mode([torch.randn(4, 6, 32)], [ids + 40]) == "embedding"  # hidden states: ids above 32
    unit = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    assert output_mode([unit], [torch.randn(4, 3)]) == "embedding"
    assert output_mode([torch.randn(4, 8)], [torch.randn(4, 3)]) == "output"  # a regressor's outputs
    assert output_mode([unit[:2]], [torch.randn(2, 3)]) == "output"  # two rows have no neighbours to rank


@requires_minilm
def test_a_short_search_returns_a_plan_or_keeps_fp32_with_a_reason(minilm, tmp_path):
    model, tok, work = minilm
    model = copy.deepcopy(model)
    small = {k: v[:8, :24] for k, v in work["example_inputs"].items()}
    held = {k: v[:8] for k, v in work["eval_inputs"][0].items()}
    task = RetrievalTask(tok, load_items()[::8])  # 24 items: a fast tier 2
    # a time budget bounds the test on a busy machine (where timing retakes disturbed samples)
    r = autoao.optimize(model, small, budget="30s", accuracy=task, candidates=["int8_dyn"],
                        eval_inputs=[held], max_accuracy_drop=0.02, out_dir=tmp_path, progress=False)
    s = r.summary
    assert (tmp_path / "report.html").is_file()
    if r.plan.layers:
        assert s.accuracy is not None and s.accuracy.tier == 2 and s.accuracy.drop <= 0.02
        assert "autoao_pairs" in s.accuracy.source
        assert s.verdict is not None and s.verdict.holds and s.verdict.tier == 2  # shipped on its verdict
    else:
        assert s.decisions and all(d.describe() for d in s.decisions)
        assert any(type(d).ends_unchanged for d in s.decisions)  # one of them says why it stayed


@requires_minilm
def test_the_cli_loads_minilm_with_its_inputs_and_task():
    """`autoao search --model minilm-l6` gets the encoder's batch, held-out inputs and autoao_pairs
    (which becomes the accuracy unless --tasks is given)."""
    from autoao.cli.args import load_model

    loaded = load_model("minilm-l6", torch.device("cpu"))
    assert isinstance(loaded["model"], models.SentenceEncoder) and loaded["tokenizer"] is not None
    assert loaded["example_inputs"]["input_ids"].shape[0] == 32 and len(loaded["eval_inputs"]) == 4
    assert isinstance(loaded["accuracy"], RetrievalTask)
