#!/bin/bash
# Copy rounds whose continuations fall back from a 3-token match to 2 and 1 (as prompt lookup
# decoding falls back from 2 to 1), with acceptance rates per match length, against transformers'
# prompt lookup decoding on the 5 HumanEval and 5 summarization prompts of copy.sh: same settings,
# its own file (copy-fallback.jsonl, its own ar). copy.sh measured the 3-token-only planner.
# Resumable: a rerun skips finished records (taps bench refuses to add another CPU's runs).
set -e
cd "$(dirname "$0")/../.."
. results/pinned.sh 5e8ba1d
OUT=results/qwen1.5b-bf16
COMMON="--target qwen2.5-coder-1.5b --temperatures 0,1 --max-new-tokens 128 --dtype bfloat16 --drafter-quant int8
  --profile $OUT/profile-bfloat16-onednn-packed-draft-int8.json --methods ar,taps-copy:32,prompt-lookup --turns 1
  --limit 5 --out $OUT/copy-fallback.jsonl"
.venv/bin/taps bench $COMMON --datasets humaneval
.venv/bin/taps bench $COMMON --datasets spec-bench --spec-bench ../shared/data/spec_bench/question.jsonl --categories summarization
