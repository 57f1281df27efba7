#!/usr/bin/env bash
# Issue 22 item 3b: a DFlash-layout drafter for smollm2-135m whose two layers start from the
# target's own last two decoder layers (--init-layers last; docs/method.md 2.3) instead of random
# weights, on the doubled self-distilled data (data/drafters/smollm2-135m/distill-2x.jsonl: 1,104
# greedy float32 answers, 247K tokens), with the shipped drafter's other settings (2 layers, block
# 8, target layers 1/10/18/27, an 8,192-token draft vocabulary, soft labels at 0.5), blocks in the
# answers only, one epoch, bfloat16 autocast. INIT=first starts from its first two layers, random from random
# weights, the comparison on the same held-out blocks. The run folder lives under the taps home;
# rerun the same command to resume.
# grown: no DFlash model at all, the target itself as the base of a grown drafter whose LoRA adapters
# act on the mask rows only (--adapt masks): its root row is the target's own next-token row, so
# slot 1 is the target's greedy token up to the drafter's int8/bf16 rounding, and the adapters learn
# slots 2-8 (the qwen grown recipe: rank 16, 24 blocks a sequence; README "smollm2 grown from itself").
#     results/drafter-distill/train-smollm2.sh [last|first|random|grown]
set -euo pipefail
cd "$(dirname "$0")/../.."
INIT=${1:-last}
DATA=data/drafters/smollm2-135m/distill-2x.jsonl
if [ "$INIT" = grown ]; then
    RUN=${TAPS_HOME:-$HOME/.cache/taps}/runs/train-smollm2-grown-masks
    .venv/bin/taps train-drafter --target smollm2-135m --kind grown --base smollm2-135m --adapt masks \
        --data "$DATA" --out "$RUN" --mask-token-id 4 --block-size 8 --lora-rank 16 \
        --anchors-per-sequence 24 --max-seq-len 384 --epochs 1 --eval-every 50 --save-every 25 \
        --eval-sequences 16 --scorer-prompts 0 --dtype bfloat16 --no-progress
    cp "$RUN/log.jsonl" results/drafter-distill/smollm2-grown-masks-train_log.jsonl
    exit
fi
RUN=${TAPS_HOME:-$HOME/.cache/taps}/runs/train-smollm2-dflash-$INIT
.venv/bin/taps train-drafter --target smollm2-135m --kind dflash --init-layers "$INIT" \
    --data "$DATA" --out "$RUN" \
    --mask-token-id 4 --num-hidden-layers 2 --block-size 8 --target-layer-ids 1,10,18,27 \
    --draft-vocab-size 8192 --anchors-per-sequence 32 --max-seq-len 384 --soft-label-weight 0.5 \
    --epochs 1 --eval-every 50 --save-every 25 --eval-sequences 16 --scorer-prompts 0 \
    --dtype bfloat16 --no-progress
cp "$RUN/log.jsonl" results/drafter-distill/smollm2-dflash-$INIT-train_log.jsonl
