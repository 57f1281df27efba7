#!/usr/bin/env bash
# `+pause` (taps.gate) beside the same methods without it, where speculation pays and where it does
# not: the 1.5B with w8a8 weights (a cheap token, trees nearly free) and int4 weights (a cheap token,
# every tree row a quarter of one), the shipped grown drafter on w8a8 products, 10 HumanEval + 10
# MT-Bench turn 1, T=0, 128 new tokens, bfloat16 activations, methods interleaved per prompt. One
# file per target scheme, named by the CPU kind (CPU=, e.g. zen5-avx512bf16); round costs measured
# first (profile-*.json). Resumable: rerun it.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/pause
TAPS=${TAPS:-.venv/bin/taps}
CPU=${CPU:?name the CPU kind, e.g. CPU=zen5-avx512bf16}
COMMON="--target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval,mt-bench --turns 1 --limit 10 \
    --temperatures 0 --max-new-tokens 128 --drafter-quant w8a8"
for quant in ${SCHEMES:-w8a8 int4}; do
    case $quant in int4) B=3 ;; *) B=8 ;; esac  # each scheme's best fixed ddtree budget
    PROFILE=$OUT/profile-$CPU-$quant-draft-w8a8.json
    [ -f $PROFILE ] || $TAPS profile --target qwen2.5-coder-1.5b --dtype bfloat16 --target-quant $quant \
        --drafter-quant w8a8 --sizes 0,1,3,7,15,31,63 --contexts 256 --repeats 3 --out $PROFILE
    $TAPS bench $COMMON --target-quant $quant --profile $PROFILE \
        --methods ar,ddtree:$B,ddtree+pause:$B,taps:32,taps+pause:32 --out $OUT/$CPU-$quant.jsonl
    $TAPS report $OUT/$CPU-$quant.jsonl --out $OUT/report-$CPU-$quant --complete-only
done
