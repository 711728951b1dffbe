"""int4 weight-only GEMV on tensor cores in CUDA C++ (kernels/cuda/int4_mma.cu): the "cuda" kernel
of Int4WeightOnlyLinear, for M <= 8 rows (more rows: its dequantizing kernel, then one bf16 GEMM).

Why a CUDA kernel next to the Triton ones: on a datacenter GPU the Triton int4 GEMVs stream weights at
~2 TB/s (CUDA-core kernels issue ~3 instructions per nibble; Triton's tensor-core kernel passes x
and each weight tile through shared memory with CTA barriers), about half the bandwidth roofline
(docs/kernels.md#int4_wo). Here each lane's 16-byte weight load *is*
its mma.m16n8k16 A-operand registers for four k-steps (the layout pack_mma makes), nibbles become
bf16 by LOP3s, and nothing touches shared memory until the warps of a CTA add their partial sums
(the .cu file's header has the details). Two numbers per layer N x K at M rows: bytes = N*K/2 +
4*N*K/g (scales and zeros) + 2*M*(K + N); FLOPs = 2*M*N*K. Measured on a datacenter GPU
(docs/kernels.md#int4_wo): 1.3-1.5x faster than the Triton int4 kernels on llama8's layers at
M=1, 56-83% of roofline on the large ones, and M=8 costs what M=1 does; deeper register rings, a
cp.async shared-memory ring, a persistent stream-K schedule and 1-D bulk copies all measured
slower (docs/kernels.md#int4_wo).

On sm_90+ each launch uses programmatic dependent launch (it may start while the previous kernel
finishes and waits for it before reading x; llama8 M=1: 0.632 -> 0.620 ms; inside CUDA graph
capture its first weight loads go out before that wait: 0.596 -> 0.592) and the last wave of
CTAs prefetches the first 8 MB of the next int4 layer's weights into L2 (the module passes them:
kernels.int4.link_prefetch; 8 MB measured ~0.01 ms faster, more was slower). LaunchOptions holds
these three choices; they are part of every timing's cache key.

What limits it (docs/kernels.md#the-gpus-ceilings): a read-only kernel over the same bytes streams at
~4.36 TB/s + 1.1 us per launch, and its bandwidth grows with warps per SM, not with loads in
flight per warp; the GEMV's math costs registers, hence warps. So the configs include
register-capped ones (min_blocks: __launch_bounds__ minimum CTAs per SM, one-unit rings), which
the tuner picks on the large layers (gate/up 21.0 -> 20.2 us, lm_head 81 -> 79).

Building: the .cu file ships with the package and is compiled on first use with the CUDA toolkit's
nvcc (PATH, $CUDA_HOME or /usr/local/cuda) for the GPU's architecture (sm_80 or newer: bf16 mma),
one shared library per group size, cached under autoao's cache directory keyed by the source's
hash; it is called through ctypes on torch's current stream (so CUDA graphs capture it) and
registered as the custom op `autoao::int4_gemv_cuda` (opaque to torch.compile). Where nvcc or a
suitable GPU is missing, packing raises RuntimeError saying so, and timing records the kernel as
failed (it is then never chosen).

Layouts (made from autoao's canonical int4 tensors, see the .cu header):
  qw [N/16, K/64, 32, 4] int32: per 16-row tile and 64-k chunk, each lane's four A-operand words;
  sz [N/16, K/UK, 8, GU, 2] int32: (bf16 scale | bf16 zero << 16) per row and group, UK = max(g, 64)
  and GU = UK / g, in the order each lane reads them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from autoao.clock import fastest  # L2 flushed by a read, as the model meets the layer
from autoao.kernels import cuda_build
from autoao.kernels.ops import EAGER

MAX_ROWS = 8  # tokens per call: the mma's B operand has 8 columns
GROUP_SIZES = (32, 64, 128)  # one library each (-DAUTOAO_GROUP)
_SOURCE = Path(__file__).with_name("cuda") / "int4_mma.cu"
# lane (g, t) word j: nibble bit positions for row offset ro (0: row g, 1: row g + 8) and k offset
# e = 0..3 (k = 64c + 32(j // 2) + 8t + 4(j % 2) + e)
_SHIFTS = ((0, 16, 8, 24), (4, 20, 12, 28))


def unit_k(group_size: int) -> int:
    """k per unit of the kernel's loop: whole groups and whole 64-k chunks."""
    return max(group_size, 64)


