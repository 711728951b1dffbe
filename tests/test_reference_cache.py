"""The unmodified model's side of the label-free judges, cached on disk (evaluators.cache.TensorCache):
the proxy's screen outputs, float32 noise and confirmation chunks, and the generation check's
continuations and noise come back bit-identical to computing them, without running the model, with
the seconds they took when they were computed; an unreadable file is a miss. And a causal LM whose
verdict a task decides still holds enough held-out windows for every look of the generation check."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from tiny_models import TinyLM

import autoao
from autoao.stages import judges as judges_mod
from autoao.evaluators.cache import ResultCache, TensorCache, listed, numbered, scalar
from autoao.evaluators.generation import GenerationLooks
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.tier2 import MetricJudge
from autoao.ledger import RunLedger
from autoao.types import Budget
from autoao.stages.inputs import GENERATION_PROMPTS, PROMPT_TOKENS, build_inputs


class Counting(nn.Module):
    """`inner`, counting its forward calls."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


class ByteTokenizer:
    """text -> {"input_ids": [1, n]} byte ids (a vocabulary of 256)."""

    def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([list(text.encode())], dtype=torch.long)}


def _lm() -> nn.Module:
    torch.manual_seed(0)
    return TinyLM(vocab=256, dim=64, hidden=128).to(torch.bfloat16).eval()


def _ids(seed: int, rows: int, length: int) -> torch.Tensor:
    return torch.randint(0, 256, (rows, length), generator=torch.Generator().manual_seed(seed))


def _int4(model: nn.Module) -> nn.Module:
    q = copy.deepcopy(model)
    autoao.apply(q, autoao.Plan.uniform(q, "int4_wo(group_size=32)"))
    return q


def test_a_tensor_cache_round_trips_and_an_unreadable_file_is_a_miss(tmp_path):
    store = TensorCache(tmp_path / "references", "model")
    stored = {**numbered("out", [torch.randn(2, 3).bfloat16(), torch.arange(4)]), "seconds": scalar(0.1),
              "mask": torch.tensor([True, False])}
    assert store.get("a") is None and not store.has("a")
    store.put("a", stored)
    hit = store.get("a")
    assert store.has("a") and set(hit) == set(stored) and float(hit["seconds"]) == 0.1
    assert all(hit[k].dtype == v.dtype and torch.equal(hit[k], v) for k, v in stored.items())
    assert [t.shape for t in listed(hit, "out")] == [(2, 3), (4,)]
    assert TensorCache(tmp_path / "references", "another model").get("a") is None  # the scope is part of the key
    store.path("a").write_bytes(b"not safetensors")
    assert store.get("a") is None and not store.has("a")  # unreadable: a miss, removed
    store.put("a", stored)
    assert torch.equal(store.get("a")["out.1"], torch.arange(4))
    assert [p.name for p in (tmp_path / "references").iterdir()] == [store.path("a").name]  # no temporary left


def test_a_cached_proxy_is_bit_identical_and_does_not_run_the_model(tmp_path):
    model = Counting(_lm())
    screen, chunks = [_ids(1, 4, 64)], [[_ids(2, 4, 64)], [_ids(3, 2, 64), _ids(4, 2, 32)]]
    plan = _int4(model.inner)

    def built(references: TensorCache | None) -> tuple[ProxyEvaluator, list]:
        proxy = ProxyEvaluator(model, screen, confirm=chunks, references=references)
        proxy.calibrate(model)
        scores = [proxy.score(plan)]
        for chunk in range(len(chunks)):
            assert proxy.prepare(model, chunk)
            scores.append(proxy.score(plan, chunk=chunk))
        return proxy, scores

    plain, expected = built(None)
    store = TensorCache(tmp_path, "tiny")
    cold, cold_scores = built(store)
    assert not ProxyEvaluator(model, screen, confirm=chunks).on_disk(0)  # no cache: never on disk
    model.calls = 0
    unprepared = ProxyEvaluator(model, screen, confirm=chunks, references=store)
    assert not unprepared.on_disk(0)  # stored with the float32 noise, which it has not measured yet
    unprepared.calibrate(model)
    assert unprepared.on_disk(0) and unprepared.on_disk(1) and not unprepared.on_disk(2)
    warm, warm_scores = built(store)
    assert model.calls == 0  # every reference and the float32 twin came from the disk
    assert warm.pass_seconds == cold.pass_seconds  # the seconds measured when it was computed
    for proxy, scores in ((cold, cold_scores), (warm, warm_scores)):
        assert proxy.noise == plain.noise == "float32-vs-bf16" and proxy.floor == plain.floor < 1.0
        assert proxy.baseline == plain.baseline and proxy.data_digest == plain.data_digest
        assert [p.digest for p in proxy.confirm.values()] == [p.digest for p in plain.confirm.values()]
        assert scores == expected  # accuracy, metrics and evidence, exactly


