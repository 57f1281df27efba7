#!/usr/bin/env bash
# Issue 22's record for the 1.5B on a 2-core AMD EPYC Zen 5 (session 48): the shipped grown drafter as
# `--drafter-quant auto` runs it here (w4a8 on taps.vnni, its head in int4), beside the bfloat16 target
# (the issue's goals are for bfloat16), chain:7, ddtree:8 and taps:32 against plain decoding (ar),
# interleaved per prompt in one process: the first 10 HumanEval, 10 MT-Bench (turn 1) and 10
# GSM-Symbolic prompts, T=0, 128 new tokens. Profile: the schemes-s48 run's bfloat16 one (measured with
# this drafter just before). Resumable: rerun it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=results/drafter-distill/status-zen5
.venv/bin/taps bench --target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval,mt-bench,gsm-symbolic --turns 1 \
    --limit 10 --temperatures 0 --max-new-tokens 128 --methods ar,chain:7,ddtree:8,taps:32 --drafter-quant auto \
    --profile results/quantized-targets/zen5/profile-none-s48-draft-w4a8.json --out $HERE/bf16.jsonl
.venv/bin/taps report $HERE/bf16.jsonl --out $HERE/report --complete-only
