#!/usr/bin/env bash
# Issue 25's comparison in one run: taps on the w8a8 1.5B (plain decoding, ddtree:8, taps; the
# shipped grown drafter in int8) beside llama.cpp on the packaged Q4_K_M file (plain, and drafting
# with the 0.5B's Q4_K_M file), interleaved per prompt, on the prompts of bench.sh (10 HumanEval,
# 10 MT-Bench turn 1, T=0, 128 new tokens, bfloat16 activations). llama-cpp-python 0.3.36 as
# pip builds it by default (native: on the 2-core AMD EPYC its system info lists AVX512, VNNI,
# BF16). The round costs are measured first, on this machine. Resumable: rerun the same command.
#     results/quantized-targets/same-run.sh [NAME] [DRAFTER]   (NAME: the files' suffix)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/quantized-targets
NAME=${1:-shipped}
DRAFTER=${2:-}
PROFILE=$OUT/profile-same-run-$NAME.json
[ -f $PROFILE ] || .venv/bin/taps profile --target qwen2.5-coder-1.5b --dtype bfloat16 --target-quant w8a8 \
    --drafter-quant int8 ${DRAFTER:+--drafter $DRAFTER} --sizes 0,1,3,7,15,31 --contexts 256 --repeats 3 --out $PROFILE
.venv/bin/taps bench --target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval,mt-bench --turns 1 --limit 10 \
    --temperatures 0 --max-new-tokens 128 --target-quant w8a8 --drafter-quant int8 ${DRAFTER:+--drafter $DRAFTER} \
    --profile $PROFILE --assistant qwen2.5-coder-0.5b --methods ar,ddtree:8,taps,llama-cpp,llama-cpp-draft \
    --out $OUT/same-run-$NAME.jsonl
.venv/bin/taps report $OUT/same-run-$NAME.jsonl --out $OUT/report-same-run-$NAME --complete-only
