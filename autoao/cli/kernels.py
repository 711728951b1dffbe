"""`autoao kernels`: what each candidate costs on this device, per layer shape.

    autoao kernels --shapes 4096x4096,14336x4096 --tokens 1,128,2048 [--device cuda]

Its flags are parsed here (weight shapes, token counts, the dtype); the timing is
autoao.evaluators.timing's, the table autoao.evaluators.kernel_table's.
"""

from __future__ import annotations

import argparse

from autoao import search_space
from autoao.cli.args import CLIError, parse_candidates, parse_device, split_list
from autoao.common import BASELINE
from autoao.evaluators.cache import TimingCache, cache_dir
from autoao.evaluators.kernel_table import format_kernel_table, write_kernel_csv
from autoao.evaluators.timing import measure_latencies

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"4096x4096,14336x4096" -> [(N, K), ...] (weight shapes, out x in)."""
    shapes = []
    for item in split_list(text):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise CLIError(f"bad --shapes entry {item!r}: expected NxK (out_features x in_features), "
                           "e.g. 4096x4096 or 14336x4096")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def parse_ints(text: str, flag: str) -> list[int]:
    """"1,128,2048" -> [1, 128, 2048]: at least one value, each a positive integer."""
    try:
        values = [int(v) for v in split_list(text)]
    except ValueError:
        raise CLIError(f"bad {flag} {text!r}: expected comma-separated positive integers, e.g. 1,128,2048") from None
    if not values or min(values) < 1:
        raise CLIError(f"bad {flag} {text!r}: expected comma-separated positive integers, e.g. 1,128,2048")
    return values


def cmd_kernels(args: argparse.Namespace) -> int:
    """Time the candidates on the shapes and token counts; print the table (and write --csv)."""
    import torch

    shapes = parse_shapes(args.shapes)
    tokens = parse_ints(args.tokens, "--tokens")
    candidates = parse_candidates(args.candidates)
    device = parse_device(args.device)
    if args.dtype not in DTYPES:
        raise CLIError(f"bad --dtype {args.dtype!r}: choose from {', '.join(DTYPES)}")
    dtype = getattr(torch, DTYPES[args.dtype])
    if not any(c.family == BASELINE for c in candidates):
        candidates = [search_space.get("bf16"), *candidates]  # the speed-up needs the baseline
    try:
        cache = TimingCache(cache_dir(args.cache_dir) / "timings.sqlite")
        table = measure_latencies(shapes, tokens, candidates, device=device, dtype=dtype, mode=args.mode,
                                  cache=cache, progress=not args.quiet)
    except ValueError as e:
        raise CLIError(str(e)) from None
    print(format_kernel_table(table, shapes, tokens, candidates, all_kernels=args.all_kernels))
    # measured counts every kernel timed (several per row for multi-kernel candidates); a row is
    # cached when none of its kernels had to be timed
    print(f"\n{table.measured} kernel timings measured, {sum(r.cached for r in table.rows)} of "
          f"{len(table.rows)} results from the cache ({cache.path}), {table.seconds:.1f} s.")
    if args.csv:
        write_kernel_csv(table, args.csv, all_kernels=args.all_kernels)
        print(f"wrote {args.csv}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the `kernels` subcommand to the CLI's subparsers (func: cmd_kernels)."""
    k = sub.add_parser("kernels", help="what each candidate costs on this device, per layer shape",
                       description="Time every candidate kernel on the given layer shapes and token "
                       "counts; print median time, speed-up vs bf16, and why a candidate is unsupported "
                       "or only emulated here. Timings are cached on disk.")
    k.add_argument("--shapes", default="4096x4096,14336x4096",
                   help="comma-separated weight shapes NxK (out x in features), default %(default)s")
    k.add_argument("--tokens", default="1,128,2048",
                   help="comma-separated token counts M (rows of the activation), default %(default)s")
    k.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available, else cpu)")
    k.add_argument("--dtype", default="bf16", help="activation/weight dtype of the layers: bf16, fp16 or fp32")
    k.add_argument("--candidates", default=None,
                   help="comma-separated candidate names, e.g. 'int8_dyn,int4_wo(group_size=64)' (default: all)")
    k.add_argument("--mode", default=None, choices=["eager", "graph", "compile"],
                   help="how kernels run while timed: compile = torch.compile(fullgraph) replayed in a "
                        "CUDA graph (CUDA default: how a plan runs; a layer whose forward is one kernel, "
                        "e.g. a GEMV, runs uncompiled), graph = eager modules in a CUDA graph, eager (CPU "
                        "default)")
    k.add_argument("--cache-dir", default=None, help="timing cache directory (default: $AUTOAO_CACHE_DIR "
                   "or ~/.cache/autoao)")
    k.add_argument("--csv", default=None, help="also write every timing to this CSV file")
    k.add_argument("--all-kernels", action="store_true",
                   help="for candidates with several kernels on the device, show (and write to --csv) every kernel "
                        "timed, not only the one timing chose")
    k.add_argument("--quiet", action="store_true", help="no progress bar")
    k.set_defaults(func=cmd_kernels)
