"""End-to-end latency of a whole model: the ground truth the per-layer timings' predictions are
compared with (evaluators/timing.py times the layers). One forward of the model on one input, on
CUDA captured in a CUDA graph and replayed, on the CPU wall clocks through autoao.clock.time_cpu.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from autoao.clock import time_cpu, time_cuda
from autoao.common import call_model
from autoao.evaluators.cache import Timing


def measure_model(model: nn.Module, example_input, *, compile: bool = False, graph: bool | None = None,
                  reps: int | None = None, warmup: int = 2, max_seconds: float = 3.0) -> Timing:
    """End-to-end latency of one forward of `model` on `example_input` (one input, by
    `autoao.profile`'s convention: tensor, tuple of args, or dict of kwargs): the ground truth that
    predicted plan latencies are compared with.

    compile: torch.compile(model) first (as the model will run). graph: on CUDA, capture the
    forward in a CUDA graph and time replays (default True; set False for models that cannot be
    captured). L2 is flushed before each repeat, as for layer timings. Failures score inf.
    max_seconds: on the CPU, about how long to sample (autoao.clock.time_cpu); with reps=1 and
    max_seconds=0, exactly one sample, disturbed or not.
    """
    params = list(model.parameters()) + list(model.buffers())
    device = params[0].device if params else torch.device("cpu")
    fn = torch.compile(model) if compile else model
    try:
        with torch.no_grad():
            if device.type == "cuda":
                call_model(fn, example_input)  # compiles
                med, p20, p80, n = time_cuda(lambda: call_model(fn, example_input), reps=reps or 30,
                                             graph=True if graph is None else graph, max_seconds=1.0)
                return Timing(med, p20, p80, n)
            first_s = None
            if warmup:  # the first call is one warm-up (time_cpu: a slow one is the whole warm-up)
                t0 = time.perf_counter()
                call_model(fn, example_input)
                first_s = time.perf_counter() - t0
            # warmup=0 from the caller: it alternates warm models, one clean sample each (see time_cpu)
            s = time_cpu(lambda: call_model(fn, example_input), reps=reps or 10, max_seconds=max_seconds,
                         warmup=max(warmup - 1, 0), min_samples=reps or 5, first_s=first_s)
    except Exception as e:  # noqa: BLE001
        return Timing.failed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return Timing(s.median, s.p20, s.p80, s.reps, discarded=s.discarded, reliable=s.reliable)
