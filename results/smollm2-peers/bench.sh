#!/usr/bin/env bash
# Issue 23's hf-dflash peer: transformers' own DFlash speculation (speculation_type="dflash") runs
# only where a DFlash-layout drafter exists for the target, which among the shipped drafters is
# SmolLM2-135M's. This puts it beside taps' methods and the other transformers peers on the same
# drafter: ar, hf-generate, chain:7, ddtree:8, taps:32, hf-dflash and prompt lookup interleaved
# per prompt, 10 HumanEval + 10 MT-Bench (both turns), T=0 and T=1, 128 tokens a turn, bfloat16.
# Resumable (a rerun skips finished records); the latency profile is measured first, on the run's
# own machine. Then: taps report results/smollm2-peers/results.jsonl --out results/smollm2-peers
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/smollm2-peers
[ -f $OUT/profile.json ] || .venv/bin/taps profile --target smollm2-135m --dtype bfloat16 --out $OUT/profile.json
.venv/bin/taps bench --target smollm2-135m --temperatures 0,1 --max-new-tokens 128 --dtype bfloat16 \
  --profile $OUT/profile.json --methods ar,hf-generate,chain:7,ddtree:8,taps:32,hf-dflash,prompt-lookup \
  --datasets humaneval,mt-bench --limit 10 --out $OUT/results.jsonl
