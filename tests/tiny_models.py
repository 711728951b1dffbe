"""Tiny models for CLI tests: `autoao search --model tests/tiny_models.py:build`."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """Embedding, 2 blocks of q/k/v/o and gate/up/down projections, a head: [B, T] ids -> [B, T, V]."""

    def __init__(self, vocab: int = 128, dim: int = 64, hidden: int = 128, n: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.ModuleDict({name: nn.Linear(i, o, bias=False) for name, i, o in [
            ("q_proj", dim, dim), ("k_proj", dim, dim), ("v_proj", dim, dim), ("o_proj", dim, dim),
            ("gate_proj", dim, hidden), ("up_proj", dim, hidden), ("down_proj", hidden, dim)]}) for _ in range(n))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)  # [B, T, D]
        for b in self.blocks:
            a = b["q_proj"](x) + 0.5 * b["k_proj"](x) + 0.25 * b["v_proj"](x)
            x = x + b["o_proj"](torch.tanh(a))
            x = x + b["down_proj"](torch.nn.functional.silu(b["gate_proj"](x)) * b["up_proj"](x))
        return self.head(x)


def build() -> dict:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return {"model": TinyLM().to(torch.bfloat16),
            "example_inputs": [torch.randint(0, 128, (1, 16), generator=g)],
            "eval_inputs": [torch.randint(0, 128, (2, 32), generator=g)]}


def with_bad_workload() -> dict:
    return {**build(), "workload": "generate"}


def broken():
    raise RuntimeError("this factory is broken on purpose")
