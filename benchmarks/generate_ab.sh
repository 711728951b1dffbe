#!/usr/bin/env bash
# One generate_bench.py run from two checkouts of autoao in turn (A B A B ...), one process each, on
# one machine: what a change to the product does to the generate() a user runs. A is the folder
# OLD_TREE (autoao/ and its sub-package folders of another commit, e.g. from `git archive COMMIT
# autoao kernels search_space evaluators reports | tar -x -C .carry_old`); B is this working tree.
# Both run this tree's generate_bench.py. Writes OUT/a-N/generate.json, OUT/b-N/generate.json and
# OUT/ab.md (per run: each side's tokens/s, the plans' ratios, and with --profile the host ms a
# token of dynamo's cache lookups, where a plan's guards are evaluated).
#
#   bash benchmarks/generate_ab.sh OLD_TREE TURNS OUT [generate_bench.py arguments but --out]
set -euo pipefail
old=$1 turns=$2 out=$3
shift 3
base=${PYTHONPATH:-}
export PYTHONUNBUFFERED=1

layout() {  # the package as pyproject.toml maps it, from tree $1 into $2 (as device_env.sh does)
  rm -rf "$2" && mkdir -p "$2" && cp -r "$1/autoao" "$2/"
  for d in search_space kernels evaluators reports; do ln -s "$(cd "$1" && pwd)/$d" "$2/autoao/$d"; done
}
layout "$old" /tmp/autoao_a
layout . /tmp/autoao_b
for i in $(seq 1 "$turns"); do
  for side in a b; do
    PYTHONPATH="/tmp/autoao_$side${base:+:$base}" python3 benchmarks/generate_bench.py "$@" --out "$out/$side-$i"
    rm -f "$out/$side-$i/generate.md"
  done
done
python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
lines = [f"{p.parent.name}: autoao from {json.loads(p.read_text())['autoao_from']}  " for p in sorted(out.glob("*-*/generate.json"))]
lines += ["", "| run | mode | side | tokens/s | ratio (range) | dynamo cache lookups, host ms a token |", "|---|---|---|---|---|---|"]
for path in sorted(out.glob("*-*/generate.json"), key=lambda p: (p.parent.name.split("-")[1], p.parent.name)):
    for mode, row in json.loads(path.read_text())["modes"].items():
        for side, speeds in row["rounds"].items():
            plan = row["plans"].get(side)
            ratio = f"{plan['ratio']:.3f}x ({plan['ratio_range'][0]:.3f}-{plan['ratio_range'][1]:.3f})" if plan else ""
            lookups = row.get("profile", {}).get(side, {}).get("dynamo cache lookups", {}).get("host_ms")
            tps = plan["tokens_per_s"] if plan else row["tokens_per_s"]
            lines.append(f"| {path.parent.name} | {mode} | {side} | {tps:.1f} | {ratio} | "
                         + (f"{lookups:.3f}" if lookups is not None else "") + " |")
(out / "ab.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
