"""autoao_pairs: what users of a sentence-embedding model care about, as one number.

    task = RetrievalTask(tokenizer)       # reads evaluators/tasks/autoao_pairs.jsonl
    task(model)                           # -> retrieval accuracy in [0, 1]; task.last_metrics has more
    autoao.optimize(model, inputs, accuracy=task, max_accuracy_drop=0.01)

Every item of the bundled file (tools/make_pairs.py writes it) is a query, its paraphrase and a
near miss that reads like the query but means something else (a flipped fact, another number, a
negation, swapped roles). Two scores, by cosine similarity, and the task's value is their mean:

- pairing: the query is closer to its paraphrase than to its own near miss (word overlap favours
  the near miss: all-MiniLM-L6-v2 in fp32 gets 24% right, below the 50% of a coin toss);
- retrieval: the paraphrase ranks first among every positive and near miss of the query's topic
  but its own near miss (about 45 sentences on the same subject; fp32 gets all of them).

fp32 scores 0.62; an embedding that has lost its meaning scores about 0.26 (pairing at chance,
retrieval near 1/45), so the value falls as quantization damages the model, and each item moves it
by a quarter of a point (189 items): small drops show.

The model is any callable(input_ids, attention_mask) -> [B, D] embedding (autoao.models.
SentenceEncoder). The first model a task scores is its reference (CallableEvaluator scores the
unmodified model first); every later call also reports agreement with the reference's embeddings
(`last_metrics`: mean cosine to the reference embedding, the share of queries whose top-ranked
sentence is the reference's, the share of pairing decisions the reference made, and the mean
absolute change of each item's pairing margin).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

TASKS = Path(__file__).parent / "tasks"
BATCH = 64  # sentences per forward (sorted by length: little padding)


def load_items(path: Path | None = None) -> list[dict[str, Any]]:
    """The task's items: {"topic", "query", "positive", "negatives"}."""
    path = path or TASKS / "autoao_pairs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bundled_sentences(*, held_out: bool) -> list[str]:
    """Sentences of autoao's bundled prose (autoao_text): its first half's documents, or (held_out)
    its second half's, as autoao.models.text_inputs splits them; sentences of at least four words."""
    docs = [json.loads(line)["text"] for line in (TASKS / "autoao_text.jsonl").read_text().splitlines() if line.strip()]
    half = len(docs) // 2
    part = docs[half:] if held_out else docs[:half]
    return [s.strip() for doc in part for s in re.split(r"(?<=[.!?])\s+", doc) if len(s.split()) >= 4]


def encode(tokenizer: Any, sentences: list[str], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """{"input_ids", "attention_mask"}: [B, T] padded to the longest sentence."""
    enc = tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    return {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)}


def embed(model: nn.Module, tokenizer: Any, sentences: list[str]) -> torch.Tensor:
    """[len(sentences), D] float32 unit embeddings, in the order given."""
    device = next(model.parameters()).device
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out: list[torch.Tensor | None] = [None] * len(sentences)
    with torch.no_grad():
        for s in range(0, len(order), BATCH):
            idx = order[s:s + BATCH]
            e = model(**encode(tokenizer, [sentences[i] for i in idx], device)).float()  # [b, D]
            e = torch.nn.functional.normalize(e, dim=-1).cpu()
            for j, i in enumerate(idx):
                out[i] = e[j]
    return torch.stack(out)  # type: ignore[arg-type]


class RetrievalTask:
    """callable(model) -> the mean of the pairing and retrieval accuracies (higher is better);
    `last_metrics` holds both and the agreement with the reference."""

    __name__ = "autoao_pairs"

    def __init__(self, tokenizer: Any, items: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.items = items if items is not None else load_items()
        if not self.items:
            raise ValueError("the retrieval task needs at least one item")
        # one list of unique sentences; queries and each topic's pool index into it
        self.sentences: list[str] = []
        index: dict[str, int] = {}

        def at(s: str) -> int:
            if s not in index:
                index[s] = len(self.sentences)
                self.sentences.append(s)
            return index[s]

        self.queries = [at(it["query"]) for it in self.items]
        self.positives = [at(it["positive"]) for it in self.items]
        self.negatives = [[at(n) for n in it["negatives"]] for it in self.items]
        topics: dict[str, set[int]] = {}
        for it, p, ns in zip(self.items, self.positives, self.negatives):
            topics.setdefault(it["topic"], set()).update([p, *ns])
        # retrieval pools: the topic's sentences but the query's own near misses
        self.pools = [sorted(topics[it["topic"]] - set(ns)) for it, ns in zip(self.items, self.negatives)]
        self.reference: torch.Tensor | None = None  # [S, D] the first scored model's embeddings
        self.reference_top: list[int] | None = None
        self.reference_margins: list[float] = []
        self.last_metrics: dict[str, float] = {}

    def _top(self, emb: torch.Tensor) -> list[int]:
        """For each query, the sentence of its retrieval pool ranked first (cosine)."""
        tops = []
        for q, pool in zip(self.queries, self.pools):
            sims = emb[pool] @ emb[q]  # [P]
            tops.append(pool[int(sims.argmax())])
        return tops

    def _margins(self, emb: torch.Tensor) -> list[float]:
        """For each item, cos(query, paraphrase) - max cos(query, own near miss): > 0 is a pairing hit."""
        return [float(emb[q] @ emb[p] - max(emb[q] @ emb[m] for m in ns))
                for q, p, ns in zip(self.queries, self.positives, self.negatives)]

    def scores(self, emb: torch.Tensor) -> dict[str, float]:
        """pairing and retrieval accuracy, and their mean, from [S, D] unit embeddings of `sentences`."""
        return self._scores(self._top(emb), self._margins(emb))

    def _scores(self, top: list[int], margins: list[float]) -> dict[str, float]:
        n = len(self.items)
        pairing = sum(m > 0 for m in margins) / n
        retrieval = sum(t == p for t, p in zip(top, self.positives)) / n
        return {"accuracy": (pairing + retrieval) / 2, "pairing": pairing, "retrieval": retrieval}

    def __call__(self, model: nn.Module) -> float:
        emb = embed(model, self.tokenizer, self.sentences)  # [S, D]
        top, margins = self._top(emb), self._margins(emb)
        if self.reference is None:
            self.reference, self.reference_top, self.reference_margins = emb, top, margins
        assert self.reference_top is not None
        ref = self.reference_margins
        self.last_metrics = {
            **self._scores(top, margins),
            "cosine_to_reference": float((emb * self.reference).sum(-1).mean()),
            "top1_agreement": sum(a == b for a, b in zip(top, self.reference_top)) / len(self.items),
            # the pairing decisions the reference made, made again; how far each item's margin moved
            "pairing_agreement": sum((a > 0) == (b > 0) for a, b in zip(margins, ref)) / len(self.items),
            "margin_error": sum(abs(a - b) for a, b in zip(margins, ref)) / len(self.items),
        }
        return self.last_metrics["accuracy"]
