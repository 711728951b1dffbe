"""Tiny models whose trials take a set time, for the tests of several processes on one study:
`autoao search --model tests/slow_models.py:build`.

A trial is the proxy's forward on the held-out inputs ([16, 32] ids: the 512 positions `autoao search`
asks of the screen by default, so the judges score them and build no others) with quantized layers in the model; only
that forward is slowed (profiling, the proxy's reference and end-to-end timing, on [1, 16] ids or
the unchanged model, and the verdicts' other inputs, stay fast). Environment variables, read at each forward:
  AUTOAO_TEST_TRIAL_SLEEP  seconds each such forward sleeps (every process)
  AUTOAO_TEST_STALL_FILE   a path: the first `autoao worker` process to reach such a forward creates
                           it, writes its pid there, and sleeps for good (a worker to SIGKILL mid-trial);
                           until it exists, the coordinator (`autoao search`) waits in its own first such
                           forward, so it cannot spend the study's budget before a worker has stalled
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by file path: tiny_models beside it
from tiny_models import TinyLM  # noqa: E402


EVAL_SHAPE = (16, 32)


class SlowTinyLM(TinyLM):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if tuple(ids.shape) == EVAL_SHAPE and any(type(m) is not nn.Linear for b in self.blocks for m in b.values()):
            _stall_once()
            time.sleep(float(os.environ.get("AUTOAO_TEST_TRIAL_SLEEP", "0")))
        return super().forward(ids)


def _stall_once() -> None:
    path = os.environ.get("AUTOAO_TEST_STALL_FILE")
    if not path:
        return
    if sys.argv[1:2] == ["search"]:  # the coordinator (python -m autoao.cli search ...)
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    if sys.argv[1:2] != ["worker"]:
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another worker is the one that stalls
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(3600)


def _inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"example_inputs": [torch.randint(0, 128, (1, 16), generator=g)],
            "eval_inputs": [torch.randint(0, 128, EVAL_SHAPE, generator=g)]}


def build() -> dict:
    torch.manual_seed(0)
    return {"model": SlowTinyLM(n=1).to(torch.bfloat16), **_inputs()}


def other() -> dict:
    """Another model (other weights), the same inputs: a worker started on it must be refused."""
    torch.manual_seed(7)
    return {"model": SlowTinyLM(n=1).to(torch.bfloat16), **_inputs()}
