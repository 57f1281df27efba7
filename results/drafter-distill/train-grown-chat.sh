#!/usr/bin/env bash
# Issue 22: the grown drafter of train-grown.sh, warm-started from its step-1350 weights
# (runs/grown-distill-1350.state.pt, a copy of that run's state.pt at step 1350), trained on its
# data plus the 1.5B's greedy answers to 1,024 chat prompts (writing, role-play, explanations,
# comparisons, extraction: taps.train.chat; `taps gen-data --mix chat=1 --engine vllm`), since
# chat tau did not move on code, math and stdlib prompts alone. Same drafter settings; a schedule
# of 900 steps (--max-steps: warm-up, then decay within the time there is), lr 3e-4. Resumable:
# rerun the same command to continue from runs/train-qwen-grown-chat/state.pt.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=data/drafters/qwen2.5-coder-1.5b
.venv/bin/taps train-drafter --target qwen2.5-coder-1.5b --kind grown --base qwen2.5-coder-0.5b \
    --data $D/distill-vllm-bf16.jsonl $D/distill-vllm-chat-bf16.jsonl --out runs/train-qwen-grown-chat \
    --init-from runs/grown-distill-1350.state.pt --mask-token-id 151662 --block-size 8 --lora-rank 16 \
    --anchors-per-sequence 24 --max-seq-len 512 --epochs 1 --max-steps 900 --lr 3e-4 --eval-sequences 16 \
    --eval-every 50 --save-every 25 --scorer-prompts 0 --dtype bfloat16 --no-progress "$@"
cp runs/train-qwen-grown-chat/log.jsonl results/drafter-distill/grown-chat-train_log.jsonl
