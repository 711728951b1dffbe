"""Accuracy tiers 0 and 1 on tiny models: real numbers, cached, and the right mode per model."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import autoao
from autoao import search_space
from autoao.evaluators.cache import ResultCache
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import layer_errors
from autoao.profile import profile
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build  # noqa: E402


@pytest.fixture()
def tiny():
    return build()


def test_layer_errors_rank_precisions_and_are_cached(tiny, tmp_path, monkeypatch):
    model, ex = tiny["model"], tiny["example_inputs"]
    prof = profile(model, ex)
    cands = [search_space.get(n) for n in ("int8_wo", "int4_wo(group_size=32)", "int4_wo(group_size=64)")]
    cache = ResultCache(tmp_path / "c.sqlite")
    errs = layer_errors(model, prof, cands, cache=cache, progress=False)
    assert set(errs) == {lay.fqn for lay in prof.layers}
    for fqn, per in errs.items():
        assert per["int8_wo"] > per["int4_wo(group_size=32)"] + 10, fqn  # ~6 dB per bit
        assert all(math.isfinite(v) for v in per.values())
    # a second call is served from the cache: no candidate is built
    monkeypatch.setattr(type(cands[0]), "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    again = layer_errors(model, prof, cands[:1], cache=cache, progress=False)
    assert {f: p["int8_wo"] for f, p in again.items()} == {f: p["int8_wo"] for f, p in errs.items()}


def test_unsupported_candidates_are_absent(tiny):
    model, ex = tiny["model"], tiny["example_inputs"]
    prof = profile(model, ex)
    errs = layer_errors(model, prof, [search_space.get("int4_wo(group_size=128)")], progress=False)
    # K=64 layers cannot take group size 128; the K=128 down_proj can
    assert all(("int4_wo(group_size=128)" in per) == fqn.endswith("down_proj") for fqn, per in errs.items())


def test_proxy_lm_mode_measures_drop_against_the_reference(tiny, tmp_path):
    model, held = tiny["model"], tiny["eval_inputs"]
    proxy = ProxyEvaluator(model, held, cache=ResultCache(tmp_path / "c.sqlite"))
    assert proxy.lm and proxy.ntokens == 2 * 32 and _labels(proxy) == 2 * 31
    same = proxy(model)
    assert same.tier == 1 and same.drop == 0 and same.metrics["kl"] == pytest.approx(0, abs=1e-6)
    q = copy.deepcopy(model)
    autoao.apply(q, autoao.Plan.uniform(q, "int4_wo(group_size=32)"))
    a = proxy(q, key="int4")
    assert a.metrics["kl"] > 0 and "top-1 agreement with the unmodified model on 64 tokens" in a.source
    assert a.accuracy == a.metrics["agreement"] and "next_token" in a.metrics
    assert a.drop == pytest.approx(proxy.baseline["accuracy"] - a.accuracy)
    assert proxy(model, key="int4").metrics == a.metrics  # same key: served from the cache
    # the evidence: every position paired with the reference's, its mean the drop
    acc, evidence = proxy.score(q, key="int4")
    assert acc == a and (evidence.unit, evidence.n, evidence.judge, evidence.tier) == ("positions", 64, "proxy", 1)
    assert evidence.interval()[0] == pytest.approx(a.drop) and evidence.score == a.accuracy


def _labels(proxy) -> int:
    """Next-token labels the proxy's screen scores (T - 1 per sequence)."""
    return sum(lab.numel() for lab in proxy.screen.labels if lab is not None)


def test_proxy_falls_back_to_output_error_for_non_lm_models():
    torch.manual_seed(0)
    reg = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    x = [torch.randn(16, 32)]
    proxy = ProxyEvaluator(reg, x)
    assert not proxy.lm and proxy.baseline["rel_error"] == 0
    q = copy.deepcopy(reg)
    autoao.apply(q, autoao.Plan.uniform(q, "int8_dyn"))
    a = proxy(q)
    assert 0 < a.drop < 0.05 and "relative L2 error" in a.source
    # the drop is the mean over output rows of each row's relative error (paired per row)
    assert a.drop == pytest.approx(a.metrics["row_error"])
    acc, evidence = proxy.score(q)
    assert (evidence.unit, evidence.n) == ("rows", 16) and evidence.interval()[0] == pytest.approx(a.drop)


def test_the_unchanged_model_scores_as_the_baseline_without_running(tiny):
    proxy = ProxyEvaluator(tiny["model"], tiny["eval_inputs"], reference_key="unchanged")

    class Counted(nn.Module):
        calls = 0

        def forward(self, ids):
            Counted.calls += 1
            return tiny["model"](ids)

    a = proxy(Counted(), key="unchanged")
    assert Counted.calls == 0 and a.drop == 0 and a.accuracy == proxy.baseline["accuracy"]
    assert proxy(Counted(), key="another plan").drop == 0 and Counted.calls > 0  # any other key runs


def test_one_token_inputs_are_judged_by_agreement_without_labels(tiny):
    """T=1 has no next token to score, but top-1 agreement and KL need none."""
    proxy = ProxyEvaluator(tiny["model"], [torch.randint(0, 128, (4, 1))])
    assert proxy.lm and proxy.ntokens == 4 and _labels(proxy) == 0
    assert proxy.baseline == {"accuracy": 1.0, "agreement": 1.0, "kl": pytest.approx(0, abs=1e-6)}


def test_a_plan_that_fails_scores_as_useless(tiny):
    proxy = ProxyEvaluator(tiny["model"], tiny["eval_inputs"])

    class Broken(nn.Module):
        def forward(self, ids):
            raise RuntimeError("boom")

    a = proxy(Broken())
    assert a.accuracy == -math.inf and math.isinf(a.drop)


def test_device_fingerprint_changes_with_any_word_and_its_position():
    from autoao.evaluators.cache import device_fingerprint, digest

    t = torch.randn(300, 77)  # any device computes it; the CPU stands in for a GPU here
    base = device_fingerprint(t)
    assert len(base) == 16 and device_fingerprint(t.clone()) == base
    assert device_fingerprint(t.t().contiguous().t()) == base  # contents, not strides
    for i in (0, 1234, t.numel() - 1):
        bumped = t.clone().reshape(-1)
        bumped[i] = torch.nextafter(bumped[i], torch.tensor(math.inf))  # one bit of one word
        assert device_fingerprint(bumped) != base
    swapped = t.clone().reshape(-1)
    swapped[[10, 11]] = swapped[[11, 10]]
    assert device_fingerprint(swapped) != base
    # a trailing partial word is zero-padded: the shape, part of digest, tells these apart
    a, b = torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([1, 2, 3, 0], dtype=torch.uint8)
    assert device_fingerprint(a) == device_fingerprint(b) and digest(a) != digest(b)
