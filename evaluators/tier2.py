"""Tier 2: the user's tasks or metric, as paired per-document evidence.

    judge = LmEvalJudge(tokenizer, ["autoao_facts"], cache=cache)
    judge.prepare(reference_model, look=0)              # the unmodified model on the look's documents
    acc, evidence = judge.evidence(plan_model, key, look=0)
    autoao.budget.AccuracyBudget(...).judge(evidence, looks=judge.looks)

A task is a finite population of documents: the unmodified model and the plan are scored on the
same documents, drawn in one fixed random order, and the drop is the mean of the per-document
differences. Each look scores more of them (LOOK_DOCS, then doubling, then all), so a judge asks
for as many documents as the interval needs and no more; on part of a task the interval covers
the documents not scored (the finite-population correction), on all of it the drop is exact.
Each document's score is cached on disk per (task, model weights, plan), so no document is scored
twice for the same plan. Each document's requests run in one forward of their own, so its score
depends on it alone, whichever look scores it (a bf16 model's scores move with their batch-mates).
So the drop is exact for this scoring: `probe` also scores the unmodified model's first-look
documents the way lm-eval usually runs (LMEVAL_BATCH requests a forward) and counts those whose
outcome differs, which the report sets against the budget (how far a re-score elsewhere can move).

The user's metric, `fn(model) -> float`, is judged as exact: one number, measured whole. The
optional protocol for per-item evidence: `fn(model)` returns a sequence (list, tuple or 1-D
tensor) of per-item scores, the same items in the same order every call; the drop is their paired
mean and the evidence counts the items that changed.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

from autoao.evaluators.cache import ResultCache
from autoao.evaluators.judge import Judge, JudgeContext, JudgeRecord, Say, register
from autoao.types import BATCH_COMPARED, BATCH_FLIPS, LMEVAL_BATCH, UNMODIFIED_ACC, Accuracy, Evidence, Stratum

LOOK_DOCS = 64  # documents per task at a judge's first look; each later look doubles them
# seconds per document when every probed document came from the cache and no rate was stored with
# them: SmolLM2-135M scored about 0.1 s a document on a quiet 2-core CPU with AMX (one forward each), so a
# guess on the slow side keeps the time plan's reserve for a check
UNKNOWN_RATE_S = 0.5


def _docs_key(task: str, key: str) -> str:
    """The disk-cache key of the per-document scores of the model `key` names on `task`."""
    return f"tier2-docs:{task}:per-doc:{key}"


@register
class LmEvalJudge(Judge):
    """lm-eval tasks, scored per document (evaluators.lmeval). accuracy = the mean over tasks of
    each task's headline metric (acc; tasks without one, e.g. perplexity, are not judged)."""

    tier = 2

    @classmethod
    def accepts(cls, accuracy: Any) -> bool:
        return isinstance(accuracy, (list, tuple)) and all(isinstance(t, str) for t in accuracy)

    @classmethod
    def create(cls, accuracy: Any, context: JudgeContext) -> Judge:
        return cls(context.tokenizer, list(accuracy), cache=context.cache, seed=context.seed)

    def __init__(self, tokenizer: Any, tasks: list[str], *, cache: ResultCache | None = None,
                 seed: int = 0) -> None:
        from autoao.evaluators import lmeval  # lazy: lm-eval is heavy

        self._lmeval = lmeval
        self.tokenizer, self.tasks, self.cache = tokenizer, list(tasks), cache
        self.sizes = lmeval.task_sizes(self.tasks)
        self.order = {t: random.Random(f"{seed}:{t}").sample(range(n), n) for t, n in self.sizes.items()}
        self.baseline_key: str | None = None
        self.seconds_per_doc = 0.0  # measured by `probe`
        self.batching: dict[str, tuple[int, int]] = {}  # task -> (flips, documents): `probe`'s comparison
        self._scores: dict[tuple[str, str], dict[int, dict[str, float]]] = {}  # (task, key) -> doc -> score

    @property
    def looks(self) -> int:
        """How many looks exhaust the largest task (the Bonferroni count of every verdict)."""
        return max(self._look_count(n) for n in self.sizes.values())

    def documents(self, look: int) -> dict[str, int]:
        """Task -> how many of its documents look `look` scores."""
        return {t: min(n, LOOK_DOCS * 2 ** look) for t, n in self.sizes.items()}

    def _look_docs(self, look: int) -> dict[str, list[int]]:
        """Task -> the ids of the documents look `look` scores, in the judge's order."""
        return {t: self.order[t][:n] for t, n in self.documents(look).items()}

    def describe(self) -> str:
        return f"lm-eval: {', '.join(self.tasks)} ({', '.join(f'{t} {n} documents' for t, n in self.sizes.items())})"

    def probe(self, reference: nn.Module, key: str) -> float:
        """Score the unmodified model on the first look's documents (its `key` names it from now on)
        and return the seconds per document that took (what a check is priced at); where they were
        all cached, the rate measured when they were scored."""
        self.baseline_key = key
        rate_key = f"tier2-rate:{sorted(self.tasks)}:per-doc:{key}"
        t0 = time.perf_counter()
        scored = self._score(reference, key, 0)
        if scored:
            self.seconds_per_doc = (time.perf_counter() - t0) / scored
            if self.cache is not None:
                self.cache.put(rate_key, {"seconds_per_doc": self.seconds_per_doc})
        else:
            hit = self.cache.get(rate_key) if self.cache is not None else None
            self.seconds_per_doc = float(hit["seconds_per_doc"]) if hit else UNKNOWN_RATE_S
        self.batching = self._batched(reference, key)
        return self.seconds_per_doc

    def price(self, reference: nn.Module, key: str, say: Say) -> None:
        """A plan's side at worst scores every document; the unmodified model's only those a
        previous run left unscored (the cache keeps them)."""
        say("the unmodified model on the tasks' first documents (tier 2)")
        per_doc = self.probe(reference, key)
        say("lm-eval's batching changes the answer of " + ", ".join(
            f"{f} of the first {n} documents of {t}" for t, (f, n) in self.batching.items())
            + " (the verdicts score one document a forward)")
        self.check_s, self.once_s = per_doc * sum(self.sizes.values()), per_doc * self.unscored(key)

    def record(self) -> JudgeRecord:
        baseline, metrics = self.baseline_scores(0)
        return JudgeRecord(baseline, metrics, tasks=list(self.tasks))

    def _batched(self, reference: nn.Module, key: str) -> dict[str, tuple[int, int]]:
        """Task -> (documents of the first look whose outcome changes when lm-eval scores them
        LMEVAL_BATCH requests a forward instead of one document a forward, documents compared);
        cached."""
        docs = {t: sorted(ids) for t, ids in self._look_docs(0).items()}
        cache_key = f"tier2-batched:{sorted(self.tasks)}:{LMEVAL_BATCH}:{key}"
        hit = self.cache.get(cache_key) if self.cache is not None else None
        if hit is None:
            result = self._lmeval.evaluate(reference, self.tokenizer, list(docs), samples=docs,
                                           batch_size=LMEVAL_BATCH)
            hit = {t: {str(d): v["score"] for d, v in result.per_doc.get(t, {}).items()} for t in docs}
            if self.cache is not None:
                self.cache.put(cache_key, hit)
        out = {}
        for task, ids in docs.items():
            one, batched = self._cached(task, key), hit.get(task, {})
            both = [d for d in ids if d in one and str(d) in batched]
            out[task] = (sum(one[d]["score"] != batched[str(d)] for d in both), len(both))
        return out

    def unscored(self, key: str) -> int:
        """How many documents of the tasks have no score for the model `key` names yet (in memory or
        in the disk cache): what judging it on every document still costs."""
        return sum(n - len(self._cached(task, key)) for task, n in self.sizes.items())

    def baseline_scores(self, look: int) -> tuple[float | None, dict[str, float]]:
        """The unmodified model's accuracy on the documents of `look` it has scored, and per task
        its acc and how many documents that is (None, {} before `probe`)."""
        if self.baseline_key is None:
            return None, {}
        metrics: dict[str, float] = {}
        for task, ids in self._look_docs(look).items():
            docs = set(ids)
            scored = [v["score"] for d, v in self._cached(task, self.baseline_key).items() if d in docs]
            if scored:
                metrics[f"{task}/acc"] = sum(scored) / len(scored)
                metrics[f"{task}/documents"] = float(len(scored))
        for task, (flips, compared) in self.batching.items():
            metrics[f"{task}/{BATCH_FLIPS}"], metrics[f"{task}/{BATCH_COMPARED}"] = float(flips), float(compared)
        accs = [v for k, v in metrics.items() if k.endswith("/acc")]
        return (sum(accs) / len(accs) if accs else None), metrics

    def prepare(self, reference: nn.Module, look: int) -> None:
        """The unmodified model's scores on look `look`'s documents (before a plan is applied)."""
        assert self.baseline_key is not None, "probe(reference, key) first"
        self._score(reference, self.baseline_key, look)

    def evidence(self, model: nn.Module, key: str, look: int) -> tuple[Accuracy, Evidence]:
        """The plan's accuracy and its paired evidence on look `look`'s documents."""
        assert self.baseline_key is not None, "probe(reference, key) first"
        self._score(model, key, look)
        strata, base_acc, plan_acc, metrics = [], [], [], {}
        for task, docs in self._look_docs(look).items():
            n = len(docs)
            base, plan = self._cached(task, self.baseline_key), self._cached(task, key)
            diffs = [base[d]["score"] - plan[d]["score"] for d in docs]
            strata.append(Stratum(tuple(diffs), (1,) * len(diffs), 1 / len(self.sizes), self.sizes[task],
                                  sum(x != 0 for x in diffs)))
            base_acc.append(sum(base[d]["score"] for d in docs) / n)
            plan_acc.append(sum(plan[d]["score"] for d in docs) / n)
            metrics[f"{task}/acc"] = plan_acc[-1]
            metrics[f"{task}/{UNMODIFIED_ACC}"], metrics[f"{task}/documents"] = base_acc[-1], float(n)
            margins = [plan[d]["margin"] - base[d]["margin"] for d in docs if "margin" in plan[d] and "margin" in base[d]]
            if margins:
                metrics[f"{task}/margin_change"] = sum(margins) / len(margins)
        b, p = sum(base_acc) / len(base_acc), sum(plan_acc) / len(plan_acc)
        evidence = Evidence("lm-eval", 2, ", ".join(f"{t} acc" for t in self.tasks), "documents", tuple(strata), b, p)
        return Accuracy(2, p, b - p, metrics, f"lm-eval: {', '.join(self.tasks)}"), evidence

    def evidence_through(self, model: nn.Module, key: str, look: int) -> tuple[Evidence, dict[str, float]]:
        acc, evidence = self.evidence(model, key, look)  # cumulative: every document up to the look's
        return evidence, dict(acc.metrics)

    def _look_count(self, n: int) -> int:
        looks = 1
        while LOOK_DOCS * 2 ** (looks - 1) < n:
            looks += 1
        return looks

    def _cached(self, task: str, key: str) -> dict[int, dict[str, float]]:
        """Doc id -> score of the model `key` names on `task`: in memory, else from the disk cache."""
        if (task, key) not in self._scores and self.cache is not None:
            hit = self.cache.get(_docs_key(task, key))
            if hit:
                self._scores[(task, key)] = {int(d): v for d, v in hit.items()}
        return self._scores.get((task, key), {})

    def _score(self, model: nn.Module, key: str, look: int) -> int:
        """Score `model` on the look's documents it has no cached score for; how many it scored."""
        missing = {}
        for task, ids in self._look_docs(look).items():
            have = self._cached(task, key)
            # sorted: lm-eval scores a task's sampled documents in index order but labels its logged
            # samples in the order given (lm-eval 0.4.13)
            todo = sorted(d for d in ids if d not in have)
            if todo:
                missing[task] = todo
        if not missing:
            return 0
        # Each document's requests in one forward of their own (lmeval.evaluate(per_document=True)): a
        # document's score must not depend on what it is batched with, or scoring the same documents in
        # other looks (other batch-mates) would change them. It does at batch 8: the padding moves a bf16
        # model's numbers (SmolLM2 on the first 64 autoao_facts documents: acc 0.6563 at batch 8, 0.6406 at
        # batch 1, one answer apart), and per-tensor activation quantization (int8_dyn(act=tensor)) takes
        # its scale from the whole batch. One forward per document costs about 0.7 of one per request.
        result = self._lmeval.evaluate(model, self.tokenizer, list(missing), samples=missing, per_document=True)
        for task in missing:
            merged = {**self._cached(task, key), **result.per_doc.get(task, {})}
            self._scores[(task, key)] = merged
            if self.cache is not None:
                self.cache.put(_docs_key(task, key), {str(d): v for d, v in merged.items()})
        return sum(len(v) for v in missing.values())


