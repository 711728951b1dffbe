"""Timing one cell: a candidate's module on a random layer of one (N, K) shape, at each token count,
measured the way the model will run it. The harness; which cells to time, and when, is
evaluators.timing's policy.

CUDA (after triton.testing.do_bench's method): warm up (Triton compiles, cuBLAS picks its
algorithm), capture the call in a CUDA graph so launch gaps do not count, then for each repeat
read a 256 MB buffer (flushes the 50-60 MB L2 with clean lines, so weights come from HBM as they
would in a real model that streams through its layers), rewrite the layer's input (it is in L2 in
the real model: the previous op just wrote it), record an event, replay, record an event. Report
the median and the 20th/80th percentiles. CPU: wall clocks, a fixed thread count, and the layer
timed as a stream of copies whose weights exceed twice the last-level cache (streaming_copies).

A candidate that raises, runs out of memory or returns NaN/Inf gets `inf` and the error string;
the caller goes on. Emulated candidates are timed and flagged; they are never a speed-up.

    time_missing(cand, kernel, n, k, tokens, dtype, device, mode)   -> {M: Timing}
    time_module(module, m, k, dtype, device)                        -> Timing
    key_base(device, dtype, mode)                                   the machine's part of a cache key
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from autoao.clock import time_cpu, time_cuda
from autoao.common import __version__, triton_version
from autoao.evaluators.cache import Timing
from autoao.evaluators.latency import kernel_info
from autoao.kernels._base import canonical_on_device
from autoao.kernels.ops import cdiv
from autoao.search_space import Candidate, LayerSpec

# Part of every cache key: bump it when the measurement method or a kernel changes, so old timings
# are not reused. 5: CPU samples during which the process lost the CPU are dropped and re-taken.
# 13: the run-queue delay that judges a CPU sample is read through files kept open
# (clock._KeptFiles), so small cells' samples no longer pay for reading it.
HARNESS_VERSION = 13
# CPU sampling per cell and M: about CELL_SECONDS of samples, or COARSE_SECONDS in the first pass
# under a deadline (every cell coarsely before any is refined: measure_latencies); a candidate over
# SLOW_CUT x the baseline's time at a cell ends at one clean sample (int8_dyn on a 49152x576 LM head
# at M=256 takes 2.6 s a call on a 2-core CPU without VNNI: 5 samples of it were a third of a 90 s
# budget, to learn that it loses 3x; docs/measuring.md#cpu-timing), which no refinement changes (such a timing
# is not coarse).
CELL_SECONDS = 0.5
COARSE_SECONDS = 0.05
SLOW_CUT = 2.0


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (bytes), from sysfs; 32 MiB when it cannot be read."""
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            best = max(best, int(text.rstrip("KMG")) * {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1))
        except (OSError, ValueError):
            continue
    return best or 32 * 1024**2


def _module_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def streaming_copies(module: nn.Module, max_copies: int = 64) -> list[nn.Module]:
    """The module plus enough deep copies that their weights together exceed twice the last-level
    cache: timing them back to back streams weights from DRAM, as a model running through its layers
    does. (Timing one layer over and over measures its weights hot in cache: measured on a 2-core
    CPU without AMX, that predicted a SmolLM2 decode step at ~9 ms when it ran at ~36 ms; flushing
    the cache before each call instead overshot 2x, since it also evicts the TLB and idles the
    threads: docs/measuring.md#cpu-timing.)"""
    import copy

    n = max(1, min(max_copies, cdiv(2 * last_level_cache_bytes(), max(_module_bytes(module), 1))))
    return [module] + [copy.deepcopy(module) for _ in range(n - 1)]


