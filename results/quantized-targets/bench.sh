#!/usr/bin/env bash
# Issue 25: the 1.5B with its weights in bfloat16, int8 and int4 (taps.weightonly), plain decoding
# against taps' tree methods, on 10 code (HumanEval) and 10 chat (MT-Bench turn 1) prompts, T=0,
# 128 new tokens, bfloat16 activations, methods interleaved per prompt. One file per scheme (the
# scheme is pinned in it); the drafter (the shipped grown 0.5B) runs int4 beside the int4 target,
# as profiled by profile.sh. Resumable: rerun the same command.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/quantized-targets
COMMON="--target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval,mt-bench --turns 1 --limit 10 \
    --temperatures 0 --max-new-tokens 128"
.venv/bin/taps bench $COMMON --target-quant int4 --drafter-quant int4 --profile $OUT/profile-bfloat16-int4-draft-int4.json \
    --methods ar,ddtree:3,taps --out $OUT/int4.jsonl
.venv/bin/taps bench $COMMON --target-quant int8 --profile $OUT/profile-bfloat16-int8.json \
    --methods ar,ddtree:3,taps --out $OUT/int8.jsonl
.venv/bin/taps bench $COMMON --profile $OUT/profile-bfloat16-none.json --methods ar,ddtree:8,taps --out $OUT/bfloat16.jsonl
# llama.cpp with its own speculation (issue 25): plain, drafting with the 0.5B's GGUF, prompt lookup,
# beside taps' plain decoding of the int4 target, interleaved per prompt, in a file of their own
.venv/bin/taps bench $COMMON --target-quant int4 --methods ar,llama-cpp,llama-cpp-draft,llama-cpp-lookup \
    --assistant qwen2.5-coder-0.5b --out $OUT/llama-speculation.jsonl
.venv/bin/taps report $OUT/llama-speculation.jsonl --out $OUT/report-llama-speculation --complete-only
for scheme in int4 int8 bfloat16; do
    .venv/bin/taps report $OUT/$scheme.jsonl --out $OUT/report-$scheme --complete-only
done
