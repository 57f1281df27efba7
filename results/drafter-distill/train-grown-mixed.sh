#!/usr/bin/env bash
# Issue 22: the grown drafter (qwen2.5-coder-0.5b + LoRA rank 16, all 24 layers, block 8; the
# shipped drafter's recipe) trained from the 0.5B on both self-distilled files at once: the 1.5B's
# greedy bfloat16 answers to 2,048 code/math/stdlib prompts (422K tokens) and to 1,024 chat prompts
# (244K tokens, taps.train.chat). One epoch's schedule over both (about 2,300 steps, 3.7 s a step on
# the 2-core EPYC: about 2.4 hours), held-out curves every 50 steps, bfloat16 autocast.
# The run folder lives under the taps home, not in the checkout: a checkout can be replaced between
# sessions (session 18's runs/ was lost that way), the taps home stays. Resumable: rerun the same
# command to continue from its state.pt (saved every 25 steps).
#     [DTYPE=float32] [MAX_STEPS=N [FROM=M]] [INIT=shipped|FOLDER [LR=x]] \
#         results/drafter-distill/train-grown-mixed.sh [l12|masks]
# DTYPE: bfloat16 (default) where the CPU has native bf16 kernels, float32 elsewhere (README).
# MAX_STEPS cuts the schedule to what one session's machine trains (README: a run's state does not
# survive a change of machine); the run folder then names the dtype and the steps. FROM=N (with
# MAX_STEPS above N) starts the run as a copy of the same variant's MAX_STEPS=N run (with INIT: of
# the same INIT and LR) and extends it: the data order and optimizer go on from step N, the
# learning rate warms up and decays again.
# INIT: start from the weights of a grown drafter folder of the same settings, or of the shipped one
# (--init-from), with a new schedule at peak learning rate LR (default 5e-4), on every answer file the
# shipped drafter never saw too: the chat and code second turns and the answers sampled at T=1
# (distill-vllm-{chat-followup,followup,t1}-bf16.jsonl, 131K + 151K + 64K tokens; session 33's run,
# before the last two existed, had the chat second turns only): how training goes on across
# machines, where a run folder does not survive (README). The run folder says "-from-".
# masks: the adapters act on the mask rows only (peft's activated LoRA, --adapt masks), so the
# root's row and the context's cache stay the 0.5B's (README: slot 1 fell in the runs without it).
# l12: the cheaper draft (docs/method.md 2.3): 12 of the 0.5B's 24 layers and a head of the data's
# 16,384 most frequent ids; int8, 256 tokens of context: 18.1 ms a draft against 34.6 ms for the
# whole 0.5B (2-core EPYC, same run), 0.30 of a w8a8 1.5B token instead of 0.57.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=data/drafters/qwen2.5-coder-1.5b
VARIANT=${1:-}
case "$VARIANT" in
    "") EXTRA=() ;;
    l12) EXTRA=(--base-layers 12 --draft-vocab-size 16384) ;;
    masks) EXTRA=(--adapt masks) ;;
    *) echo "train-grown-mixed.sh: unknown variant '$VARIANT' (give none, l12 or masks)" >&2; exit 2 ;;
esac
DTYPE=${DTYPE:-bfloat16}
name() {  # the run's name for a schedule of $1 steps (none: the whole epoch)
    echo "grown-mixed${VARIANT:+-$VARIANT}${1:+-$DTYPE-$1}${INIT:+-from-$(basename "$INIT")${LR:+-lr$LR}}"
}
NAME=$(name "${MAX_STEPS:-}")
DATA=($D/distill-vllm-bf16.jsonl $D/distill-vllm-chat-bf16.jsonl)
if [ -n "${INIT:-}" ]; then
    DATA+=($D/distill-vllm-chat-followup-bf16.jsonl $D/distill-vllm-followup-bf16.jsonl $D/distill-vllm-t1-bf16.jsonl)
    EXTRA+=(--init-from "$INIT")  # read only when the run folder holds no state.pt yet
fi
RUNS=${TAPS_HOME:-$HOME/.cache/taps}/runs
RUN=$RUNS/train-qwen-$NAME
if [ -n "${FROM:-}" ] && [ ! -d "$RUN" ]; then
    [ -n "${MAX_STEPS:-}" ] || { echo "train-grown-mixed.sh: FROM needs MAX_STEPS above it" >&2; exit 2; }
    SOURCE=$RUNS/train-qwen-$(name "$FROM")
    [ -d "$SOURCE" ] || { echo "train-grown-mixed.sh: no run $SOURCE to extend: run it with MAX_STEPS=$FROM first" >&2; exit 2; }
    cp -r "$SOURCE" "$RUN"
fi
.venv/bin/taps train-drafter --target qwen2.5-coder-1.5b --kind grown --base qwen2.5-coder-0.5b \
    --data "${DATA[@]}" --out "$RUN" \
    --mask-token-id 151662 --block-size 8 --lora-rank 16 --anchors-per-sequence 24 --max-seq-len 512 \
    --epochs 1 --lr "${LR:-5e-4}" --eval-sequences 16 --eval-every 50 --save-every 25 --scorer-prompts 0 \
    --dtype "$DTYPE" ${MAX_STEPS:+--max-steps "$MAX_STEPS"} --no-progress "${EXTRA[@]}"
cp "$RUN/log.jsonl" results/drafter-distill/$NAME-train_log.jsonl
