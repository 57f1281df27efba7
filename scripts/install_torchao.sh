#!/usr/bin/env bash
# `--target-quant w4a8` (int4 weights x int8 activations) multiplies on torchao's CPU kernel
# `da8w4_linear_cpu` (src/taps/weightonly.py, W4A8Product). torchao's x86 wheels, on PyPI and on
# download.pytorch.org, are built without its C++ CPU kernels (USE_CPU_KERNELS is set for aarch64
# only), so this builds torchao from its source with them, into a venv that already holds taps.
# Needs a C++ compiler; about 3 minutes on 2 cores. The kernel is fast only on CPUs with AMX, and
# taps' own AVX-512 VNNI kernel (taps.vnni) beats it there at a tree's row counts (docs/commands.md):
# taps uses torchao's where taps' cannot run, or where TAPS_W4A8_KERNEL=torchao asks for it.
# Usage: scripts/install_torchao.sh [VENV [SOURCE]]   (make install-torchao; default VENV .venv)
#   SOURCE: anything pip installs from: the default git tag, a local checkout, or a wheel built before.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
SOURCE=${2:-git+https://github.com/pytorch/ao@v0.18.0}
# USE_SYSTEM_LIBS: skip cloning CUTLASS, a CUDA-only submodule
USE_CPU_KERNELS=1 USE_CPP=1 USE_SYSTEM_LIBS=1 "$VENV/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation --no-deps -c constraints.txt "$SOURCE"
"$VENV/bin/python" -c "
import logging
logging.getLogger('torch.utils._pytree').setLevel(logging.ERROR)  # torchao's import notice (taps.cli does the same)
from taps.weightonly import check_target_quant
check_target_quant('w4a8')
import torchao
print(f'ok: torchao {torchao.__version__} with its CPU kernels; --target-quant w4a8 runs here')
"
