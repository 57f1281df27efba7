#!/bin/bash
# Issue 4 in bfloat16: ddtree at budgets 8/16/32/64 and the taps ablations (no scorer, a fixed size,
# no lookup candidates) interleaved with ar and taps, into ablations.jsonl; the lookup ablation also
# on Spec-Bench summarization. Same settings as bench.sh. Resumable (taps bench refuses another CPU).
set -e
cd "$(dirname "$0")/../.."
. results/pinned.sh 6815c4c
OUT=results/qwen1.5b-bf16
COMMON="--target qwen2.5-coder-1.5b --temperatures 0,1 --max-new-tokens 128 --dtype bfloat16 --drafter-quant int8
  --profile $OUT/profile-bfloat16-onednn-packed-draft-int8.json --turns 1 --limit 10 --out $OUT/ablations.jsonl"
.venv/bin/taps bench $COMMON --datasets humaneval,mt-bench \
  --methods ar,ddtree:8,ddtree:16,ddtree:32,ddtree:64,taps:32,taps-noscorer:32,taps-fixed:32,taps-nolookup:32
.venv/bin/taps bench $COMMON --datasets spec-bench --spec-bench ../shared/data/spec_bench/question.jsonl \
  --categories summarization --methods ar,taps:32,taps-nolookup:32
