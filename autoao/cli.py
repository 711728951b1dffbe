"""The `autoao` command line. Argument parsing and printing only: the work lives in the library.

    autoao kernels --shapes 4096x4096,14336x4096 --tokens 1,128,2048 [--device cuda]

Bad input prints one line `autoao: error: ...` and exits with status 2 (no traceback).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence


class CLIError(Exception):
    """A user-input error: printed as one line, exit status 2."""


def split_list(text: str) -> list[str]:
    """Split on commas that are not inside parentheses: "a,int4_wo(group_size=64),b"."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    return [i for i in items if i]


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
    try:
        values = [int(v) for v in split_list(text)]
    except ValueError:
        raise CLIError(f"bad {flag} {text!r}: expected comma-separated positive integers, e.g. 1,128,2048") from None
    if not values or min(values) < 1:
        raise CLIError(f"bad {flag} {text!r}: expected comma-separated positive integers, e.g. 1,128,2048")
    return values


def parse_candidates(text: str | None):
    from autoao import search_space

    if text is None:
        return search_space.all_candidates()
    try:
        return [search_space.get(name) for name in split_list(text)]
    except ValueError as e:
        raise CLIError(str(e).replace("\n", " ")) from None


def parse_device(text: str | None):
    import torch

    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise CLIError(f"bad --device {text!r}: expected cpu or cuda (or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda given but no CUDA GPU is visible to torch")
    if device.type not in ("cpu", "cuda"):
        raise CLIError(f"bad --device {text!r}: autoao has kernels for cpu and cuda")
    return device


DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


##### autoao kernels ############################################################################

def cmd_kernels(args: argparse.Namespace) -> int:
    import torch

    from autoao.evaluators.cache import TimingCache, cache_dir
    from autoao.evaluators.timing import measure_latencies

    shapes = parse_shapes(args.shapes)
    tokens = parse_ints(args.tokens, "--tokens")
    candidates = parse_candidates(args.candidates)
    device = parse_device(args.device)
    if args.dtype not in DTYPES:
        raise CLIError(f"bad --dtype {args.dtype!r}: choose from {', '.join(DTYPES)}")
    dtype = getattr(torch, DTYPES[args.dtype])
    if not any(c.family == "bf16" for c in candidates):
        from autoao import search_space

        candidates = [search_space.get("bf16"), *candidates]  # the speed-up needs the baseline
    try:
        cache = TimingCache(cache_dir(args.cache_dir) / "timings.sqlite")
        table = measure_latencies(shapes, tokens, candidates, device=device, dtype=dtype, mode=args.mode,
                                  cache=cache, progress=not args.quiet)
    except ValueError as e:
        raise CLIError(str(e)) from None
    print(format_kernel_table(table, shapes, tokens, candidates))
    print(f"\n{table.measured} kernel timings measured, {len(table.rows) - table.measured} from the cache "
          f"({cache.path}), {table.seconds:.1f} s.")
    if args.csv:
        write_kernel_csv(table, args.csv)
        print(f"wrote {args.csv}")
    return 0


def format_kernel_table(table, shapes, tokens, candidates) -> str:
    """One block per shape: median time per candidate and M, speed-up vs bf16, and a notes column
    with why a candidate is unsupported or emulated (emulated times are never shown as a speed-up)."""
    lines = []
    for n, k in shapes:
        lines.append(f"\n{n}x{k} (N x K), {table.dtype} on {table.device}, mode {table.mode}")
        head = f"{'candidate':<28}" + "".join(f"{'M=' + str(m):>18}" for m in tokens) + "  notes"
        lines += [head, "-" * len(head)]
        for cand in candidates:
            cells, notes = [], set()
            for m in tokens:
                t = table.get(cand.name, m, k, n)
                base = table.get("bf16", m, k, n)
                if not t.ok:
                    cells.append("n/a" if (t.error or "").startswith("unsupported") else "failed")
                    notes.add(t.error or "")
                elif t.emulated:
                    cells.append(f"{t.median_us:.1f}us emul.")
                    notes.add(f"emulated: {t.emulated}")
                elif cand.family == "bf16" or not base.ok:
                    cells.append(f"{t.median_us:.1f}us")
                else:
                    cells.append(f"{t.median_us:.1f}us {base.median_us / t.median_us:.2f}x")
            lines.append(f"{cand.name:<28}" + "".join(f"{c:>18}" for c in cells) + "  " + "; ".join(sorted(notes)))
    return "\n".join(lines)


def write_kernel_csv(table, path: str) -> None:
    import csv

    from autoao.plan import atomic_write

    def write(f) -> None:
        import io

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["device", "dtype", "mode", "candidate", "m", "k", "n", "median_us", "p20_us", "p80_us",
                    "emulated", "error", "cached"])
        for r in table.rows:
            t = r.timing
            w.writerow([table.device, table.dtype, table.mode, r.candidate, r.m, r.k, r.n,
                        *(v if math.isfinite(v) else "" for v in (t.median_us, t.p20_us, t.p80_us)),
                        t.emulated or "", t.error or "", int(r.cached)])
        f.write(buf.getvalue().encode())

    from pathlib import Path

    atomic_write(Path(path), write)


##### entry point ###############################################################################

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoao", description="Accuracy-aware per-layer quantization "
                                "and 2:4 sparsity search for PyTorch.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

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
                   help="how kernels run while timed: graph = CUDA graphs (CUDA default), "
                        "eager (CPU default), compile = torch.compile")
    k.add_argument("--cache-dir", default=None, help="timing cache directory (default: $AUTOAO_CACHE_DIR "
                   "or ~/.cache/autoao)")
    k.add_argument("--csv", default=None, help="also write every timing to this CSV file")
    k.add_argument("--quiet", action="store_true", help="no progress bar")
    k.set_defaults(func=cmd_kernels)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CLIError as e:
        print(f"autoao: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoao: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
