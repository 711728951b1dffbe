"""Which x86 instruction sets this CPU has, and which of them each CPU kernel library uses here.

The fastest CPU kernel for a layer depends on the instructions behind it more than on its name:
bf16 matmul runs on AMX tiles (oneDNN) where the CPU has AMX-BF16 and is ~7x slower than fp32
where it has neither AMX nor AVX512-BF16; fbgemm's int8 GEMM uses VNNI's 4-way dot product where
it exists and otherwise needs 7-bit activations (reduce_range) to keep vpmaddubsw from saturating.
This module reads the flags from /proc/cpuinfo (absent off Linux: nothing is assumed) and states
each library's dispatch rule, so the report can say what actually ran.
"""

from __future__ import annotations

import functools

# /proc/cpuinfo flag -> the name people know it by, most capable first
FLAGS = {
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
    "avx512_bf16": "AVX512-BF16",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512f": "AVX-512",
    "avx2": "AVX2",
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of FLAGS that /proc/cpuinfo lists for the first CPU (empty where it
    cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split()) & frozenset(FLAGS)


def has(flag: str) -> bool:
    return flag in cpu_flags()


def _best(*flags: str, fallback: str) -> str:
    return next((FLAGS[f] for f in flags if has(f)), fallback)


def isa_of(library: str) -> str:
    """The instructions `library`'s kernels run on this CPU, by that library's dispatch rule:
    "bf16_mm" (oneDNN bf16 matmul: AMX-BF16, else AVX512-BF16, else converted to fp32), "fp32_mm"
    (MKL / oneDNN sgemm), "fbgemm" (int8: VNNI, else AVX-512 / AVX2 with 7-bit activations),
    "onednn_int8" (AMX-INT8, else VNNI), "aten" (ATen's own vectorized loops, such as
    _weight_int8pack_mm and _weight_int4pack_mm_for_cpu: AVX-512 or AVX2)."""
    if library == "bf16_mm":
        return _best("amx_bf16", "avx512_bf16", fallback="bf16 converted to fp32")
    if library == "fp32_mm":
        return _best("avx512f", "avx2", fallback="scalar")
    if library == "fbgemm":
        return _best("avx512_vnni", "avx_vnni", fallback=_best("avx512f", "avx2", fallback="scalar")
                     + " (7-bit activations)")
    if library == "onednn_int8":
        return _best("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2", fallback="scalar")
    if library == "aten":
        return _best("avx512f", "avx2", fallback="scalar")
    raise ValueError(f"unknown CPU kernel library {library!r} (has: bf16_mm, fp32_mm, fbgemm, onednn_int8, aten)")


def fbgemm_reduce_range() -> bool:
    """Whether fbgemm's dynamic int8 linear needs 7-bit activations here: without VNNI its
    vpmaddubsw sums pairs of u8 x s8 products into a saturating int16."""
    return not (has("avx512_vnni") or has("avx_vnni"))


def describe_features() -> str:
    """ "AMX-BF16, AMX-INT8, AVX512-BF16, ..." for the device line ("" where unknown)."""
    return ", ".join(name for flag, name in FLAGS.items() if has(flag))


def annotate(text: str) -> str:
    """`text` with {bf16_mm}, {fp32_mm}, {fbgemm}, {onednn_int8}, {aten} replaced by isa_of(...)."""
    return text.format(**{lib: isa_of(lib) for lib in ("bf16_mm", "fp32_mm", "fbgemm", "onednn_int8", "aten")})
