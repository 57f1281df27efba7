#!/bin/bash
# Issue 3: the two drafter kinds on the same target. A DFlash-layout drafter for
# qwen2.5-coder-1.5b, trained on the same data as the shipped grown drafter
# (data/drafters/qwen2.5-coder-1.5b/train.jsonl: 80K tokens of standard-library source), with the
# same seed, held-out split (4 sequences), anchors per sequence (24), block size (8), sequence
# length (384), one epoch's schedule stopped at step 150 of 205 (where the grown run was stopped)
# and evaluation every 25 steps, so both learning curves are measured on
# the very same held-out blocks. The DFlash levers of the SmolLM2 recipe: 2 layers shaped like the
# target, 4 target layers, an 8K draft vocabulary, soft labels at weight 0.5. bfloat16 (the grown
# drafter trained in float32 on an AVX2 machine, where bfloat16 backward passes crawled).
# Resumable: rerunning continues from runs/train-qwen-dflash/state.pt (without --stop-after-steps:
# to the end of the schedule).
set -e
cd "$(dirname "$0")/../.."
.venv/bin/taps train-drafter --target qwen2.5-coder-1.5b --kind dflash \
  --data data/drafters/qwen2.5-coder-1.5b/train.jsonl --out runs/train-qwen-dflash \
  --mask-token-id 151662 --num-hidden-layers 2 --block-size 8 --target-layer-ids 1,9,17,25 \
  --draft-vocab-size 8192 --anchors-per-sequence 24 --max-seq-len 384 --soft-label-weight 0.5 \
  --epochs 1 --stop-after-steps 150 --eval-sequences 4 --eval-every 25 --save-every 25 --dtype bfloat16
cp runs/train-qwen-dflash/log.jsonl results/drafter-kinds/dflash-train_log.jsonl
