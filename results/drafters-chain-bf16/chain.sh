#!/bin/bash
# Issue 3's closing measurement on the avx512_bf16 machine: chain decoding (one path of argmax
# tokens, 7 drafted) against plain decoding, temperature 0, bfloat16, at most 128 new tokens, on
# the first 10 HumanEval problems, the first 10 MT-Bench questions (first turn) and 10
# GSM-Symbolic problems (seed 1234), for both shipped drafters, interleaved per prompt. The 1.5B's
# grown drafter runs int8 (as in the headline bench); SmolLM2's DFlash drafter as shipped. The
# 1.5B's HumanEval and MT-Bench chain rows are those of the headline bench
# (results/qwen1.5b-bf16/results.jsonl: chain:7 beside ar, same settings); here it adds GSM-Symbolic.
# Resumable: a rerun skips finished records.
set -e
cd "$(dirname "$0")/../.."
. results/pinned.sh 5e8ba1d
OUT=results/drafters-chain-bf16
COMMON="--methods ar,chain:7 --turns 1 --limit 10 --temperatures 0
  --max-new-tokens 128 --dtype bfloat16"
.venv/bin/taps bench --target smollm2-135m $COMMON --datasets humaneval,mt-bench,gsm-symbolic --out $OUT/smollm2-135m.jsonl
.venv/bin/taps bench --target qwen2.5-coder-1.5b --drafter-quant int8 $COMMON --datasets gsm-symbolic \
  --out $OUT/qwen2.5-coder-1.5b.jsonl