class Rows(nn.Module):
    """[B, 16] -> [B, 8]: a bf16 linear layer's rows ("output"), or them in float32 of unit norm
    (a sentence-embedding model's: "embedding")."""

    def __init__(self, unit: bool) -> None:
        super().__init__()
        self.proj, self.unit = nn.Linear(16, 8).to(torch.bfloat16), unit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return torch.nn.functional.normalize(y.float(), dim=-1) if self.unit else y


@pytest.mark.parametrize("mode", ["output", "embedding"])
def test_another_modules_proxy_is_cached_as_its_raw_outputs(mode, tmp_path):
    torch.manual_seed(0)
    model = Counting(Rows(unit=mode == "embedding"))
    g = torch.Generator().manual_seed(1)
    screen, chunks = [torch.randn(8, 16, generator=g).bfloat16()], [[torch.randn(8, 16, generator=g).bfloat16()]]
    plan = copy.deepcopy(model.inner)
    with torch.no_grad():
        plan.proj.weight += 0.01

    def built(references: TensorCache | None) -> tuple[ProxyEvaluator, list]:
        proxy = ProxyEvaluator(model, screen, confirm=chunks, references=references)
        proxy.calibrate(model)
        assert proxy.prepare(model, 0)
        return proxy, [proxy.score(plan), proxy.score(plan, chunk=0)]

    plain, expected = built(None)
    assert plain.mode == mode and expected[0][0].drop > 0
    store = TensorCache(tmp_path, "tiny")
    built(store)
    model.calls = 0
    warm, scores = built(store)
    assert model.calls == 0 and scores == expected and warm.baseline == plain.baseline


def test_cached_generation_looks_are_bit_identical_and_do_not_run_the_model(tmp_path):
    model = Counting(_lm())
    chunks, new_tokens = [_ids(5, 4, 16), _ids(6, 3, 16)], 12
    plan = _int4(model.inner)

    def built(references: TensorCache | None) -> GenerationLooks:
        looks = GenerationLooks(chunks, new_tokens, references=references)
        for look in range(looks.looks):
            looks.prepare(model, look)
        return looks

    plain = built(None)
    store = TensorCache(tmp_path, "tiny")
    cold = built(store)
    fresh = GenerationLooks(chunks, new_tokens, references=store)
    assert fresh.on_disk(model, 0) and fresh.on_disk(model, 1)
    assert not GenerationLooks(chunks, new_tokens + 1, references=store).on_disk(model, 0)  # new_tokens is in the key
    model.calls = 0
    warm = built(store)
    assert model.calls == 0
    for look in range(2):
        a, b, c = plain.judges[look], cold.judges[look], warm.judges[look]
        assert torch.equal(a.tokens, c.tokens) and torch.equal(a.noise, c.noise) and a.noise.dtype == c.noise.dtype
        assert c.seconds == b.seconds and c.noise_floor == a.noise_floor < 1.0
        assert warm.evidence(plan, look) == plain.evidence(plan, look)
        assert c.free_run(plan) == a.free_run(plan)


