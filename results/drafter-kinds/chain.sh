#!/bin/bash
# Issue 3: the DFlash-layout drafter of train-dflash.sh decoding for qwen2.5-coder-1.5b, chain
# decoding (7 argmax tokens) against plain decoding, T=0, bfloat16, at most 128 new tokens,
# interleaved per prompt, the settings of the grown drafter's chain:7 rows in the headline bench
# (results/qwen1.5b-bf16/results.jsonl) and of results/drafters-chain-bf16/chain.sh. The DFlash
# drafter runs unquantized (it is a small part of a round). Resumable.
set -e
cd "$(dirname "$0")/../.."
. results/pinned.sh 90d1880
.venv/bin/taps bench --target qwen2.5-coder-1.5b --drafter runs/train-qwen-dflash/drafter \
  --methods ar,chain:7 --turns 1 --limit 10 --temperatures 0 --max-new-tokens 128 --dtype bfloat16 \
  --datasets humaneval,gsm-symbolic --out results/drafter-kinds/dflash-chain.jsonl
