#!/usr/bin/env bash
# Issue 25: what a round of the 1.5B costs with its weights in bfloat16, int8 and int4 (taps.weightonly)
# on this machine: one forward over a tree of 0-63 drafted nodes after 256 cached tokens, medians of
# 3 after warm-up, and the shipped grown drafter's call (in bfloat16, and in int4 beside the int4
# target). One profile JSON per scheme.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/quantized-targets
for quant in none int8 int4; do
    .venv/bin/taps profile --target qwen2.5-coder-1.5b --dtype bfloat16 --target-quant $quant \
        --sizes 0,1,3,7,15,31,63 --contexts 256 --repeats 3 --out $OUT/profile-bfloat16-$quant.json
done
.venv/bin/taps profile --target qwen2.5-coder-1.5b --dtype bfloat16 --target-quant int4 --drafter-quant int4 \
    --sizes 0,1,3,7,15,31,63 --contexts 256 --repeats 3 --out $OUT/profile-bfloat16-int4-draft-int4.json
