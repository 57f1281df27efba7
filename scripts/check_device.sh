#!/usr/bin/env bash
# The float32 exactness tests on tiny random models, run on an accelerator: every method, every
# test drafter, the max_new_tokens / stop / context boundaries, taps.load's API, and the trained
# kinds (DFlash, grown with its rollouts) on random weights, against transformers' greedy generate
# on the same device; at T>0 the first two tokens' law against the target's (chi-square).
# Usage: scripts/check_device.sh [cuda|mps|cpu] [pytest options...] (default cuda; the options go
# to pytest, e.g. -n 12 where pytest-xdist and the cores are there).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cuda}
shift || true
.venv/bin/python -c "import torch, sys; d = sys.argv[1]; ok = d == 'cpu' or (d == 'cuda' and torch.cuda.is_available()) \
    or (d == 'mps' and torch.backends.mps.is_available()); print(f'device {d}:', 'present' if ok else 'not present'); \
    sys.exit(0 if ok else 1)" "$DEVICE"
TESTS="greedy_equals or api_decodes or boundary or stop_token or context_limit or autoregressive"
TESTS+=" or dflash_drafter_is_lossless or rollout_methods_decode or rollout_rows_are or first_tokens_follow"
TAPS_TEST_DEVICE=$DEVICE .venv/bin/pytest -q -m "slow or not slow" tests/test_decode_tiny.py tests/test_dflash.py \
    tests/test_grown.py tests/test_sampling.py -k "$TESTS" "$@"
