#!/usr/bin/env bash
# Issue 22: the grown drafter (qwen2.5-coder-0.5b + LoRA rank 16, all 24 layers, block 8) trained
# on the target's own greedy answers (data/drafters/qwen2.5-coder-1.5b/distill-vllm-bf16.jsonl,
# made by `taps gen-data --engine vllm`), not on standard-library source as the shipped one was.
# Same adapters, block and anchors as the shipped drafter's recipe (src/taps/shipped/
# qwen2.5-coder-1.5b/README.md), held-out curves every 50 steps on 16 held-out answers, bfloat16
# autocast (the weights stay float32). One epoch's schedule over the file; resumable: rerun the same
# command to continue from runs/train-qwen-grown-distill/state.pt (a run may stop anywhere).
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/taps train-drafter --target qwen2.5-coder-1.5b --kind grown --base qwen2.5-coder-0.5b \
    --data data/drafters/qwen2.5-coder-1.5b/distill-vllm-bf16.jsonl --out runs/train-qwen-grown-distill \
    --mask-token-id 151662 --block-size 8 --lora-rank 16 --anchors-per-sequence 24 --max-seq-len 512 \
    --epochs 1 --lr 5e-4 --eval-sequences 16 --eval-every 50 --save-every 25 --scorer-prompts 0 \
    --dtype bfloat16 --no-progress "$@"
cp runs/train-qwen-grown-distill/log.jsonl results/drafter-distill/grown-train_log.jsonl
