#!/usr/bin/env bash
# Issue 22: chain decoding (7 argmax tokens) of a drafter trained on the target's own answers
# (a snapshot of a run's drafter/, copied to runs/grown-RUN-STEP) beside plain decoding, on the
# prompts of the shipped drafter's chain:7 rows (results/headline, results/drafters-chain-bf16):
# the first 10 HumanEval problems, 10 MT-Bench questions (turn 1) and 10 GSM-Symbolic problems
# (seed 1234), T=0, bfloat16, at most 128 new tokens, the drafter in int8 as beside the headline's
# target. tau at T=0 does not depend on the machine's speed, so it compares with those files'
# chain:7 tau. Snapshots and runs live under the taps home (train-grown-mixed.sh). With VOCAB, the
# snapshot's head keeps the training data's VOCAB most frequent ids (vocab.py). Resumable.
#     results/drafter-distill/chain.sh RUN STEP [VOCAB]   (RUN: mixed = train-grown-mixed.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=$1 STEP=$2 VOCAB=${3:-}
RUNS=${TAPS_HOME:-$HOME/.cache/taps}/runs
SNAPSHOT=$RUNS/grown-$RUN-$STEP
[ -d $SNAPSHOT ] || cp -r $RUNS/train-qwen-grown-$RUN/drafter $SNAPSHOT
NAME=grown-$RUN-$STEP
if [ -n "$VOCAB" ]; then
    NAME=$NAME-vocab$VOCAB
    [ -d $RUNS/$NAME ] || .venv/bin/python results/drafter-distill/vocab.py $SNAPSHOT $RUNS/$NAME $VOCAB
fi
COMMON="--target qwen2.5-coder-1.5b --methods ar,chain:7 --turns 1 --limit 10 --temperatures 0 --max-new-tokens 128
  --dtype bfloat16 --drafter-quant int8 --datasets humaneval,mt-bench,gsm-symbolic"
.venv/bin/taps bench $COMMON --drafter $RUNS/$NAME --out results/drafter-distill/$NAME-chain.jsonl
