#!/usr/bin/env bash
# Issue 22's HumanEval goals for the 1.5B (chain tau >= 3.5, taps tau >= 4.5 at <= 32 nodes; bfloat16, T=0)
# with the shipped grown drafter unquantized (QUANT=none) and as `--drafter-quant auto` runs it here (QUANT=auto:
# w4a8 on taps.vnni, its head in int4), on a 2-core AMD EPYC Zen 4 (session 51): chain:7 and taps:32 against
# plain decoding, interleaved per prompt, the first 10 HumanEval prompts, 128 new tokens, the bfloat16 target.
# Profile: results/quantized-targets/zen4's bfloat16 one, refitted online. Resumable: rerun it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=results/drafter-distill/status-zen4
QUANT=${QUANT:-none}
.venv/bin/taps bench --target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval --limit 10 --temperatures 0 \
    --max-new-tokens 128 --methods ar,chain:7,taps:32 --drafter-quant $QUANT \
    --profile results/quantized-targets/zen4/profile-none-draft-w4a8.json --out $HERE/drafter-$QUANT.jsonl
.venv/bin/taps report $HERE/drafter-$QUANT.jsonl --out $HERE/report-$QUANT --complete-only