def test_a_task_deciding_lm_holds_every_look_of_the_generation_check(tmp_path):
    """Where a task decides, the workload builds no confirmation chunks (the proxy does not
    confirm) but enough further held-out windows for the generation check's 64 prompts."""
    assert max(sum(counts) for counts, _ in judges_mod.GENERATION.values()) <= GENERATION_PROMPTS
    model = _lm()
    work = build_inputs(model, [_ids(7, 1, 16)], tokenizer=ByteTokenizer(), confirm=False)
    assert work.confirm == () and work.prompt_inputs
    screen = torch.cat(work.held_out.inputs)  # [B, 128] the screen's sequences
    assert not any(torch.equal(x, s[None]) for x in work.prompt_inputs for s in screen)  # disjoint from the screen
    rows = judges_mod.prompts(work, GENERATION_PROMPTS)
    assert rows.shape == (GENERATION_PROMPTS, PROMPT_TOKENS)
    proxy_work = build_inputs(model, [_ids(7, 1, 16)], tokenizer=ByteTokenizer(), confirm=True)
    assert proxy_work.confirm and proxy_work.prompt_inputs == ()  # the confirmation chunks hold the windows
    mlp = nn.Sequential(nn.Linear(8, 8))
    assert build_inputs(mlp, [torch.randn(4, 8)], confirm=False).prompt_inputs == ()  # not an LM: no prompts


def test_a_second_build_judges_runs_only_what_is_not_on_disk(tmp_path):
    """build_judges twice with one result cache: the second loads the proxy's and the first
    generation look's references, prices trials and checks at the seconds measured the first
    time, and its one-off share drops by the look it found on disk."""
    model = Counting(_lm())
    work = build_inputs(model, [_ids(7, 1, 16)], tokenizer=ByteTokenizer(), confirm=False)

    def judges() -> judges_mod.Judges:
        task = MetricJudge(lambda m: 1.0)
        task.set_baseline(model)
        return judges_mod.build_judges(model, work, task, 0.01, cache=ResultCache(tmp_path / "timings.sqlite"),
                                    weights_key="tiny", ledger=RunLedger(Budget(trials=1), progress=False))

    cold = judges()
    task, generation = cold.checks
    assert generation.looks == 3 and cold.proxy.confirm_inputs == []
    model.calls = 0
    warm = judges()
    assert model.calls == 0
    assert (warm.proxy_s, warm.checks[1].check_s) == (cold.proxy_s, generation.check_s)
    # a check: the generation looks' plan side, and the task (its seconds measured on every call)
    assert warm.check_s - warm.deciding.seconds == pytest.approx(cold.check_s - task.seconds, abs=1e-9)
    first = len(generation.chunks[0]) / sum(len(c) for c in generation.chunks)
    assert warm.once_s == pytest.approx(cold.once_s * (1 - first))
    assert (tmp_path / "references").is_dir()


class Slow(Counting):
    """`inner`, each forward call taking at least 20 ms more (a call's price dominates)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time
        time.sleep(0.02)
        return super().forward(x)


def test_a_check_is_priced_at_a_plans_teacher_forced_pass_not_at_the_reference_side():
    """A plan's look runs as many decode steps, teacher-forced, as the reference's greedy
    continuation; the reference's own side is that continuation and its float32 twin's pass, the
    upcast included. The price says so: a check's plan side (every look) at the continuation's
    seconds per prompt, the one-off side at the reference side's (at least two passes)."""
    model = Slow(_lm())
    chunks, new_tokens = [_ids(5, 4, 16), _ids(6, 4, 16), _ids(7, 8, 16)], 12
    looks = GenerationLooks(chunks, new_tokens)
    looks.price(model, "tiny", lambda line: None)
    first = looks.judges[0]
    assert new_tokens * 0.02 <= first.pass_seconds < first.seconds and first.seconds >= 2 * new_tokens * 0.02
    assert looks.check_s == pytest.approx(first.pass_seconds / 4 * 16)
    assert looks.once_s == pytest.approx(first.seconds / 4 * 16)
    assert looks.once_s > 1.5 * looks.check_s