@register
class MetricJudge(Judge):
    """Tier 2 from the user's own metric: fn(model) -> float (higher is better), or a sequence of
    per-item scores (module docstring). A callable with a `last_metrics` dict
    (autoao.evaluators.retrieval.RetrievalTask) has it recorded with each value."""

    tier = 2
    looks = 1

    @classmethod
    def accepts(cls, accuracy: Any) -> bool:
        return callable(accuracy)

    @classmethod
    def create(cls, accuracy: Any, context: JudgeContext) -> Judge:
        """Scored on the model as it came right away: a broken metric fails before anything is measured."""
        judge = cls(accuracy)
        judge.set_baseline(context.model)
        return judge

    def __init__(self, fn: Callable[[nn.Module], Any]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", None) or type(fn).__name__
        self.baseline: list[float] | None = None
        self.seconds = 0.0  # what scoring the unmodified model took

    def describe(self) -> str:
        return f"user metric: {self.name}"

    def set_baseline(self, reference: nn.Module) -> None:
        """Score the unmodified model; ValueError naming the callable if it raises or does not
        return a finite number or sequence of numbers (checked before any measurement, so a broken
        metric costs nothing)."""
        label = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        t0 = time.perf_counter()
        try:
            value = self.fn(reference)
        except Exception as e:  # noqa: BLE001 - the user's code: report it, with its own message
            raise ValueError(f"accuracy callable {label} raised on the unmodified model: "
                             f"{type(e).__name__}: {e}") from None
        self.baseline = _scores(value, f"accuracy callable {label} on the unmodified model")
        self.seconds = time.perf_counter() - t0

    def price(self, reference: nn.Module, key: str, say: Say) -> None:
        self.check_s = self.seconds  # scoring the unmodified model took as long as a plan's will

    def record(self) -> JudgeRecord:
        return JudgeRecord(sum(self.baseline) / len(self.baseline) if self.baseline else None, metric=self.name)

    def evidence_through(self, model: nn.Module, key: str, look: int) -> tuple[Evidence, dict[str, float]]:
        acc, evidence = self.evidence(model, key, look)
        return evidence, dict(acc.metrics)

    def evidence(self, model: nn.Module, key: str | None = None, look: int = 0) -> tuple[Accuracy, Evidence]:
        assert self.baseline is not None, "set_baseline first"
        plan = _scores(self.fn(model), f"accuracy callable {self.name}")
        if len(plan) != len(self.baseline):
            raise ValueError(f"accuracy callable {self.name} returned {len(plan)} item scores, the unmodified model "
                             f"got {len(self.baseline)}: it must score the same items every call")
        diffs = tuple(b - p for b, p in zip(self.baseline, plan))
        base, mine = sum(self.baseline) / len(diffs), sum(plan) / len(diffs)
        extra = getattr(self.fn, "last_metrics", None)
        metrics = {self.name: mine, **({k: float(v) for k, v in extra.items()} if isinstance(extra, dict) else {})}
        unit = "items" if len(diffs) > 1 else "value (the metric as given: one number, measured whole)"
        stratum = Stratum(diffs, (1,) * len(diffs), population=len(diffs), changed=sum(d != 0 for d in diffs))
        evidence = Evidence("metric", 2, self.name, unit, (stratum,), base, mine, discrete=False)
        return Accuracy(2, mine, base - mine, metrics, self.describe()), evidence


def _scores(value: Any, what: str) -> list[float]:
    """One number or a sequence of them, as floats; ValueError naming `what` otherwise."""
    if isinstance(value, torch.Tensor):
        value = value.detach().flatten().tolist() if value.numel() != 1 else value.item()
    items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    if not items or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in items):
        raise ValueError(f"{what} returned {type(value).__name__}; it must return one number or a sequence of "
                         "per-item numbers (higher is better)")
    if not all(math.isfinite(float(v)) for v in items):
        raise ValueError(f"{what} returned a value that is not finite; it must return finite numbers")
    return [float(v) for v in items]
