#!/usr/bin/env bash
# Issue 19: "any small model as a drafter, no training": Qwen2.5-Coder-0.5B drafting for the 1.5B by
# its own greedy path (taps.drafters.sibling), against transformers' assisted generation with the
# same 0.5B as assistant. 10 HumanEval + 10 MT-Bench (turn 1) prompts, T=0, bfloat16, 128 new
# tokens, methods interleaved per prompt in one process. Resumable: rerun the same command.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/sibling-0.5b
PROFILE=$OUT/profile-bfloat16.json
[ -f $PROFILE ] || .venv/bin/taps profile --target qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b --dtype bfloat16 \
    --sizes 0,1,3,7,11,15,23,31 --contexts 256 --repeats 3 --out $PROFILE
.venv/bin/taps bench --target qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b --assistant qwen2.5-coder-0.5b \
    --dtype bfloat16 --profile $PROFILE --methods ar,chain:8,ddtree:8,taps:32,hf-assisted \
    --datasets humaneval,mt-bench --turns 1 --limit 10 --temperatures 0 --max-new-tokens 128 \
    --out $OUT/results.jsonl
.venv/bin/taps report $OUT/results.jsonl --out $OUT --complete-only
