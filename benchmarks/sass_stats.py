"""Static look at the Triton GEMV kernels: compile each for sm_90 on the CPU (Triton ships ptxas and
cuobjdump; no GPU needed) and count the SASS of the main loop per byte of weights it streams.

    python benchmarks/sass_stats.py [--configs 16/512/4,16/1024/8]

(The tensor-core int4 kernel ("mma") needs BLOCK_K % 128 == 0 here and BLOCK_N >= 64 per 4 warps to
get Hopper's wgmma (HGMMA); narrower tiles fall back to HMMA and are slow.)

A GEMV is memory-bound only if the loop issues few instructions per byte: at 4.24 TB/s over 132
SMs at 1.98 GHz each SM must take in 16.2 bytes per clock, and its 4 schedulers issue at most 4
warp-instructions per clock, so above ~0.25 warp-instructions per byte of weights the kernel is
issue-bound (a model, checked against the H200 in benchmarks/NOTES.md). Arguments are specialised as the JIT
does for values divisible by 16 (pointers, N, K, strides), so loads vectorise as they would there.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from autoao.kernels import triton_gemv as tg

TARGET = GPUTarget("cuda", 90, 32)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile_kernel(fn, sig: dict[str, str], consts: dict, num_warps: int):
    """triton.compile for sm_90 with the JIT's divisibility-by-16 specialisation on every pointer
    and on the non-constexpr integers."""
    names = fn.arg_names
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items()
             if t.startswith("*") or (t == "i32" and a not in ("M",))}
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                    constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps})


def int4(bn: int, bk: int, warps: int, variant: str = "", g: int = 128):
    q_ty = {"words": "*i32", "mma": "*i16"}.get(variant, "*u8")
    sig = {"x_ptr": "*bf16", "q_ptr": q_ty, "s_ptr": "*bf16", "z_ptr": "*bf16",
           "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_qn": "i32",
           "stride_sn": "i32"}
    consts = dict(GROUP=g, BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=1)
    if variant == "words":
        return compile_kernel(tg._int4_words_kernel, sig, consts, warps), bn * bk // 2
    if variant == "mma":  # compiled with Triton's default num_stages = 3, Config's default
        return compile_kernel(tg._int4_mma_kernel, sig, consts, warps), bn * bk // 2
    return compile_kernel(tg._int4_kernel, sig, consts, warps), bn * bk // 2


def per_channel(bn: int, bk: int, warps: int, int8: bool):
    sig = {"x_ptr": "*bf16", "w_ptr": "*i8" if int8 else "*fp8e4nv", "s_ptr": "*bf16", "y_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32"}
    consts = dict(BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=1, IS_INT8=int8)
    return compile_kernel(tg._per_channel_kernel, sig, consts, warps), bn * bk


def loop_stats(kernel) -> dict:
    """Registers, the instruction mix of the longest backward-branch loop in the SASS, and in that
    loop the shared-memory accesses (LDS/STS/LDSM/STSM, without the never-executed `@!PT LDS`
    ptxas pads fences with) and the tensor-core instructions (HMMA, HGMMA)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([BIN / "cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([BIN / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    loops = []
    for a, ln in zip(addr, lines):
        t = re.search(r"BRA .*?0x([0-9a-f]+)", ln)
        if t and int(t.group(1), 16) < a:
            loops.append((int(t.group(1), 16), a))
    lo, hi = max(loops, key=lambda t: t[1] - t[0]) if loops else (0, max(addr))
    loop = [re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln).groups()  # (predicate, opcode)
            for a, ln in zip(addr, lines) if lo <= a <= hi]
    ops = collections.Counter(op for _, op in loop)
    smem = sum(1 for pred, op in loop
               if op.split(".")[0] in ("LDS", "STS", "LDSM", "STSM") and not (pred or "").startswith("@!PT"))
    mma = sum(n for op, n in ops.items() if op.startswith(("HMMA", "HGMMA")))
    regs = re.search(r"REG:(\d+)", res)
    return {"regs": int(regs.group(1)) if regs else None, "loop_instr": sum(ops.values()), "ops": ops,
            "smem": smem, "mma": mma}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="16/512/4,16/1024/8", help="BLOCK_N/BLOCK_K/warps, comma-separated")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, target sm_90; per loop iteration: instructions per thread, "
          "and warp-instructions per byte of weights (all warps)")
    for cfg in args.configs.split(","):
        bn, bk, warps = (int(v) for v in cfg.split("/"))
        for name, (k, nbytes) in [("int4 g128", int4(bn, bk, warps)), ("int4 g128 words", int4(bn, bk, warps, "words")),
                                  ("int4 g128 mma", int4(bn, bk, warps, "mma")),
                                  ("int8", per_channel(bn, bk, warps, True)), ("fp8", per_channel(bn, bk, warps, False))]:
            s = loop_stats(k)
            per_byte = s["loop_instr"] * warps / nbytes
            top = ", ".join(f"{op} {n}" for op, n in s["ops"].most_common(8))
            print(f"{cfg:>10} {name:<16} regs {s['regs']:>3}  loop {s['loop_instr']:>5} instr/thread  "
                  f"{per_byte:.3f} warp-instr/byte  smem {s['smem'] * warps / nbytes:.3f}/B  tensor {s['mma']:>2}"
                  f"  | {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
