#!/usr/bin/env bash
# Issue 22 item 4: the TAPS edge scorer for a snapshot of a grown drafter (chain.sh makes them),
# trained on verification traces of the 1.5B on 48 training prompts of every kind, chat among
# them (--prompt-mix; the shipped scorer saw 12 code/math/stdlib prompts), 8 held out for the
# guard (a scorer that selects worse 32-node trees than the plain marginals is not kept), pools
# of 96 nodes (with pools of 32 every scorer's 32-node cut is the whole pool and the guard
# compares nothing: session 20 saw 2.463 against 2.469; now refused), 64 new tokens a prompt,
# bfloat16 (labels from the bfloat16 target: a scorer only ranks nodes, the target still verifies
# every one). Traces are recorded once and reused.
#     [DTYPE=float32] [PROMPTS=N] [TARGET=smollm2-135m] \
#         results/drafter-distill/scorer.sh RUN STEP
# (the snapshot $TAPS_HOME/runs/grown-RUN-STEP; TARGET: a drafter of that target, traces of it).
# DTYPE: bfloat16 (default) where the CPU has native bf16 kernels, float32 elsewhere; PROMPTS
# (default 48, 8 of them held out) fits the recording to a slower machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${TAPS_HOME:-$HOME/.cache/taps}/runs
SNAPSHOT=$RUNS/grown-$1-$2
[ -d "$SNAPSHOT" ] || { echo "scorer.sh: no snapshot $SNAPSHOT: run chain.sh $1 $2 first" >&2; exit 2; }
DTYPE=${DTYPE:-bfloat16} PROMPTS=${PROMPTS:-48}
OUT=$RUNS/scorer-$1-$2-$DTYPE-p$PROMPTS
.venv/bin/taps train-scorer --target "${TARGET:-qwen2.5-coder-1.5b}" --drafter "$SNAPSHOT" --out "$OUT" \
    --prompts "$PROMPTS" --eval-prompts 8 --prompt-mix code-write=0.2,code-explain=0.15,math=0.2,general=0.2,chat=0.25 \
    --max-new-tokens 64 --pool-size 96 --dtype "$DTYPE" --no-progress
