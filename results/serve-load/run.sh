#!/usr/bin/env bash
# Issue 21: `taps serve` under a bounded loopback load: requests per minute, time to first token and
# inter-token latency (p50, p95) at concurrency 1, 4 and 16, short chat prompts, taps against ar in the
# same server build, server-side tau from /metrics. bfloat16, 16 requests per level, 32 tokens each.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/serve-load/load.jsonl
PORT=8765
for target in smollm2-135m qwen2.5-coder-1.5b; do
  for method in taps ar; do
    .venv/bin/taps serve --target $target --method $method --dtype bfloat16 --port $PORT --max-queue 32 \
        > runs/serve-$target-$method.log 2>&1 &
    pid=$!
    for _ in $(seq 600); do curl -sf http://127.0.0.1:$PORT/health > /dev/null && break; sleep 1; done
    .venv/bin/python scripts/load_test.py --url http://127.0.0.1:$PORT --concurrency 1,4,16 --requests 16 \
        --max-tokens 32 --note "$target $method bfloat16" --out $OUT
    kill -TERM $pid; wait $pid || true
  done
done
