"""Latency of one candidate on one layer shape, measured the way the model will run it.

CUDA (after triton.testing.do_bench's method): warm up (Triton compiles, cuBLAS picks its
algorithm), capture the call in a CUDA graph so launch gaps do not count, then for each repeat
zero a 256 MB buffer (flushes the 50-60 MB L2, so weights come from HBM as they would in a real
model that streams through its layers), record an event, replay, record an event. Report the
median and the 20th/80th percentiles. CPU: warm up, fixed thread count, median of wall-clock
repeats.

A candidate that raises, runs out of memory or returns NaN/Inf gets `inf` and the error string;
the caller goes on. Emulated candidates are timed and flagged; they are never a speed-up.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from autoao.search_space import Candidate, LayerSpec

L2_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    """One measurement. Times in microseconds; `inf` when the candidate failed (see `error`)."""

    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    emulated: str | None = None  # why this is only emulated on the device (never a speed-up)
    error: str | None = None  # why it failed (then the times are inf)

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.median_us)

    @classmethod
    def failed(cls, error: str) -> Timing:
        return cls(math.inf, math.inf, math.inf, 0, None, error)


def _quantiles(samples_us: list[float]) -> tuple[float, float, float]:
    s = sorted(samples_us)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return statistics.median(s), q[1], q[7]  # median, p20, p80


def time_cuda(fn: Callable[[], object], *, reps: int = 50, warmup: int = 3, graph: bool = True,
              flush_l2: bool = True) -> tuple[float, float, float]:
    """Median, p20, p80 in us of fn() on the current CUDA device (see the module docstring)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    call = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # graphs are captured on a side stream
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(g):
            fn()
        call = g.replay
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return _quantiles([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])


def time_cpu(fn: Callable[[], object], *, reps: int = 20, warmup: int = 2,
             threads: int | None = None) -> tuple[float, float, float]:
    """Median, p20, p80 in us of fn() on the CPU with a fixed thread count."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    finally:
        torch.set_num_threads(old)
    return _quantiles(samples)


def build_layer(cand: Candidate, k: int, n: int, dtype: torch.dtype, device: torch.device,
                bias: bool = False, seed: int = 0) -> nn.Module:
    """A random nn.Linear(k, n) on `device` turned into `cand`'s module (weights ~ N(0, 1/k))."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen, device=device, dtype=torch.float32).mul_(k ** -0.5))
    return cand.build(lin, fqn=f"{n}x{k}")


def time_module(module: nn.Module, m: int, k: int, dtype: torch.dtype, device: torch.device, *,
                compile: bool = False, reps: int | None = None, threads: int | None = None) -> Timing:
    """Time module(x) for x [m, k]; inf with the reason on failure or non-finite output."""
    device = torch.device(device)
    try:
        x = torch.randn(m, k, device=device, dtype=dtype)
        fn = torch.compile(module, fullgraph=True, dynamic=False) if compile else module
        with torch.no_grad():
            y = fn(x)
            if not torch.isfinite(y).all():
                return Timing.failed("output has NaN/Inf")
            if device.type == "cuda":
                med, p20, p80 = time_cuda(lambda: fn(x), reps=reps or 50)
            else:
                med, p20, p80 = time_cpu(lambda: fn(x), reps=reps or 20, threads=threads)
        return Timing(med, p20, p80, reps or (50 if device.type == "cuda" else 20))
    except torch.cuda.OutOfMemoryError as e:
        return Timing.failed(f"out of memory: {str(e).splitlines()[0]}")
    except Exception as e:  # noqa: BLE001 - a failing kernel is data, not a crash
        return Timing.failed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def time_candidate(cand: Candidate, m: int, k: int, n: int, dtype: torch.dtype = torch.bfloat16,
                   device: torch.device | str = "cpu", *, compile: bool = False,
                   reps: int | None = None, threads: int | None = None) -> Timing:
    """Latency of `cand` on an (m x k) @ (k x n) layer with random weights on `device`.

    Unsupported -> Timing.failed(reason); emulated -> timed, with Timing.emulated set."""
    device = torch.device(device)
    reason = cand.supports(LayerSpec("", k, n, False, dtype), device)
    if reason:
        return Timing.failed(f"unsupported: {reason}")
    try:
        module = build_layer(cand, k, n, dtype, device)
    except Exception as e:  # noqa: BLE001
        return Timing.failed(f"build failed: {type(e).__name__}: {e}")
    t = time_module(module, m, k, dtype, device, compile=compile, reps=reps, threads=threads)
    emulated = cand.emulated(device)
    return t if not emulated else Timing(t.median_us, t.p20_us, t.p80_us, t.reps, emulated, t.error)
