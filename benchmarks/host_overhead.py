"""Host time of one eager weight-only GEMV call (int8_wo / fp8_wo on CUDA), the device launch stubbed:
what autoao's module costs a decoding model per layer before any kernel runs, with the launch
geometry computed by triton.cdiv / triton.next_power_of_2 (ConstexprFunctions) against plain int
arithmetic (kernels/ops.cdiv, next_pow2), the two variants interleaved.

    python benchmarks/host_overhead.py --out benchmarks/results/2026-12-03-cpu/host-overhead
    python benchmarks/host_overhead.py --paths --out benchmarks/results/2026-12-04-cpu/host-paths

--paths: the eager dispatch paths a one-row call can take instead, interleaved: the Triton GEMV's
(its `[grid]` launch stubbed) against the rows kernel's (kernels/cuda_rows.py, its C function and
the CUDA stream lookup stubbed; the module's lower bound GEMV_MAX_ROWS set to 0 for that side, as
taking eager decode to the rows kernel would), with nn.Linear on a 16x16 layer beside them (its
dispatch and a matmul next to free on the CPU).

Runs on the CPU: the Triton kernel's launch is replaced by a stub and the launch config is put in
the tuner's cache as a CUDA run leaves it, so every other line of the CUDA path runs as it does
there (the module's forward, the custom-op bypass, the row checks, the tuner lookup, the output
allocation, the geometry). Shapes: SmolLM2-135M's q/o (576x576) and gate/up (1536x576), one token.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from torch import nn

import autoao.kernels.triton_gemv as tg
from autoao import search_space


def per_call_us(fn, n: int = 20000, sync=None) -> tuple[float, float]:
    """(host us, wall us) per call of fn over n calls after n // 10 warm ones: host, the loop's time
    before `sync` (e.g. torch.cuda.synchronize: the device runs behind); wall, with it."""
    for _ in range(n // 10):
        fn()
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    if sync is not None:
        sync()
    return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


class _Stub:
    """Stands for a @triton.jit kernel: kernel[grid](...) records nothing and launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **meta: None


class _Lib:
    """Stands for the rows kernel's loaded library: its C function launches nothing."""

    def autoao_wo_rows(self, *args) -> int:
        return 0


def _gemv_module(n: int) -> nn.Module:
    """An int8_wo module of 576 -> n on the CUDA route at M = 1, its tuner's entry as a CUDA sweep
    leaves it: every line of the eager GEMV path runs here but the stubbed launch."""
    m = search_space.get("int8_wo").build(nn.Linear(576, n, bias=False).to(torch.bfloat16))
    m._gemv, m._route = True, (("triton", None),)
    tg._TUNED[("int8", n, 576, 1, 0, torch.bfloat16, None)] = tg._DEFAULT
    return m


def paths(rounds: int) -> dict[str, dict[str, list[float]]]:
    """{shape: {path: [us a call, a round each]}} for one-row eager int8_wo calls, the paths
    interleaved round by round."""
    import autoao.kernels.cuda_rows as cuda_rows
    import autoao.kernels.weight_only as weight_only

    cuda_rows._LIBS[-1] = _Lib()  # x.get_device() is -1 on the CPU
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    x = torch.randn(1, 1, 576, dtype=torch.bfloat16)
    rows: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for n in (576, 1536):
            m = _gemv_module(n)
            lin, x16 = nn.Linear(16, 16, bias=False).to(torch.bfloat16), x[..., :16]  # its dispatch, a tiny matmul
            for _ in range(rounds):
                for path, bound in (("Triton GEMV", tg.MAX_ROWS), ("rows kernel", 0)):
                    weight_only.GEMV_MAX_ROWS = bound
                    rows.setdefault(f"{n}x576", {}).setdefault(path, []).append(per_call_us(lambda: m(x))[0])
                rows[f"{n}x576"].setdefault("nn.Linear 16x16", []).append(per_call_us(lambda: lin(x16))[0])
    weight_only.GEMV_MAX_ROWS = tg.MAX_ROWS
    return rows


def geometry(rounds: int) -> dict[str, dict[str, list[float]]]:
    """{shape: {variant: [us a call, a round each]}}: the GEMV path with the launch geometry from
    triton's ConstexprFunctions against plain ints, interleaved."""
    x = torch.randn(1, 1, 576, dtype=torch.bfloat16)
    variants = {"triton's ConstexprFunctions": (triton.cdiv, triton.next_power_of_2), "plain ints": (tg.cdiv, tg.next_pow2)}
    rows: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for n in (576, 1536):
            m = _gemv_module(n)
            for _ in range(rounds):  # interleaved: one call series per variant, in turn
                for name, (cdiv, pow2) in variants.items():
                    tg.cdiv, tg.next_pow2 = cdiv, pow2
                    rows.setdefault(f"{n}x576", {}).setdefault(name, []).append(per_call_us(lambda: m(x))[0])
    tg.cdiv, tg.next_pow2 = variants["plain ints"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paths", action="store_true", help="the GEMV's and the rows kernel's eager paths, nn.Linear beside")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tg._per_channel_kernel, tg._sum_splits_kernel = _Stub(), _Stub()
    rows = paths(args.rounds) if args.paths else geometry(args.rounds)
    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__, "triton": triton.__version__,
              "machine": platform.processor() or platform.machine(), "threads": 1}
    if not args.paths:  # the geometry helpers alone, a call each
        result["helpers_us"] = {"triton.cdiv": per_call_us(lambda: triton.cdiv(576, 16), 200000)[0],
                                "triton.next_power_of_2": per_call_us(lambda: triton.next_power_of_2(1), 200000)[0],
                                "ops.cdiv": per_call_us(lambda: tg.cdiv(576, 16), 200000)[0],
                                "ops.next_pow2": per_call_us(lambda: tg.next_pow2(1), 200000)[0]}
    result["module_call_us"] = {shape: {k: {"median": statistics.median(v), "rounds": v} for k, v in by.items()}
                                for shape, by in rows.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("host_paths.json" if args.paths else "host_overhead.json")).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "module_call_us"}, indent=1))
    for shape, by in result["module_call_us"].items():
        print(shape, {k: round(v["median"], 2) for k, v in by.items()})


if __name__ == "__main__":
    main()
