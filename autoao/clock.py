"""Timing one callable: the measurement primitives every layer of autoao may use (kernel tuners,
layer timing, end-to-end measurement). Imports nothing from autoao.

CUDA (after triton.testing.do_bench's method): warm up, capture the call in a CUDA graph so launch
gaps do not count, then for each repeat read a 256 MB buffer (flushes the 50-60 MB L2 with clean
lines), optionally re-prime what the real model would have in L2, record an event, replay, record
an event. CPU: wall clocks at a fixed thread count. Both report (median, p20, p80 in us, repeats).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable, TypeVar

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024


def _warm_up(fn: Callable[[], object], warmup: int, reps: int, max_seconds: float,
             sync: Callable[[], object]) -> int:
    """Run fn `warmup` times, time one more call, and return how many repeats fit in about
    `max_seconds` (at least 5, at most `reps`)."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return max(5, min(reps, int(max_seconds / max(time.perf_counter() - t0, 1e-6))))


def _quantiles(samples_us: list[float]) -> tuple[float, float, float]:
    s = sorted(samples_us)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return statistics.median(s), q[1], q[7]  # median, p20, p80


def time_cuda(fn: Callable[[], object], *, reps: int = 50, warmup: int = 3, graph: bool = True,
              flush_l2: bool = True, max_seconds: float = 0.3,
              prime: Callable[[], object] | None = None) -> tuple[float, float, float, int]:
    """(median, p20, p80 in us, repeats) of fn() on the current CUDA device (module docstring).

    Repeats are capped so the timed loop takes about `max_seconds` (at least 5 repeats): a kernel
    that takes 75 ms (int4 tinygemm at M=2048 on a 128256-wide layer) need not be run 50 times to
    know it loses."""
    reps = _warm_up(fn, warmup, reps, max_seconds, torch.cuda.synchronize)
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
    # Flush by *reading* 256 MB: L2 ends up full of clean lines, so the timed kernel does not pay
    # for writing back dirty flush data (zeroing the buffer, as do_bench does, leaves 50+ MB of dirty
    # lines behind). `prime` then puts what the real model would have in L2 (the layer's input,
    # just written by the previous op) back in.
    flush = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.sum()
        if prime is not None:
            prime()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return (*_quantiles([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]), reps)


def tuning_us(fn: Callable[[], object]) -> float:
    """Median us of fn() as the in-process kernel tuners rank their options (the Triton GEMVs'
    launch configs, cuSPARSELt's algorithms): 20 runs, no graph, L2 flushed by a *read* before
    each. (triton's do_bench flushes by zeroing: the write-back of those dirty lines lands on the
    timed kernel: ranked that way, the int4 GEMV configs ran llama8's decode step in 1.092 ms on
    the H200, ranked this way in 0.793 ms; benchmarks/README.md.)"""
    return time_cuda(fn, reps=20, graph=False, max_seconds=0.05)[0]


_Option = TypeVar("_Option")


def fastest(options: Iterable[_Option], run: Callable[[_Option], Callable[[], object] | None],
            skip: tuple[type[BaseException], ...] = ()) -> _Option | None:
    """The in-process kernel tuners' choice: the option whose `run(option)` (a zero-argument call
    that launches it) takes the least `tuning_us`. An option is passed over when run returns None
    (it does not apply, or gave wrong numbers) or run or the timing raises one of `skip` (it does
    not compile or launch on this problem). None when no option ran."""
    best, best_us = None, float("inf")
    for option in options:
        try:
            fn = run(option)
            if fn is None:
                continue
            us = tuning_us(fn)
        except skip:
            continue
        if us < best_us:
            best, best_us = option, us
    return best


def time_cpu(fn: Callable[[], object], *, reps: int = 20, warmup: int = 2, threads: int | None = None,
             max_seconds: float = 0.5) -> tuple[float, float, float, int]:
    """(median, p20, p80 in us, repeats) of fn() on the CPU with a fixed thread count; repeats are
    capped at about `max_seconds` of timed work (at least 5)."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        reps = _warm_up(fn, warmup, reps, max_seconds, lambda: None)
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    finally:
        torch.set_num_threads(old)
    return (*_quantiles(samples), reps)
