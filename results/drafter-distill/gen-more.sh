#!/usr/bin/env bash
# Issue 22 item 1, the data past 1M answer tokens for qwen2.5-coder-1.5b: second turns and sampled
# answers, beside the greedy first turns the grown drafters train on now (distill-vllm-bf16.jsonl:
# 422K answer tokens; distill-vllm-chat-bf16.jsonl: 190K). Through vLLM's CPU engine
# (make install-vllm), bfloat16, 256 new tokens an answer; each step resumes where it stopped, so
# rerun the script until it says nothing is left. In order:
#   1. follow-ups after the 1,024 chat first turns (taps.train.followup: "make it shorter", ...)
#   2. follow-ups after the first 1,024 code/math/stdlib first turns ("add tests", "explain it", ...)
#   3. answers sampled at T=1 (the law sampled decoding verifies against) to 512 prompts of the
#      default mix and 512 chat prompts, seed 1 (other prompts than the greedy files' seed 0)
#     results/drafter-distill/gen-more.sh
# To stop it, kill its process group (kill -- -PGID): vLLM's workers rename themselves (VLLM::Worker),
# so `pkill -f gen-data` leaves them holding ~7 GB each and part of a core.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=data/drafters/qwen2.5-coder-1.5b
GEN=(.venv-vllm/bin/taps gen-data --target qwen2.5-coder-1.5b --dtype bfloat16 --engine vllm)
"${GEN[@]}" --out $D/distill-vllm-chat-followup-bf16.jsonl --prompts 1024 --follow-up $D/distill-vllm-chat-bf16.jsonl
"${GEN[@]}" --out $D/distill-vllm-followup-bf16.jsonl --prompts 1024 --follow-up $D/distill-vllm-bf16.jsonl
"${GEN[@]}" --out $D/distill-vllm-t1-bf16.jsonl --prompts 512 --temperature 1 --seed 1
"${GEN[@]}" --out $D/distill-vllm-chat-t1-bf16.jsonl --prompts 512 --temperature 1 --seed 1 --mix chat=1
