#!/usr/bin/env bash
# Issue 25: the 1.5B as w8a8 (int8 weights, each activation row quantized to int8 by its own scale,
# oneDNN's int8 inner product on prepacked weights: taps.weightonly), whose tree rows cost little more than one, unlike the weight-only
# kernels'. The round costs first (as profile.sh), then plain decoding against ddtree:8 and taps on
# the prompts of bench.sh (10 HumanEval, 10 MT-Bench turn 1, T=0, 128 new tokens, bfloat16
# activations, interleaved per prompt), the shipped grown drafter in int8 (as beside the bfloat16
# target of the headline). Resumable: rerun the same command. (w8a8.jsonl and report-w8a8/ are the
# same run with the kernel before it, torch._int_mm on plain int8 weights, of commit 669259b.)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/quantized-targets
PROFILE=$OUT/profile-bfloat16-w8a8-onednn-draft-int8.json
[ -f $PROFILE ] || .venv/bin/taps profile --target qwen2.5-coder-1.5b --dtype bfloat16 --target-quant w8a8 \
    --drafter-quant int8 --sizes 0,1,3,7,15,31,63 --contexts 256 --repeats 3 --out $PROFILE
.venv/bin/taps bench --target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval,mt-bench --turns 1 --limit 10 \
    --temperatures 0 --max-new-tokens 128 --target-quant w8a8 --drafter-quant int8 --profile $PROFILE \
    --methods ar,ddtree:8,taps --out $OUT/w8a8-onednn.jsonl
.venv/bin/taps report $OUT/w8a8-onednn.jsonl --out $OUT/report-w8a8-onednn --complete-only
