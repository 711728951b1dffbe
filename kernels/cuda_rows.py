"""One-launch weight-only linear for a few rows, called eagerly: the kernel an uncompiled call of
int8_wo's or fp8_wo's "triton" kernel runs on up to MAX_ROWS rows (an eager decode step, and a
prompt's forward in transformers' generate(), which runs its prefill uncompiled).

    y = rows_linear(x, w_q, w_scale)  # None: not here, the caller takes the GEMV or dequantizes

Why: an eager call's cost there is the host's. The dequantizing path (weight cast, bf16 GEMM,
scale multiply) is three launches where nn.Linear makes one, and a Triton kernel's Python launcher
costs the host what those three do (docs/kernels.md#eager-calls-the-hosts-share); the Triton GEMV's eager path cost the
host 16.4 us a one-row call before its launcher, this kernel's 9.4 us with its C call
(docs/kernels.md#eager-calls-the-hosts-share); on a datacenter GPU, SmolLM2's fp8_wo plan ran eager 64-token generate()
1.063x of the model as it came on this kernel, 0.826x on the GEMV (benchmarks/ACCURACY.md). This
kernel (kernels/cuda/wo_rows.cu, tensor cores, the weight converted exactly in registers) is one C
call through ctypes on torch's current stream. Compiled callers keep the Triton GEMV (up to 8 rows) and
the dequantizing path, which inductor fuses: torch.compile cannot trace a ctypes call.

Built by cuda_build on a module's first packing on a CUDA device (sm_80 or newer); where that is
not possible (no nvcc, an older GPU, a failed build) `prepare` says why once and the modules keep
the Triton GEMV (up to 8 rows) and the dequantizing path, which give the same numbers up to bf16
rounding.
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import torch

from autoao.kernels import cuda_build

MAX_ROWS = 64  # 8 blocks of the mma's 8 columns
_SOURCE = Path(__file__).with_name("cuda") / "wo_rows.cu"
_WHAT, _INSTEAD = "the CUDA weight-only rows kernel", "do without it"
_LIBS: dict[int, ctypes.CDLL] = {}  # device index -> the loaded library
_MISSING: dict[int, str] = {}  # device index -> why there is none
_SCALES = {torch.float32: 0, torch.bfloat16: 1}  # the kernel's scale_bf16 flag
_QDTYPES = {torch.int8: 0, torch.float8_e4m3fn: 1}  # its fp8 flag


def prepare(device: torch.device) -> str | None:
    """Build and load the kernel for a CUDA device: None once it is ready, else why not (warned
    once per device). Never raises: without it the modules take the GEMV or their dequantizing path."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _LIBS or index in _MISSING:
        return _MISSING.get(index)
    try:
        arch = cuda_build.mma_arch(index, _WHAT)
        lib = ctypes.CDLL(str(cuda_build.build(_SOURCE, [], "wo_rows", arch, _WHAT, _INSTEAD)))
    except (RuntimeError, OSError) as e:
        _MISSING[index] = str(e)
        warnings.warn(f"{str(e).rstrip('.')}. int8_wo and fp8_wo run eager calls of up to {MAX_ROWS} rows on the Triton "
                      "GEMV (up to 8) or their dequantizing path (3 launches a call) instead.", stacklevel=2)
        return _MISSING[index]
    lib.autoao_wo_rows.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 3 + \
        [ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    lib.autoao_wo_rows.restype = ctypes.c_int
    _LIBS[index] = lib
    return None


def rows_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [..., K] bf16 with at most MAX_ROWS rows -> [..., N] bf16 = (x @ w_q^T) * w_scale, for w_q
    [N, K] int8 or e4m3 (N % 16 == 0, K % 64 == 0, 16-byte aligned) and w_scale [N] fp32 or bf16,
    in one launch; None where it cannot run this call (no kernel for x's device, other dtypes,
    sizes or alignment): the caller then takes its own path. `out`: the result's tensor (tests pass
    one filled with NaN), else a new one."""
    index = x.get_device()  # -1 on the CPU: no library
    lib = _LIBS.get(index)
    n, k = w_q.shape
    fp8, scale_bf16 = _QDTYPES.get(w_q.dtype), _SCALES.get(w_scale.dtype)
    if (lib is None or fp8 is None or scale_bf16 is None or x.dtype != torch.bfloat16 or n % 16 or k % 64
            or not x.is_contiguous() or x.data_ptr() % 16 or w_q.data_ptr() % 16):
        return None
    y = x.new_empty((*x.shape[:-1], n)) if out is None else out
    err = lib.autoao_wo_rows(x.data_ptr(), w_q.data_ptr(), w_scale.data_ptr(), scale_bf16, y.data_ptr(),
                             x.numel() // k, n, k, k, fp8, torch._C._cuda_getCurrentRawStream(index))
    if err:
        raise RuntimeError(f"{_WHAT}: launch on x {tuple(x.shape)}, weight {n}x{k} failed with "
                           + ("unsupported sizes" if err < 0 else f"CUDA error {err}"))
    return y
