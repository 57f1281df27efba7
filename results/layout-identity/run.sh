#!/usr/bin/env bash
# Issue 18: after the layout redesign, every method's float32 output at T=0 on SmolLM2-135M must equal
# plain greedy decoding (`ar`) token for token: the report's `=ar` column is 1.00 for every method.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/layout-identity
.venv/bin/taps bench --target smollm2-135m --dtype float32 --datasets humaneval,mt-bench --turns 1 --limit 1 \
    --max-new-tokens 64 --budgets 8 \
    --methods ar,chain,ddtree,cost-aware,taps,taps+copy,taps+no-lookup,taps+no-scorer,taps+fixed,ddtree+copy \
    --out $OUT/results.jsonl
.venv/bin/taps report $OUT/results.jsonl --out $OUT
