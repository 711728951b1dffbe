"""Each plan's speed-up in generate_bench.py's rounds as autoao reads a paired comparison
(autoao.clock.paired_speedup: the geometric mean of the rounds' ratios with its one-sided 95%
bounds), and that as a share of a forward-pass speed-up.

    python benchmarks/generate_paired.py DIR/generate.json [...] [--forward 1.454]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoao.clock import paired_speedup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="generate.json files generate_bench.py wrote")
    ap.add_argument("--forward", type=float, help="the forward-pass speed-up the plans' share is read against")
    args = ap.parse_args()
    for path in args.files:
        result = json.loads(path.read_text())
        for mode, row in result["modes"].items():
            base = [1 / s for s in row["rounds"]["as it came"]]  # seconds a token, per round
            for side, speeds in row["rounds"].items():
                if side == "as it came":
                    continue
                p = paired_speedup(base, [1 / s for s in speeds])
                share = (f"; {p.estimate / args.forward:.1%} ({p.low / args.forward:.1%} to "
                         f"{p.high / args.forward:.1%}) of {args.forward}x" if args.forward else "")
                print(f"{path}: {mode}, {side}: {p.estimate:.3f}x ({p.low:.3f} to {p.high:.3f}), {p.rounds} rounds{share}")


if __name__ == "__main__":
    main()
