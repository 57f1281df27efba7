#!/bin/bash
# Copy rounds (taps-copy, taps-rollout-copy) against taps-rollout and transformers' prompt lookup
# decoding, where answers repeat their prompt (HumanEval rewrites the function it is given,
# summaries quote their article): same settings as bench.sh, its own file (copy.jsonl, its own ar).
# Resumable: a rerun skips finished records (taps bench refuses to add another CPU's runs).
set -e
cd "$(dirname "$0")/../.."
. results/pinned.sh 395dd4f
OUT=results/qwen1.5b-bf16
PROFILE=$OUT/profile-bfloat16-onednn-packed-draft-int8.json
M=ar,taps-copy:32,taps-rollout:64,taps-rollout-copy:64,prompt-lookup
COMMON="--target qwen2.5-coder-1.5b --temperatures 0,1 --max-new-tokens 128 --dtype bfloat16 --drafter-quant int8
  --profile $PROFILE --methods $M --turns 1 --limit 5 --out $OUT/copy.jsonl"
.venv/bin/taps bench $COMMON --datasets humaneval
.venv/bin/taps bench $COMMON --datasets spec-bench --spec-bench ../shared/data/spec_bench/question.jsonl --categories summarization
