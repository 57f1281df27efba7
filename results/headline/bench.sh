#!/bin/bash
# Issue 23's headline: Qwen2.5-Coder-1.5B in bfloat16 at 30 prompts per set, both temperatures,
# every set the issue names (HumanEval; MT-Bench turns 1 and 2; Spec-Bench's math_reasoning,
# summarization, translation, rag and qa), with the peers a CPU user would pick beside taps:
# plain transformers generate, assisted generation with the 0.5B, prompt lookup. Every method
# interleaved per prompt in one process (taps bench), 128 tokens a turn, the grown drafter and
# the assistant in int8 beside the bfloat16 target, as results/qwen1.5b-bf16/bench.sh did at 10.
# Code of a pinned commit (results/pinned.sh) so the run may span sessions while src/ moves on;
# taps bench refuses to add another CPU's records, so only machines of the first record's kind
# extend it. Resumable: a rerun skips finished records. It fills every set to 10 prompts, then
# 20, then 30, so a partial file is balanced across sets. The latency profile is measured once,
# on the run's own machine, before the first record.
# Then: taps report results/headline/results.jsonl --out results/headline
set -e
cd "$(dirname "$0")/../.."
. results/pinned.sh bd6ebbf
OUT=results/headline
PROFILE=$OUT/profile.json
[ -f $PROFILE ] || .venv/bin/taps profile --target qwen2.5-coder-1.5b --dtype bfloat16 --drafter-quant int8 \
  --out $PROFILE
M=ar,hf-generate,chain:7,ddtree:8,taps:32,hf-assisted,prompt-lookup
COMMON="--target qwen2.5-coder-1.5b --temperatures 0,1 --max-new-tokens 128 --dtype bfloat16 --drafter-quant int8
  --profile $PROFILE --methods $M --out $OUT/results.jsonl"
for n in 10 20 30; do
  .venv/bin/taps bench $COMMON --limit $n --datasets humaneval,mt-bench
  .venv/bin/taps bench $COMMON --limit $n --datasets spec-bench \
    --categories math_reasoning,summarization,translation,rag,qa
done
