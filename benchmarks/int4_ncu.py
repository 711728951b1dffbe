"""The M=1 GEMVs of one layer shape under Nsight Compute: why int4 kernels stream at ~2 TB/s.

    source benchmarks/device_env.sh
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section LaunchStats \
        python3 benchmarks/int4_ncu.py [--shape 28672x4096] [--configs "words 16/1024/1/4/3;mma 128/128/1/8/4"]
        [--cuda "1/4/2/1;2/4/2/1"]

Compiles and warms every kernel first (Triton configs, the fp8 kernel's tuning, tinygemm), then
opens the profiler range and launches each once: the Triton int4 configs given, autoao's CUDA int4
kernel's configs given (rows/warps/chunks/split, kernels/cuda_int4.py), tinygemm
(`_weight_int4pack_mm`), the fp8 per-channel GEMV (same access pattern at 1 byte per weight; ~100%
of roofline on the lm_head) and bf16 `F.linear` (cuBLAS, ~4.2 TB/s on this shape). Prints which
kernel is which, in launch order, so ncu's report can be read against it.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from autoao.kernels import cuda_int4 as ci
from autoao.kernels import triton_gemv as tg
from autoao.kernels.int4 import tinygemm_layout
from autoao.kernels.quant import pack_int4, quantize_fp8, quantize_int4_groupwise


def parse(spec: str) -> tg.Config:
    """'mma 128/128/1/8/4' -> Config(block_n, block_k, split_k, num_warps, variant, num_stages)."""
    variant, nums = spec.split()
    bn, bk, sk, w, st = (int(v) for v in nums.split("/"))
    return tg.Config(bn, bk, sk, w, "" if variant == "byte" else variant, st)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="28672x4096", help="NxK")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--configs", default="words 16/1024/1/4/3;mma 128/128/1/8/4")
    ap.add_argument("--cuda", default="", help="';'-separated rows/warps/chunks/split of the CUDA int4 kernel")
    args = ap.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    g = args.group
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda") * k ** -0.5
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q, s, z = quantize_int4_groupwise(w, g)
    t4 = (pack_int4(q), s, z)
    packed, sz = tinygemm_layout(*t4)
    f8, sf = quantize_fp8(w, "row")
    sf = sf.reshape(-1)
    wb = w.to(torch.bfloat16)
    runs = [(spec, lambda c=parse(spec): tg._finish(tg._launch("int4", x, t4, n, k, c, g), x.dtype))
            for spec in args.configs.split(";")]
    if args.cuda:
        mma = ci.pack_mma(q, s, z, g)
        runs += [(f"cuda {spec}", lambda c=ci.Config(*(int(v) for v in spec.split("/"))): ci._launch(x, *mma, g, c))
                 for spec in args.cuda.split(";")]
    runs += [("tinygemm", lambda: torch._weight_int4pack_mm(x, packed, g, sz)),
             ("fp8 per-channel (tuned)", lambda: tg.per_channel_gemv_triton(x, f8, sf)),
             ("bf16 F.linear", lambda: F.linear(x, wb))]
    for _, fn in runs:  # compile, tune, warm
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in runs:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{n}x{k}, launch order: " + " | ".join(name for name, _ in runs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
