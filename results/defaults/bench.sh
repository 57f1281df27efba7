#!/usr/bin/env bash
# What a user gets with no flags (issue 22's closing table): taps' defaults for TARGET on this
# machine (dtype, linear kernel, drafter precision, shipped drafter and scorer), its latency
# profile first (`taps profile`, saved beside the records), then ar, chain:7, ddtree:8 and taps:32
# interleaved per prompt on the first LIMIT (10) HumanEval problems, MT-Bench questions (turn 1)
# and GSM-Symbolic problems, T=0, 128 new tokens. Resumable: a rerun runs what the file lacks.
#     [LIMIT=10] results/defaults/bench.sh TARGET OUT_NAME
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=results/defaults
PROFILE=$DIR/profile-$2.json
[ -f "$PROFILE" ] || .venv/bin/taps profile --target "$1" --out "$PROFILE"
.venv/bin/taps bench --target "$1" --profile "$PROFILE" --methods ar,chain:7,ddtree:8,taps:32 \
    --datasets humaneval,mt-bench,gsm-symbolic --turns 1 --limit "${LIMIT:-10}" --max-new-tokens 128 \
    --out "$DIR/$2.jsonl"
.venv/bin/taps report "$DIR/$2.jsonl" --out "$DIR/report-$2" > /dev/null
