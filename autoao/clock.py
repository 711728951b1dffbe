"""Timing one callable: the measurement primitives every layer of autoao may use (kernel tuners,
layer timing, end-to-end measurement). Imports nothing from autoao.

CUDA (after triton.testing.do_bench's method): warm up, capture the call in a CUDA graph so launch
gaps do not count, then for each repeat read a 256 MB buffer (flushes the 50-60 MB L2 with clean
lines), optionally re-prime what the real model would have in L2, record an event, replay, record
an event. CPU: wall clocks at a fixed thread count. Both report (median, p20, p80 in us, repeats).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Callable, Iterable, NamedTuple, Sequence, TypeVar

import torch

from autoao.types import t_quantile

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
    a datacenter GPU, ranked this way in 0.793 ms; docs/measuring.md#gpu-timing.)"""
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


class CpuSamples(NamedTuple):
    """A CPU timing: quantiles (us) of the clean samples, and how trustworthy they are."""

    median: float
    p20: float
    p80: float
    reps: int  # clean samples the quantiles come from (single calls, for a sequence of callables)
    discarded: int  # samples taken but dropped because the process lost the CPU during them
    reliable: bool  # at least MIN_CLEAN clean samples; else the quantiles are the least-disturbed ones'
    cut: bool = False  # a clean sample slower than stop_above_us ended the sampling early


# A sample "lost the CPU" when the process's threads waited on a run queue (another process had
# their core) for more than this fraction of its wall time, or the cgroup throttled the process
# during it. Wall time then measures the other process, not the kernel: on a 2-core VM with a
# busy neighbour, whole 4 ms scheduler quanta land in samples of a 40 us layer.
LOST_FRACTION = 0.05
MIN_CLEAN = 5
# Samples at least this long need only LONG_MIN_CLEAN clean ones: a call of 50+ ms is compute- or
# bandwidth-bound and many scheduler ticks long, so its run-to-run spread is small next to what
# it costs (a bf16 LM head at 256 rows takes 0.8 s a call on a 2-core CPU without AVX-512:
# docs/measuring.md#cpu-timing).
LONG_SAMPLE_S = 0.05
LONG_MIN_CLEAN = 3
RETAKE_FACTOR = 4  # samples and seconds allowed for re-takes, as a multiple of what was asked


def time_cpu(fn: Callable[[], object] | Sequence[Callable[[], object]], *, reps: int = 20, warmup: int = 2,
             threads: int | None = None, max_seconds: float = 0.5, min_samples: int = MIN_CLEAN,
             stop_above_us: float | None = None, first_s: float | None = None) -> CpuSamples:
    """Quantiles (us) of fn() on the CPU at a fixed thread count, from samples during which the
    process kept the CPU. A sequence of callables is sampled one call at a time in turn (a layer's
    copies, so its weights stream from DRAM as in a model): short samples are the ones a busy
    neighbour leaves alone.

    warmup: rounds over the sequence run untimed first; the warm-up ends early, after any call,
    once it has taken max_seconds / 4 (a slow call is warm after one). first_s: the seconds of a
    call the caller has just made (a validation call): one slower than that allowance was the
    warm-up, and sets the sample count.
    Samples: about `max_seconds` of timed work (at most `reps` rounds over the sequence), and at
    least `min_samples` clean ones (LONG_MIN_CLEAN for calls over LONG_SAMPLE_S); the count is
    set from the last warm-up call, or from the first sample when warmup=0 (a caller that
    alternates two warm models takes reps=1, min_samples=1: one sample per side per round).
    Disturbed samples are dropped and re-taken within RETAKE_FACTOR x the count and the seconds.
    stop_above_us: one clean sample slower than this ends the timing (a candidate that far behind
    the baseline will not be picked; its one sample is its time, reps=1).
    Too few clean samples: `reliable` is False and the quantiles are those of the least-disturbed
    samples."""
    calls = list(fn) if isinstance(fn, Sequence) else [fn]
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        slow_first = first_s is not None and first_s > max_seconds / 4
        per_call = first_s if slow_first else _warm(calls, warmup, max_seconds / 4)
        clean, dirty, floor = _sample(calls, per_call, reps * len(calls), max_seconds, min_samples, stop_above_us)
    finally:
        torch.set_num_threads(old)
    if clean and len(clean) >= floor:
        cut = stop_above_us is not None and clean[-1] > stop_above_us  # (the sampling stops at such a sample)
        return CpuSamples(*_quantiles(clean), len(clean), len(dirty), True, cut)
    # Not enough clean samples: the least disturbed ones, clean first, are the best estimate there is.
    best = clean + [us for _, us in sorted(dirty)][:max(floor - len(clean), 1)]
    return CpuSamples(*_quantiles(best), len(clean), len(dirty), False)


