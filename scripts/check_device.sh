#!/usr/bin/env bash
# The float32 exactness tests on tiny random models, run on an accelerator: every method, every
# test drafter, the max_new_tokens / stop / context boundaries, against transformers' greedy
# generate on the same device. Usage: scripts/check_device.sh [cuda|mps|cpu] (default cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cuda}
.venv/bin/python -c "import torch, sys; d = sys.argv[1]; ok = d == 'cpu' or (d == 'cuda' and torch.cuda.is_available()) \
    or (d == 'mps' and torch.backends.mps.is_available()); print(f'device {d}:', 'present' if ok else 'not present'); \
    sys.exit(0 if ok else 1)" "$DEVICE"
TAPS_TEST_DEVICE=$DEVICE .venv/bin/pytest -q -m "slow or not slow" tests/test_decode_tiny.py \
    -k "greedy_equals or boundary or stop_token or context_limit or autoregressive"
