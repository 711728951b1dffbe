#!/bin/bash
# before/after alternating, ROUNDS rounds; one JSON line per process into OUT/raw.jsonl
OUT=${1:-/tmp/fwd-bench/out}; ROUNDS=${2:-5}
mkdir -p $OUT
cd /tmp/fwd-bench
for r in $(seq 1 $ROUNDS); do
  for side in before after; do
    PYTHONPATH=/tmp/fwd-pkg-$side /work/venv-forward/bin/python forward_bench.py $side >> $OUT/raw.jsonl 2>>$OUT/stderr.log
  done
done
echo finished >> $OUT/stderr.log