def _sample(calls: list[Callable[[], object]], per_call: float | None, rounds: int, max_seconds: float,
            min_samples: int, stop_above_us: float | None) -> tuple[list[float], list[tuple[float, float]], int]:
    """time_cpu's samples, one call at a time in turn: (clean samples in us, disturbed ones as (lost
    fraction, us), the clean samples needed). The count comes from `per_call` (seconds of a warm
    call; None: from the first sample); disturbed samples are re-taken within RETAKE_FACTOR x the
    count and the seconds; a clean sample over stop_above_us ends the sampling (needing just it)."""
    floor, wanted = (min_samples, max(min_samples, rounds)) if per_call is None else \
        _counts(per_call, rounds, max_seconds, min_samples)
    clean: list[float] = []
    dirty: list[tuple[float, float]] = []  # (lost fraction, us)
    deadline = time.perf_counter() + RETAKE_FACTOR * max(max_seconds, 1e-3)
    while len(clean) < wanted and len(clean) + len(dirty) < RETAKE_FACTOR * wanted:
        call = calls[(len(clean) + len(dirty)) % len(calls)]
        throttled0 = throttled_ns()  # read outside the run-queue delay's window, which is the sample's
        lost0 = cpu_lost_ns()
        t0 = time.perf_counter_ns()
        call()
        wall = time.perf_counter_ns() - t0
        lost = cpu_lost_ns() - lost0
        throttled = throttled_ns() - throttled0
        if per_call is None:  # nothing warmed up: the first sample sets the count
            per_call = wall / 1e9
            floor, wanted = _counts(per_call, rounds, max_seconds, min_samples)
        if lost <= LOST_FRACTION * wall and throttled == 0:
            clean.append(wall / 1e3)
            if stop_above_us is not None and wall / 1e3 > stop_above_us:
                return clean, dirty, 1
        else:
            dirty.append((max(lost, throttled) / max(wall, 1), wall / 1e3))
        if time.perf_counter() > deadline and len(clean) + len(dirty) >= floor:
            break
    return clean, dirty, floor


def _counts(per_call: float, most: int, max_seconds: float, min_samples: int) -> tuple[int, int]:
    """(clean samples needed, samples wanted) for calls of `per_call` seconds: what fits in
    `max_seconds`, at most `most`, at least the floor."""
    floor = min(min_samples, LONG_MIN_CLEAN) if per_call >= LONG_SAMPLE_S else min_samples
    return floor, max(floor, min(most, int(max_seconds / max(per_call, 1e-9))))


def _warm(calls: list[Callable[[], object]], rounds: int, max_seconds: float) -> float | None:
    """Run `rounds` rounds over `calls` untimed, stopping after any call once `max_seconds` have
    passed; the last call's seconds (None when nothing ran)."""
    last = None
    t_start = time.perf_counter()
    for _ in range(rounds):
        for call in calls:
            t0 = time.perf_counter()
            call()
            last = time.perf_counter() - t0
            if t0 + last - t_start > max_seconds:
                return last
    return last


def cpu_lost_ns() -> int:
    """Nanoseconds this process's threads have spent runnable but waiting for a CPU (the run-queue
    delay in /proc/self/task/*/schedstat); 0 where the kernel does not report it."""
    return cpu_ran_lost_ns()[1]


def cpu_ran_lost_ns() -> tuple[int, int]:
    """(ran, lost): nanoseconds this process's threads have run on a CPU, and spent runnable but
    waiting for one (the first two fields of /proc/self/task/*/schedstat); (0, 0) where the kernel
    does not report them. Over a window, (ran + lost) / ran is how much slower CPU-bound work ran
    than on a machine of its own, whatever the thread count or the time spent idle."""
    ran = lost = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0, 0
    _KEPT.forget_except({f"/proc/self/task/{tid}/schedstat" for tid in tasks}, "/proc/self/task/")
    for tid in tasks:
        try:
            fields = _KEPT.read(f"/proc/self/task/{tid}/schedstat").split()
            ran, lost = ran + int(fields[0]), lost + int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended, or no schedstat
    return ran, lost