def unsupported(n: int, k: int, group_size: int) -> str | None:
    """Why the kernel cannot run an N x K layer with this group size (None: it can)."""
    if group_size not in GROUP_SIZES:
        return f"group_size {group_size} (the CUDA int4 kernel is built for 32, 64, 128)"
    if n % 16:
        return f"out_features {n} is not a multiple of 16 (the mma tile's rows)"
    if k % unit_k(group_size):
        return f"in_features {k} is not a multiple of {unit_k(group_size)} (64-k chunks of whole groups)"
    return None


def pack_mma(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] integer values 0..15 (unpacked), scales/zeros [N, K/g] bf16 -> (qw, sz) in the
    kernel's layouts (module docstring), on q's device. Raises ValueError for shapes the kernel
    cannot run (unsupported)."""
    n, k = q.shape
    problem = unsupported(n, k, group_size)
    if problem:
        raise ValueError(f"pack_mma: {problem}")
    # [N, K] -> [T, ro, g, c, h, t, s, e] (row 16T + 8ro + g, k = 64c + 32h + 8t + 4s + e)
    # -> [T, c, g, t, h, s, ro, e]; the (ro, e) nibbles of a word are summed at their bit positions
    q8 = q.to(torch.int64).reshape(n // 16, 2, 8, k // 64, 2, 4, 2, 4).permute(0, 3, 2, 5, 4, 6, 1, 7)
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=q.device)
    words = (q8 << shifts).sum(dim=(-2, -1))  # [T, c, g, t, h, s], 0 .. 2**32 - 1
    qw = (words - (words >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32).reshape(n // 16, k // 64, 32, 4)
    uk = unit_k(group_size)
    pair = (zeros.view(torch.int16).to(torch.int32) << 16) | (scales.view(torch.int16).to(torch.int32) & 0xFFFF)
    # [N, K/g] -> [T, ro, g, u, i] (row 16T + 8ro + g, group u * GU + i) -> [T, u, g, i, ro]
    sz = pair.reshape(n // 16, 2, 8, k // uk, uk // group_size).permute(0, 3, 2, 4, 1).contiguous()
    return qw.contiguous(), sz


def unpack_mma(qw: torch.Tensor, sz: torch.Tensor, group_size: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of pack_mma: (q [N, K] int32 0..15, scales [N, K/g] bf16, zeros [N, K/g] bf16)."""
    tiles, chunks = qw.shape[:2]
    n, k = tiles * 16, chunks * 64
    words = qw.to(torch.int64).reshape(tiles, chunks, 8, 4, 2, 2) & 0xFFFFFFFF  # [T, c, g, t, h, s]
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=qw.device)
    q = (words[..., None, None] >> shifts) & 15  # [T, c, g, t, h, s, ro, e]
    q = q.permute(0, 6, 2, 1, 4, 3, 5, 7).reshape(n, k).to(torch.int32)
    pair = sz.permute(0, 4, 2, 1, 3).reshape(n, k // group_size)  # [T, ro, g, u, i] -> [N, K/g]
    scales = (pair & 0xFFFF).to(torch.int16).view(torch.bfloat16)
    zeros = (pair >> 16).to(torch.int16).view(torch.bfloat16)
    return q, scales, zeros


def dequantize_mma(qw: torch.Tensor, sz: torch.Tensor, group_size: int, dtype: torch.dtype = torch.bfloat16
                   ) -> torch.Tensor:
    """The [N, K] weight (q - 8) * scale + zero, in `dtype`, from the kernel's layouts, in plain
    torch ops (the reference of int4_dequant_cuda; any device)."""
    q, scales, zeros = unpack_mma(qw, sz, group_size)
    n, k = q.shape
    w = (q.float() - 8).reshape(n, k // group_size, group_size) * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(n, k).to(dtype)


##### build and load ###########################################################################

_WHAT, _INSTEAD = "the CUDA int4 kernel", "use int4's 'triton' or 'tinygemm' kernel"
_LIBS: dict[tuple[int, int | None], ctypes.CDLL] = {}  # (group size, device index) -> loaded library


def _build(group_size: int, arch: str) -> Path:
    """The shared library for `group_size` on sm_`arch` (cuda_build.build)."""
    return cuda_build.build(_SOURCE, [f"-DAUTOAO_GROUP={group_size}"], f"int4_mma_g{group_size}", arch, _WHAT, _INSTEAD)


def library(group_size: int, device: torch.device | str | int | None = None) -> ctypes.CDLL:
    """The kernel built for `group_size` and the GPU's architecture (`device`: a CUDA device, or
    its index), compiled with nvcc on first use and cached on disk; raises RuntimeError naming
    what is missing. The first build compiles every group size at once (parallel nvcc processes,
    ~5 s: a search times all three). Every launch calls this with the device's index: after the
    first, one dict lookup and no device object."""
    index = device if isinstance(device, int) or device is None else torch.device(device).index
    key = (group_size, index)
    lib = _LIBS.get(key)
    if lib is not None:
        return lib
    if not torch.cuda.is_available():
        raise RuntimeError("the CUDA int4 kernel needs a CUDA device")
    arch = cuda_build.mma_arch(device, _WHAT)
    cuda_build.nvcc(_WHAT, _INSTEAD)  # a missing toolkit is one clear error, not one per thread
    others = [g for g in GROUP_SIZES if g != group_size]
    with concurrent.futures.ThreadPoolExecutor(len(GROUP_SIZES)) as pool:  # nvcc runs in subprocesses
        builds = [pool.submit(_build, g, arch) for g in [group_size, *others]]
        out = builds[0].result()
        for b in builds[1:]:  # the others are a head start only: their own first use reports errors
            b.exception()
    lib = ctypes.CDLL(str(out))
    lib.autoao_int4_mma_gemv.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 3 + [ctypes.c_longlong] + \
        [ctypes.c_int] * 5 + [ctypes.c_void_p, ctypes.c_longlong] * 2 + [ctypes.c_int] * 2 + [ctypes.c_void_p]
    lib.autoao_int4_mma_gemv.restype = ctypes.c_int
    lib.autoao_int4_mma_dequant.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_void_p]
    lib.autoao_int4_mma_dequant.restype = ctypes.c_int
    lib.sm90 = int(arch) >= 90  # griddepcontrol and bulk prefetches exist from sm_90
    _LIBS[key] = lib
    return lib


##### launch configurations ####################################################################

@dataclass(frozen=True)
class Config:
    rows: int  # 16-row tiles per warp (RT)
    warps: int  # warps per CTA, splitting K (KW)
    chunks: int  # 64-k chunks of weights in flight per warp while a unit is computed (CIF; 0: none)
    split: int = 1  # CTAs splitting K per column block (partials added by the last to finish)
    min_blocks: int = 1  # CTAs per SM the registers must allow (__launch_bounds__): warps per SM


# What the tuner times: every config that was fastest on at least one cell of a datacenter GPU's table of all
# 52 earlier ones (13 instantiations x split-K 1/2/4/8) on llama8's and SmolLM2's 14 weight shapes
# x M = 1, 8 x group 32/64/128 (docs/kernels.md#int8_wo-and-fp8_wo-the-triton-weight-only-gemvs).
CONFIGS = (Config(1, 8, 2, 1, 1), Config(1, 8, 0, 1, 4), Config(1, 2, 0, 1, 16), Config(1, 4, 0, 1, 8),
           Config(1, 8, 2, 1, 4), Config(1, 8, 0, 2, 4), Config(1, 8, 0, 4, 4), Config(1, 4, 0, 4, 8),
           Config(2, 8, 2, 1, 1), Config(1, 8, 2, 4, 4), Config(2, 8, 2, 4, 1))
# int4_mma.cu instantiates each (rows, warps, chunks, min_blocks) of these (AUTOAO_CONFIGS; split-K
# is a launch parameter).
_DEFAULT = Config(1, 8, 0, 1, 4)  # the table's best single config (at most 1.42x the best, 1.07x on average)
_TUNED: dict[tuple, Config] = {}


##### launch options ###########################################################################

@dataclass(frozen=True)
class LaunchOptions:
    """How each launch of the GEMV uses sm_90+ features (earlier GPUs have none of them and ignore
    all three). They change its speed, never its numbers, so a timing taken under one setting must
    not stand for another: int4's "cuda" KernelInfo carries `tag()` as its options, in the cache key of
    every "cuda" timing (evaluators/cache.py, TimingKey.options).

    The process runs with `OPTIONS`: the defaults below, overridden at import by the environment
    (from_env); `launch_options(...)` changes them for a block. Each launch reads them, so a CUDA
    graph keeps the options it was captured with."""

    # Programmatic dependent launch: a GEMV may launch while the kernel before it finishes, and
    # waits for it (griddepcontrol.wait) before reading x. llama8 M=1, int4 g128 fused: 0.632 ->
    # 0.620 ms on a datacenter GPU (docs/kernels.md#int4_wo). Env: AUTOAO_CUDA_PDL (0 or 1).
    pdl: bool = True
    # MB of the next GEMV's weights (and the same leading fraction of its scales) that the CTAs of
    # the last wave prefetch into L2 after their main loop, while the DRAM would idle between GEMVs;
    # only where the module knows its next GEMV (kernels.int4.link_prefetch); 0: no prefetch. 8 was
    # the fastest of 0, 8, 16, 24, 32, 48 on llama8 M=1 with both PDLs (0 / 8 / 24 / 48 MB: 0.610 /
    # 0.592 / 0.618 / 0.630 ms on a datacenter GPU: docs/kernels.md#int4_wo). Env: AUTOAO_CUDA_PREFETCH_MB.
    prefetch_mb: float = 8.0
    # Early weight loads (with pdl): the first ring of weight loads goes out before the wait,
    # overlapping the previous kernel's tail (0.5-1 us per layer in chains of GEMVs). Only inside
    # CUDA graph capture: there the kernel before a GEMV belongs to the captured forward, which reads
    # weights but never writes them; eagerly, it could be the one that packed or copied them.
    # Env: AUTOAO_CUDA_EARLY (0 or 1).
    early: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.prefetch_mb < float("inf"):
            raise ValueError(f"prefetch_mb must be a finite number of MB >= 0, got {self.prefetch_mb!r}")

    @property
    def prefetch_bytes(self) -> int:
        return int(self.prefetch_mb * 2 ** 20)

    def tag(self) -> str:
        """The options as a short stable string, e.g. "pdl=1,prefetch_mb=8,early=1" (cache keys,
        benchmark headers)."""
        return f"pdl={int(self.pdl)},prefetch_mb={self.prefetch_mb:g},early={int(self.early)}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchOptions:
        """The defaults, overridden by AUTOAO_CUDA_PDL and AUTOAO_CUDA_EARLY ("0": off, "1": on) and
        AUTOAO_CUDA_PREFETCH_MB (MB, 0: off) where set in `environ` (default os.environ). The one
        place these variables are read; a bad value raises ValueError naming the variable."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for var, field in (("AUTOAO_CUDA_PDL", "pdl"), ("AUTOAO_CUDA_EARLY", "early")):
            value = env.get(var)
            if value is not None:
                if value.strip() not in ("0", "1"):
                    raise ValueError(f"{var} must be 0 (off) or 1 (on), got {value!r}")
                changes[field] = value.strip() == "1"
        value = env.get("AUTOAO_CUDA_PREFETCH_MB")
        if value is not None:
            try:
                changes["prefetch_mb"] = float(value)
                if not 0 <= changes["prefetch_mb"] < float("inf"):
                    raise ValueError
            except ValueError:
                raise ValueError(f"AUTOAO_CUDA_PREFETCH_MB must be a number of MB >= 0 (0: no prefetch), "
                                 f"got {value!r}") from None
        return cls(**changes)


OPTIONS = LaunchOptions.from_env()


@contextlib.contextmanager
def launch_options(options: LaunchOptions | None = None, **changes: Any) -> Iterator[LaunchOptions]:
    """Within this block, launches use `options` (default: the current ones) with `changes` applied,
    e.g. `with launch_options(pdl=False): ...`; yields them. Timings taken inside are cached under
    them (LaunchOptions)."""
    global OPTIONS
    previous = OPTIONS
    OPTIONS = dataclasses.replace(options if options is not None else previous, **changes)
    try:
        yield OPTIONS
    finally:
        OPTIONS = previous


##### launch ###################################################################################

# Split-K scratch per (device, N, split): partials [split, 8, N] fp32 and per-column-block arrival
# counters. The kernel leaves the counters at zero, so layers of the same width share them (calls on
# one stream run one after another), and they are never freed: a captured CUDA graph keeps using
# the addresses it saw.
_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _scratch(device: torch.device, n: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device.index, n, split)
    if key not in _SCRATCH:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("int4_gemv_cuda: split-K scratch must be allocated before CUDA graph capture "
                               "(run the layer once first)")
        _SCRATCH[key] = (torch.empty((split, MAX_ROWS, n), dtype=torch.float32, device=device),
                         torch.zeros(n // 16, dtype=torch.int32, device=device))
    return _SCRATCH[key]


def reserve_scratch(device: torch.device, n: int, k: int, group_size: int) -> None:
    """Allocate now the split-K scratch of every config the tuner may pick for a [N, K] weight.
    Allocated at a layer's first call instead, it can land in a CUDA-graph memory pool:
    torch.compile(mode="reduce-overhead") (transformers' compiled generate()) runs its warm-up
    inside its pool, and the scratch, which outlives every graph, then stops the recording
    ("tensors in the cudagraph pool not tracked as outputs")."""
    if device.type != "cuda":
        return
    if device.index is None:  # the key _launch uses: x.device, which always has an index
        device = torch.device(device.type, torch.cuda.current_device())
    for split in sorted({c.split for c in tuner_configs(k, group_size) if c.split > 1}):
        _scratch(device, n, split)


def _prefix(t: torch.Tensor | None, fraction: float, index: int) -> tuple[int, int]:
    """(address, bytes) of the first `fraction` of t's bytes, whole 16-byte blocks ((0, 0): none,
    or not on CUDA device `index`)."""
    if t is None or t.get_device() != index or not t.is_contiguous() or t.data_ptr() % 16:
        return 0, 0
    return t.data_ptr(), int(t.numel() * t.element_size() * fraction) // 16 * 16


def _launch(x: torch.Tensor, qw: torch.Tensor, sz: torch.Tensor, group_size: int, cfg: Config,
            out: torch.Tensor | None = None, next_qw: torch.Tensor | None = None,
            next_sz: torch.Tensor | None = None) -> torch.Tensor:
    """One launch with cfg, into `out` ([M, N] bf16; tests pass one filled with NaN) or a new tensor.
    next_qw/next_sz: the next GEMV's layouts, whose first OPTIONS.prefetch_bytes the kernel prefetches."""
    m, k = x.shape
    n = qw.shape[0] * 16
    # the host's share of an eager decode step: device lookups by index, the raw stream, no objects
    index = x.get_device()
    y = x.new_empty((m, n)) if out is None else out  # x is bf16 here
    lib = library(group_size, index)
    partials = arrived = 0
    if cfg.split > 1:
        p, a = _scratch(x.device, n, cfg.split)
        partials, arrived = p.data_ptr(), a.data_ptr()
    opts = OPTIONS
    next_w = next_s = (0, 0)
    if lib.sm90 and next_qw is not None and opts.prefetch_bytes > 0:
        # the same leading fraction of the scales as of the weights: the first CTAs' rows of both
        fraction = min(1.0, opts.prefetch_bytes / (next_qw.numel() * next_qw.element_size()))
        next_w, next_s = _prefix(next_qw, fraction, index), _prefix(next_sz, fraction, index)
    pdl = opts.pdl and lib.sm90
    early = pdl and opts.early and torch._C._cuda_isCurrentStreamCapturing()
    err = lib.autoao_int4_mma_gemv(x.data_ptr(), qw.data_ptr(), sz.data_ptr(), y.data_ptr(), partials, arrived,
                                   m, n, k, x.stride(0), cfg.rows, cfg.warps, cfg.chunks, cfg.min_blocks, cfg.split,
                                   *next_w, *next_s, int(pdl), int(early), torch._C._cuda_getCurrentRawStream(index))
    if err:
        raise RuntimeError(f"int4_gemv_cuda: launch of {cfg} failed with "
                           + ("an unbuilt configuration" if err < 0 else f"CUDA error {err}"))
    return y


def tuner_configs(k: int, group_size: int) -> list[Config]:
    """The configs the tuner times for in_features K: those whose warps all get K units (split x
    warps <= K / unit_k; more would leave warps idle)."""
    return [c for c in CONFIGS if c.split * c.warps <= k // unit_k(group_size)]


def _tune(x: torch.Tensor, qw: torch.Tensor, sz: torch.Tensor, group_size: int) -> Config:
    """The fastest config for (N, K, M, group), timed once per process (the default while a CUDA
    graph is being captured: nothing can be timed then)."""
    m, k = x.shape
    key = (qw.shape[0] * 16, k, m, group_size, x.device.index)
    cfg = _TUNED.get(key)
    if cfg is not None:
        return cfg
    if torch.cuda.is_current_stream_capturing():
        return _DEFAULT

    best = fastest(tuner_configs(k, group_size), lambda cfg: lambda: _launch(x, qw, sz, group_size, cfg)) or _DEFAULT
    _TUNED[key] = best
    return best


def int4_gemv_cuda_impl(x: torch.Tensor, qw: torch.Tensor, sz: torch.Tensor, group_size: int,
                        next_qw: torch.Tensor | None = None, next_sz: torch.Tensor | None = None) -> torch.Tensor:
    """x [M <= 8, K] -> [M, N] bf16 = x @ w^T for the int4 weight in the kernel's layouts (qw, sz
    from pack_mma), w = (q - 8) * scale + zero; x is used as bf16. next_qw/next_sz (optional): the
    layouts of the GEMV that runs next, whose first bytes are prefetched into L2 (sm_90+; a hint
    only: any tensors give the same result)."""
    k = qw.shape[1] * 64
    if x.dim() != 2 or x.shape[1] != k or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"int4_gemv_cuda: x must be [M <= {MAX_ROWS}, {k}], got {tuple(x.shape)}")
    if x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    # 16-byte loads of x's rows: contiguous rows, 16-byte aligned start
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)
    return _launch(x, qw, sz, group_size, _tune(x, qw, sz, group_size), next_qw=next_qw, next_sz=next_sz)


