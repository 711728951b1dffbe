"""Every CUDA kernel of the candidates that have several, timed as the search times them.

    source benchmarks/device_env.sh; python3 benchmarks/kernel_table.py --out $OUT
        [--candidates "int4_wo(group_size=128);int4_wo(group_size=32)"] [--shapes 4096x4096,...]
        [--tokens 16,2048] [--mode compile|graph]

`autoao kernels --all-kernels` with a fresh timing cache (nothing reused from earlier runs) on
llama8's unfused weight shapes; writes its table to kernel_table.md (with the command, GPU and
versions) and every kernel's timing to kernel_table.csv (column chosen: the kernel timing picked).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import torch

from autoao.cli import main as autoao_main

LLAMA8 = "4096x4096,1024x4096,14336x4096,4096x14336,128256x4096"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--candidates", default="int4_wo(group_size=128);int4_wo(group_size=32)",
                    help="';'-separated candidate names")
    ap.add_argument("--shapes", default=LLAMA8, help="comma-separated NxK (weight shapes)")
    ap.add_argument("--tokens", default="16,2048")
    ap.add_argument("--mode", default="compile", choices=["compile", "graph"])
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    printed = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(printed):
        rc = autoao_main(["kernels", "--device", "cuda", "--shapes", args.shapes, "--tokens", args.tokens,
                          "--candidates", ",".join(args.candidates.split(";")), "--mode", args.mode,
                          "--all-kernels", "--quiet", "--cache-dir", tmp, "--csv", str(out / "kernel_table.csv")])
    text = (f"# Every kernel's timing ({torch.cuda.get_device_name()}, torch {torch.__version__})\n\n"
            f"command: python {' '.join(sys.argv)}\n\n```\n{printed.getvalue().strip()}\n```\n")
    (out / "kernel_table.md").write_text(text)
    print(text, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
