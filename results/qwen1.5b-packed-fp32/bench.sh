#!/bin/bash
# The headline benchmark of the README, as resumable steps into one results.jsonl: a rerun skips
# every finished record, so this script continues where an interrupted session stopped.
# Every step interleaves all methods per prompt in one process (float32, packed oneDNN weights).
set -e
cd "$(dirname "$0")/../.."
# The run spans several sessions, so it runs the code of one commit, unpacked once under runs/
# (ignored by git): development may go on in src/ meanwhile and every step still runs the same
# code. Decoding behaves as it did for the first steps (the changes since were reports and docs).
REV=1341cb6
SRC=runs/bench-src-$REV
[ -d $SRC ] || { mkdir -p $SRC.tmp && git archive $REV src | tar -x -C $SRC.tmp && mv $SRC.tmp $SRC; }
export PYTHONPATH=$PWD/$SRC/src
export TAPS_LINEAR=onednn-packed
OUT=results/qwen1.5b-packed-fp32
COMMON="--target qwen2.5-coder-1.5b --limit 10 --temperatures 0,1 --max-new-tokens 128 --dtype float32 --out $OUT/results.jsonl"
.venv/bin/taps bench $COMMON --methods ar,chain:7,ddtree:16,cost-aware:32,taps:32,hf-assisted --datasets humaneval
M=ar,chain:7,ddtree:16,cost-aware:32,taps:32,hf-assisted,prompt-lookup
.venv/bin/taps bench $COMMON --methods $M --datasets mt-bench --turns 1
SPEC="--datasets spec-bench --spec-bench ../shared/data/spec_bench/question.jsonl"
# Summarization also carries issue 4's lookup ablation (taps without n-gram lookup candidates).
.venv/bin/taps bench $COMMON --methods $M,taps-nolookup:32 $SPEC --categories summarization
# int8 drafters (--drafter-quant int8, taps.quantize, commit 85038dd): taps' drafter and hf-assisted's assistant both
# run int8 linear layers; its own file (one file never mixes drafter precisions), its own profile (timed with the
# int8 drafter at contexts 128/512/2048, read at each round's context).
INT8_SRC=runs/bench-src-85038dd
[ -d $INT8_SRC ] || { mkdir -p $INT8_SRC.tmp && git archive 85038dd src | tar -x -C $INT8_SRC.tmp && mv $INT8_SRC.tmp $INT8_SRC; }
for d in humaneval mt-bench; do
  PYTHONPATH=$PWD/$INT8_SRC/src .venv/bin/taps bench ${COMMON/results.jsonl/int8.jsonl} --drafter-quant int8 \
    --profile $OUT/profile-float32-onednn-packed-draft-int8.json --methods ar,taps:32,hf-assisted --datasets $d --turns 1
done
for c in math_reasoning translation; do
  .venv/bin/taps bench $COMMON --methods $M $SPEC --categories $c
done
# Copy rounds (taps-copy) against taps and prompt lookup on summarization, in their own file; the code of
# commit 85038dd reads the latency profile at each round's context, so this step has its own profile, timed at
# contexts 128/512/2048 (summarization prompts run 1-2K tokens).
PYTHONPATH=$PWD/$INT8_SRC/src .venv/bin/taps bench ${COMMON/results.jsonl/copy.jsonl} \
  --profile $OUT/profile-float32-onednn-packed-ctx.json --methods ar,taps:32,taps-copy:32,prompt-lookup $SPEC --categories summarization
# Issue 4: ddtree budgets and the taps ablations, interleaved with ar and taps in their own file.
A=ar,ddtree:8,ddtree:32,ddtree:64,taps:32,taps-noscorer:32,taps-fixed:32,taps-nolookup:32
for d in humaneval mt-bench; do
  .venv/bin/taps bench ${COMMON/results.jsonl/ablations.jsonl} --methods $A --datasets $d --turns 1
done