def int4_dequant_cuda_impl(qw: torch.Tensor, sz: torch.Tensor, group_size: int) -> torch.Tensor:
    """The [N, K] bf16 weight of the kernel's layouts (qw, sz from pack_mma, on a CUDA device),
    bit-identical to dequantize_mma: the "cuda" kernel's path for more than MAX_ROWS rows, one bf16
    GEMM on it. A copy-bound CUDA kernel (int4_mma.cu); inductor's code for dequantize_mma's
    permutes ran 20-40% slower end to end at M = 2048 than the canonical layout's dequantization
    (a llama8 search at 2048+1 tokens timed lm_head g128 at 5566 vs 4065 us; benchmarks/e2e.py)."""
    n, k = qw.shape[0] * 16, qw.shape[1] * 64
    w = torch.empty((n, k), dtype=torch.bfloat16, device=qw.device)
    qw, sz = qw.contiguous(), sz.contiguous()
    err = library(group_size, qw.device).autoao_int4_mma_dequant(
        qw.data_ptr(), sz.data_ptr(), w.data_ptr(), n, k, torch.cuda.current_stream(qw.device).cuda_stream)
    if err:
        raise RuntimeError(f"int4_dequant_cuda: launch failed with CUDA error {err}")
    return w


@torch.library.custom_op("autoao::int4_dequant_cuda", mutates_args=())
def int4_dequant_cuda(qw: torch.Tensor, sz: torch.Tensor, group_size: int) -> torch.Tensor:
    """Custom-op wrapper of int4_dequant_cuda_impl (opaque to torch.compile, capturable in CUDA graphs)."""
    return int4_dequant_cuda_impl(qw, sz, group_size)


EAGER["int4_dequant_cuda"] = int4_dequant_cuda_impl


@int4_dequant_cuda.register_fake
def _(qw, sz, group_size):
    return qw.new_empty((qw.shape[0] * 16, qw.shape[1] * 64), dtype=torch.bfloat16)


@torch.library.custom_op("autoao::int4_gemv_cuda", mutates_args=())
def int4_gemv_cuda(x: torch.Tensor, qw: torch.Tensor, sz: torch.Tensor, group_size: int,
                   next_qw: torch.Tensor | None = None, next_sz: torch.Tensor | None = None) -> torch.Tensor:
    """Custom-op wrapper of int4_gemv_cuda_impl (opaque to torch.compile, capturable in CUDA graphs)."""
    return int4_gemv_cuda_impl(x, qw, sz, group_size, next_qw, next_sz)


EAGER["int4_gemv_cuda"] = int4_gemv_cuda_impl


@int4_gemv_cuda.register_fake
def _(x, qw, sz, group_size, next_qw=None, next_sz=None):
    return x.new_empty((x.shape[0], qw.shape[0] * 16), dtype=torch.bfloat16)
