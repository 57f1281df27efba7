#!/usr/bin/env bash
# Issue 25 on a 2-core Intel Xeon with AMX (amx_bf16, amx_int8): the 1.5B's target in bfloat16
# (packed oneDNN), w8a8 and int4, each run beside llama.cpp's plain decoding of the packaged Q4_K_M
# file, methods interleaved per prompt: 10 HumanEval + 10 MT-Bench turn 1, T=0, 128 new tokens,
# bfloat16 activations, the shipped grown drafter in int8 (its fastest draft here: draft.txt).
# One file per scheme; round costs measured first (profile-*.json). Resumable: rerun it.
# TAG=-bmm names a rerun's files apart (<scheme>-bmm.jsonl: after commit b5d2197's row-wise attention).
# DRAFTER=w8a8 runs the drafter on the target's w8a8 kernel (default int8: dynamic, fbgemm).
# METHODS: the methods besides llama.cpp (default ar,ddtree:8,taps:32).
# OUT: another CPU's folder (default this one), e.g. OUT=results/quantized-targets/zen5 on a Zen 5 EPYC,
# where llama-cpp-python is pip's default native build (`pip wheel --no-deps llama-cpp-python==0.3.36`).
# llama-cpp-python 0.3.36 built natively minus AMX (README.md here: its AMX build crashes on this
# machine), wheel made once with
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
#     -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
#   pip wheel --no-deps llama-cpp-python==0.3.36
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/quantized-targets/xeon-amx}
TAPS=${TAPS:-.venv/bin/taps}
COMMON="--target qwen2.5-coder-1.5b --dtype bfloat16 --datasets humaneval,mt-bench --turns 1 --limit 10 \
    --temperatures 0 --max-new-tokens 128 --drafter-quant ${DRAFTER:-int8}"
TAG=${TAG:-}
for quant in ${SCHEMES:-w8a8 none int4}; do
    PROFILE=$OUT/profile-$quant$TAG-draft-${DRAFTER:-int8}.json
    [ -f $PROFILE ] || $TAPS profile --target qwen2.5-coder-1.5b --dtype bfloat16 --target-quant $quant \
        --drafter-quant ${DRAFTER:-int8} --sizes 0,1,3,7,15,31,63 --contexts 256 --repeats 3 --out $PROFILE
    $TAPS bench $COMMON --target-quant $quant --profile $PROFILE --methods ${METHODS:-ar,ddtree:8,taps:32},llama-cpp \
        --out $OUT/$quant$TAG.jsonl
    $TAPS report $OUT/$quant$TAG.jsonl --out $OUT/report-$quant$TAG --complete-only
done
