"""`autoao export RUN_DIR --format compressed-tensors|gguf --out DIR [--target ENGINE]`.

The CLI wires it with two calls: `add_parser(subparsers)` where it builds its subcommands, and
`run(args)` for the parsed arguments. `run` raises ValueError (ExportError included) with a message
naming the bad argument, file or layers; the CLI prints it as one `autoao: error:` line and exits 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoao.export.exporter import FORMATS, SERVING_FILE, export
from autoao.export.targets import TARGETS


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `export` subcommand to the CLI's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "export", help="write a searched model as a checkpoint a serving engine loads",
        description="Write the model of an `autoao search` run as a directory a serving engine loads: "
                    "compressed-tensors (vLLM, SGLang, transformers) or GGUF (llama.cpp), holding autoao's own "
                    "codes and scales, with SERVING.md. What the format or engine cannot hold is refused with "
                    "the layers named; the export is loaded back and checked before it is published.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the search's output directory (--out of autoao search)")
    p.add_argument("--format", required=True, choices=list(FORMATS), help="checkpoint format")
    p.add_argument("--out", required=True, metavar="DIR", help="the directory to write (new or empty)")
    p.add_argument("--target", choices=[n for n, t in TARGETS.items() if t.format is not None], default=None,
                   help="the engine whose rules the export must meet (default: the plan's own target when it "
                        "loads the format, else vllm for compressed-tensors and llama.cpp for gguf)")
    return p


def run(args: argparse.Namespace) -> int:
    """Export as `add_parser`'s arguments say; print where it went. Returns 0; raises ValueError
    (one clear message) for bad input or a plan the format cannot hold."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"RUN_DIR {run_dir} is not a directory (give the --out directory of an autoao search)")
    out = export(run_dir, args.format, args.out, target=args.target)
    print(f"wrote {out} ({args.format}); how to serve it: {out / SERVING_FILE}")
    return 0
