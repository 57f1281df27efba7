#!/usr/bin/env bash
# Which dtype taps should load a target in on a CPU without native bfloat16 kernels (AVX2 only):
# the 1.5B and its shipped drafter (int8), ar / chain / ddtree:8 / taps:16, the first 3 HumanEval
# prompts, 64 new tokens, T=0, once in float32 and once in bfloat16 (a bench file holds one dtype,
# so the two files run one after the other on a quiet machine), then the forward time of N rows and
# plain decoding outside the bench, both dtypes interleaved (the JSONL files gain a line per run).
#     results/dtype-avx2/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/dtype-avx2
for dt in float32 bfloat16; do
    rm -f $OUT/q15-$dt.jsonl
    .venv/bin/taps bench --target qwen2.5-coder-1.5b --methods ar,chain,ddtree:8,taps:16 --datasets humaneval \
        --limit 3 --max-new-tokens 64 --dtype $dt --drafter-quant int8 --out $OUT/q15-$dt.jsonl
done
.venv/bin/python $OUT/rows.py smollm2-135m 1,8,32,256,1024 >> $OUT/rows.jsonl
.venv/bin/python $OUT/rows.py qwen2.5-coder-1.5b 1,8,32,256 >> $OUT/rows.jsonl
.venv/bin/python $OUT/decode.py smollm2-135m 32 3 >> $OUT/decode.jsonl
.venv/bin/python $OUT/decode.py qwen2.5-coder-1.5b 16 2 >> $OUT/decode.jsonl
