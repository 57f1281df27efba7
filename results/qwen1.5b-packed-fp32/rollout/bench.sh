#!/bin/bash
# taps-rollout and chain-rollout (the block draft deepened along the grown drafter's greedy path) against
# taps, hf-assisted and ar, int8 drafters (taps' drafter and hf-assisted's assistant alike), interleaved per
# prompt, into rollout.jsonl, with a latency profile measured on this AVX-512 machine. Runs the code of commit b11ce9f, unpacked under runs/ (as ../bench.sh does);
# resumable: a rerun skips finished records.
set -e
cd "$(dirname "$0")/../../.."
REV=b11ce9f
SRC=runs/bench-src-$REV
[ -d $SRC ] || { mkdir -p $SRC.tmp && git archive $REV src | tar -x -C $SRC.tmp && mv $SRC.tmp $SRC; }
export PYTHONPATH=$PWD/$SRC/src
export TAPS_LINEAR=onednn-packed
OUT=results/qwen1.5b-packed-fp32
for d in humaneval mt-bench; do
  .venv/bin/taps bench --target qwen2.5-coder-1.5b --limit 10 --temperatures 0,1 --max-new-tokens 128 --dtype float32 \
    --drafter-quant int8 --profile $OUT/rollout/profile-float32-onednn-packed-draft-int8-avx512.json \
    --methods ar,taps:32,taps-rollout:64,chain-rollout:64,hf-assisted --datasets $d --turns 1 --out $OUT/rollout.jsonl
done