def build_layer(cand: Candidate, k: int, n: int, dtype: torch.dtype, device: torch.device,
                bias: bool = False, seed: int = 0) -> nn.Module:
    """A random nn.Linear(k, n) on `device` turned into `cand`'s module (weights ~ N(0, 1/k))."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen, device=device, dtype=torch.float32).mul_(k ** -0.5))
    return cand.build(lin, fqn=f"{n}x{k}")


def time_module(module: nn.Module, m: int, k: int, dtype: torch.dtype, device: torch.device, *,
                compile: bool = False, graph: bool = True, reps: int | None = None,
                threads: int | None = None, max_seconds: float = CELL_SECONDS,
                stop_above_us: float | None = None,
                copies: Callable[[], list[nn.Module]] | None = None) -> Timing:
    """Time module(x) for x [m, k]; inf with the reason on failure or non-finite output.
    graph: on CUDA, replay a captured CUDA graph (False: time eager launches).
    max_seconds, stop_above_us: on the CPU, about how long to sample, and a time past which one
    clean sample ends the timing (see autoao.clock.time_cpu); a CPU timing sampled for less than
    CELL_SECONDS and not ended so is Timing.coarse. copies: the module's streaming copies when
    asked (a caller timing several M makes them once); default streaming_copies(module)."""
    device = torch.device(device)
    try:
        x_src = torch.randn(m, k, device=device, dtype=dtype)
        x = x_src.clone()  # [m, k]: the graph reads this buffer; priming rewrites it (into L2)
        fn = torch.compile(module, fullgraph=True, dynamic=False) if compile else module
        with torch.no_grad():
            t0 = time.perf_counter()
            y = fn(x)
            first_s = time.perf_counter() - t0
            if not torch.isfinite(y).all():
                return Timing.failed("output has NaN/Inf")
            if device.type == "cuda":
                med, p20, p80, n = time_cuda(lambda: fn(x), reps=reps or 50, graph=graph,
                                             prime=lambda: x.copy_(x_src))
                return Timing(med, p20, p80, n)
            streamed = [fn] if compile else copies() if copies is not None else streaming_copies(fn)
            return _cpu_timing([lambda c=c: c(x) for c in streamed], reps or 20, threads, max_seconds,
                               stop_above_us, first_s)
    except torch.cuda.OutOfMemoryError as e:
        return Timing.failed(f"out of memory: {str(e).splitlines()[0]}")
    except Exception as e:  # noqa: BLE001 - a failing kernel is data, not a crash
        return Timing.failed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _cpu_timing(calls: list[Callable[[], object]], reps: int, threads: int | None, max_seconds: float,
                stop_above_us: float | None, first_s: float) -> Timing:
    """time_module's CPU timing of a layer's warm `calls` (its streaming copies), first_s the
    seconds of the validation call just made; with more than one thread, capped or bounded by one
    thread's time where the samples cannot be trusted alone."""
    n_threads = threads or torch.get_num_threads()
    s = time_cpu(calls, reps=reps, threads=threads, max_seconds=max_seconds, stop_above_us=stop_above_us,
                 first_s=first_s)
    if s.cut and n_threads > 1:
        # Cut early (far behind the baseline), so a sample or two decide the cell. A thread stalled
        # at a barrier for a descheduled peer is not this process's lost CPU time, so a clean-looking
        # multi-threaded sample can be a stall (next to busy loops, int8_dyn 192x576 was cut at
        # 271 us, 84 us quiet: tests/test_load.py). One thread cannot stall so, and this slow a
        # kernel is no faster on one thread than on several: the cell is the lesser of the two, and
        # unreliable (re-timed by the next run) when one thread gave no clean sample either. The
        # calls are warm: no warm-up (a 49152x576 LM head's slow kernels take 0.1-0.4 s a call on
        # one thread), and a colder first call only keeps the several threads' time.
        one = time_cpu(calls, reps=1, threads=1, max_seconds=max_seconds / 2, warmup=0, min_samples=1)
        if not one.reliable:
            return Timing(s.median, s.p20, s.p80, s.reps, discarded=s.discarded + one.discarded,
                          reliable=False, threads=n_threads)
        if one.median < s.median:
            return Timing(one.median, one.median, one.median, 1, discarded=s.discarded + one.discarded,
                          threads=n_threads)
    single = None
    if not s.reliable and n_threads > 1:
        # a busy neighbour stalls every thread at each barrier; one thread runs undisturbed
        one = time_cpu(calls, reps=reps, threads=1, max_seconds=max_seconds / 2, warmup=1)
        single = one.median if one.reliable else None
    return Timing(s.median, s.p20, s.p80, s.reps, discarded=s.discarded, reliable=s.reliable,
                  single_us=single, threads=n_threads, coarse=max_seconds < CELL_SECONDS and not s.cut)


