"""GGUF types timed in ggml itself, one matmul at a time: what per-layer llama.cpp costs would say.

    python benchmarks/ggml_cells.py --out DIR      # needs llama-cpp-python (docs/serving.md)

For SmolLM2-135M's three layer shapes (K x N) and M = 1 and 256 rows, one ggml_mul_mat of a
weight of each type (BF16, Q8_0, Q4_0, Q4_1, and Q6_K where K % 256 == 0; the weights random,
quantized by autoao as ggml does) by float32 activations, computed with ggml_graph_compute_with_ctx
on --threads threads through llama_cpp's ggml libraries (ctypes): 3 warm-up calls, then the median
of --reps. The same weight every call, so it stays in cache, and each call starts ggml's threads:
these are cells as a naive per-layer timing would take them. Writes DIR/cells.json and DIR/cells.md
(each type's time and its ratio to BF16).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.util
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from autoao.kernels import gguf as kg

P = ctypes.c_void_p


class Params(ctypes.Structure):  # struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """llama_cpp's ggml libraries with the signatures this script calls."""
    lib = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    for fn, res, args in [(base.ggml_init, P, [Params]), (base.ggml_new_tensor_2d, P, [P, ctypes.c_int, ctypes.c_int64,
                                                                                        ctypes.c_int64]),
                          (base.ggml_mul_mat, P, [P, P, P]), (base.ggml_new_graph, P, [P]),
                          (base.ggml_build_forward_expand, None, [P, P]), (base.ggml_get_data, P, [P]),
                          (base.ggml_nbytes, ctypes.c_size_t, [P]), (base.ggml_free, None, [P]),
                          (cpu.ggml_graph_compute_with_ctx, ctypes.c_int, [P, P, ctypes.c_int])]:
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()
    return base, cpu


base, cpu = _ggml()


def cell(tname: str, k: int, n: int, m: int, threads: int, reps: int) -> float:
    """Median us of one ggml_mul_mat of a [N, K] weight of `tname` by [M, K] float32 activations."""
    w = torch.randn(n, k) * 0.05
    if tname == "bf16":  # GGML_TYPE_BF16
        gtype, data = 30, w.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    else:
        gtype, data = kg.TYPES[tname].ggml_type, kg.quantize(w, tname).numpy().tobytes()
    ctx = base.ggml_init(Params(len(data) + k * m * 4 + n * m * 4 + (64 << 20), None, False))
    a = base.ggml_new_tensor_2d(ctx, gtype, k, n)
    assert base.ggml_nbytes(a) == len(data), (base.ggml_nbytes(a), len(data))
    ctypes.memmove(base.ggml_get_data(a), data, len(data))
    b = base.ggml_new_tensor_2d(ctx, 0, k, m)
    x = np.random.randn(m, k).astype(np.float32).tobytes()
    ctypes.memmove(base.ggml_get_data(b), x, len(x))
    c = base.ggml_mul_mat(ctx, a, b)
    g = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(g, c)
    for _ in range(3):
        cpu.ggml_graph_compute_with_ctx(ctx, g, threads)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        cpu.ggml_graph_compute_with_ctx(ctx, g, threads)
        ts.append(time.perf_counter() - t0)
    base.ggml_free(ctx)
    return sorted(ts)[len(ts) // 2] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    lines = ["| K x N | M | " + " | ".join(["bf16", "q8_0", "q4_0", "q4_1", "q6_k"]) + " |", "|---|---|---|---|---|---|---|"]
    for k, n in [(576, 1536), (1536, 576), (576, 576)]:
        for m in (1, 256):
            us = {t: cell(t, k, n, m, args.threads, args.reps)
                  for t in ["bf16", "q8_0", "q4_0", "q4_1"] + (["q6_k"] if k % 256 == 0 else [])}
            rows.append({"k": k, "n": n, "m": m, "us": us})
            lines.append(f"| {k} x {n} | {m} | " + " | ".join(
                f"{us[t]:.1f} us ({us[t] / us['bf16']:.2f})" if t in us else "-" for t in
                ["bf16", "q8_0", "q4_0", "q4_1", "q6_k"]) + " |")
    import llama_cpp

    args.out.mkdir(parents=True, exist_ok=True)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "llama_cpp_python": llama_cpp.__version__, "torch": torch.__version__, "threads": args.threads,
            "reps": args.reps, "rows": rows}
    (args.out / "cells.json").write_text(json.dumps(info, indent=1))
    (args.out / "cells.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
