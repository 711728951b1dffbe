"""The `autoao` command line. Argument parsing and printing only: the work lives in the library.

    autoao search [--model NAME|module:factory] [--tasks T] [--budget 10m] [--max-accuracy-drop 1%] ...
    autoao apply --model ... --plan plan.json --save DIR
    autoao kernels --shapes 4096x4096,14336x4096 --tokens 1,128,2048 [--device cuda]
    autoao export RUN_DIR --format compressed-tensors|gguf --out DIR
    autoao worker --storage postgresql://... --study NAME [--model ...] [--device cuda:1]

Bad input prints one line `autoao: error: ...` and exits with status 2 (no traceback).

One module per subcommand (kernels, search, worker, apply; tools: report, cache, export), each
with `add_parsers(subparsers)`, which adds its subcommand(s) and sets `func`, the function that
runs it; args.py holds what several share (CLIError, --candidates, --device, --model). Here:
the parser they make up, and `main`, which runs a command and turns its errors into exit statuses.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from autoao.cli import apply, kernels, search, tools, worker
from autoao.cli.args import CLIError
from autoao.ledger import Interrupted

__all__ = ["CLIError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The `autoao` parser: every subcommand, in the order `autoao --help` lists them."""
    p = argparse.ArgumentParser(prog="autoao", description="Accuracy-aware per-layer quantization "
                                "and 2:4 sparsity search for PyTorch.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in (kernels, search, worker, apply, tools):
        module.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (argv: sys.argv[1:] when None); returns the exit status: 0, 2 for bad input
    (one `autoao: error:` line) or no command (the help), an interrupted run's exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CLIError as e:
        print(f"autoao: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # a run stopped by SIGINT / SIGTERM: it wrote its best verified plan
        print(f"autoao: interrupted by {e.name}: kept {e.kept or 'nothing (stopped before any plan could be judged)'}",
              file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("autoao: interrupted", file=sys.stderr)
        return 130