def throttled_ns() -> int:
    """Nanoseconds the process's cgroup has been throttled by its CPU quota (cgroup v2 cpu.stat's
    throttled_usec, or v1's cpu/cpu.stat throttled_time); 0 where neither exists."""
    for path, key, scale in (("/sys/fs/cgroup/cpu.stat", b"throttled_usec", 1000),
                             ("/sys/fs/cgroup/cpu/cpu.stat", b"throttled_time", 1)):
        try:
            for line in _KEPT.read(path).splitlines():
                name, _, value = line.partition(b" ")
                if name == key:
                    return int(value) * scale
        except (OSError, ValueError):
            continue
    return 0


class _KeptFiles:
    """/proc and /sys files kept open and read again with os.pread: about 1 us a file, where opening
    each anew took 5-15 us. _sample reads every thread's schedstat before and after each sample;
    opened anew, those reads took 150-340 us a sample (4-12 threads) next to a 50 us layer call on a
    2-core CPU without AMX, the samples themselves ran 15-19% slower (bf16 192x576 at M=1: a median of 55-58 us
    against 47-49 us, in alternating blocks on a quiet machine), and run-queue delay anywhere in
    that wider window was charged to the sample."""

    def __init__(self) -> None:
        # path -> open fd, or _MISSING. No lock (the main thread reads the clock; a lock held at a
        # fork would hang the child): two threads at once can at worst lose one reading.
        self._fds: dict[str, int] = {}

    def read(self, path: str) -> bytes:
        """The file's contents now (OSError where it cannot be read: an ended thread's is closed)."""
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._fds[path] = _MISSING  # (a cgroup v1 machine has no v2 file: not looked for again)
                raise
        if fd == _MISSING:
            raise FileNotFoundError(path)
        try:
            return os.pread(fd, 4096, 0)
        except OSError:
            self._forget(path)
            raise

    def forget_except(self, keep: set[str], prefix: str) -> None:
        """Close the kept files under `prefix` not in `keep` (threads that ended)."""
        for path in [p for p in self._fds if p.startswith(prefix) and p not in keep]:
            self._forget(path)

    def _forget(self, path: str) -> None:
        fd = self._fds.pop(path, _MISSING)
        if fd != _MISSING:
            try:
                os.close(fd)
            except OSError:
                pass  # closed by another thread's _forget


_MISSING = -1  # a kept path that does not exist
_KEPT = _KeptFiles()


##### how sure a measured speed-up is ###########################################################

class PairedSpeedup(NamedTuple):
    """A speed-up from rounds in which A and B ran back to back: per round r = A / B."""

    estimate: float  # exp(mean log r): the geometric mean of the rounds' ratios
    low: float  # the one-sided 95% lower confidence bound of that mean (0.0 with one round)
    high: float  # the one-sided 95% upper bound (inf with one round)
    rounds: int


def paired_speedup(a_us: Sequence[float], b_us: Sequence[float]) -> PairedSpeedup:
    """How much faster B is than A, from paired samples (a_us[i], b_us[i]) taken in the same round.

    Student's t on the rounds' log ratios: pairing cancels what moves both sides alike (a neighbour
    that slows a whole round), and the bound widens with what does not. A round disturbed on one
    side only widens the interval: it can keep a plan unchanged but never make one look faster.
    (Asking for B faster in every round instead makes a modest gain a coin toss that more rounds
    only lose: on a quiet 2-core CPU with AMX the bf16 demo workload measured 2.1 to 2.8 s in
    consecutive rounds, and one plan's per-round ratios spread from 1.11x to 2.06x;
    docs/measuring.md#the-final-comparison.)"""
    logs = [math.log(a / b) for a, b in zip(a_us, b_us)]
    n = len(logs)
    if n == 0:
        raise ValueError("paired_speedup needs at least one (a, b) round")
    mean = statistics.fmean(logs)
    if n == 1:
        return PairedSpeedup(math.exp(mean), 0.0, math.inf, 1)
    half = t_quantile(0.95, n - 1) * statistics.stdev(logs) / math.sqrt(n)  # one-sided 95%
    return PairedSpeedup(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)