def device_name(device: torch.device) -> str:
    """What a timing depends on: the GPU model, or the CPU model and the thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    n = torch.get_num_threads()
    return f"{cpu} ({n} thread{'s' if n > 1 else ''})"


def default_mode(device: torch.device) -> str:
    """CUDA: "compile" (torch.compile(fullgraph=True), replayed in a CUDA graph): how a plan runs,
    and the ranking depends on it (inductor fuses the dequantizing casts of the weight-only paths).
    CPU: "eager"."""
    return "compile" if device.type == "cuda" else "eager"


def key_base(device: torch.device, dtype: torch.dtype, mode: str) -> dict[str, str]:
    """The TimingKey fields that belong to the machine and the software, not to the cell."""
    return dict(device=device_name(device), torch=torch.__version__, triton=triton_version() or "none",
                autoao=f"{__version__}/harness-{HARNESS_VERSION}", dtype=str(dtype).removeprefix("torch."), mode=mode)


class Layer:
    """`cand`'s module on a random (N, K) layer, built (quantized) once for all the kernels a cell
    times: each kernel re-packs the canonical tensors (QuantizedLinear.set_kernel), where building
    anew quantized again (0.3-0.9 s a kernel on a 49152x576 LM head on a 2-core CPU without AMX)."""

    def __init__(self, cand: Candidate, n: int, k: int, dtype: torch.dtype, device: torch.device) -> None:
        self.build = (cand, k, n, dtype, device)
        self.module: nn.Module | None = None

    def with_kernel(self, kernel: str | None) -> nn.Module:
        """The module, running `kernel` (None: the candidate's only one)."""
        with canonical_on_device():  # a module built to be timed: no host copy of its weights
            if self.module is None:
                self.module = build_layer(*self.build)
            if kernel is not None:
                self.module.set_kernel(kernel)
        return self.module


def time_missing(cand: Candidate, kernel: str | None, n: int, k: int, tokens: list[int], dtype: torch.dtype,
                  device: torch.device, mode: str, max_seconds: float = CELL_SECONDS,
                  stop_above_us: dict[int, float] | None = None, layer: Layer | None = None) -> dict[int, Timing]:
    """Build `cand` (with `kernel`) on a random (N, K) layer, or take it from `layer` (built once for
    a cell's kernels), and time it at each M in `tokens` (max_seconds, stop_above_us[M]: see
    time_module); failures become failed Timings with the reason."""
    reason = cand.supports(LayerSpec("", k, n, False, dtype), device)
    if reason:
        return {m: Timing.failed(f"unsupported: {reason}") for m in tokens}
    eager = single_op_tokens(cand, kernel, n, k, tokens, device, mode)
    try:
        module = (layer or Layer(cand, n, k, dtype, device)).with_kernel(kernel)
        fn = module
        if mode == "compile" and len(eager) < len(tokens):
            torch._dynamo.reset()  # one compiled module at a time: dynamo's caches stay small
            fn = torch.compile(module, fullgraph=True)  # compiles on its first call, per M it sees
        # the eager module's streaming copies, made once for every M (copying int8_dyn(act=tensor)'s
        # packed weights takes up to 0.5 s a shape on a 2-core CPU without AMX)
        copies = functools.cache(lambda mod=module: streaming_copies(mod))
        # compiled modules are captured in CUDA graphs too: that is how the model will run
        fresh = {m: time_module(module if m in eager else fn, m, k, dtype, device,
                                graph=device.type == "cuda" and mode != "eager", max_seconds=max_seconds,
                                stop_above_us=(stop_above_us or {}).get(m), copies=copies if fn is module else None)
                 for m in tokens}
    except Exception as e:  # noqa: BLE001
        fresh = {m: Timing.failed(f"build failed: {type(e).__name__}: {e}") for m in tokens}
    return {m: t.flagged(cand.emulated(device)) for m, t in fresh.items()}


def single_op_tokens(cand: Candidate, kernel: str | None, n: int, k: int, tokens: list[int],
                     device: torch.device, mode: str) -> set[int]:
    """The M in `tokens` at which a "compile"-mode timing on CUDA runs `cand`'s module with `kernel`
    (None: its only one) eagerly in a CUDA graph, not compiled: where its forward is one opaque op
    (KernelInfo.single_op), which torch.compile would only wrap. Each M a compiled module sees
    costs a compile (dynamo/inductor: 86 s of the 181 s timing stage of a cold llama8 2048+1 search
    on a datacenter GPU: docs/measuring.md#gpu-timing)."""
    if mode != "compile" or device.type != "cuda":
        return set()
    info = kernel_info(cand, device, kernel)
    return {m for m in tokens if info.single_op(m, n, k)}
