#!/usr/bin/env bash
# Issue 19: taps installs beside another transformers release within its declared range.
# A fresh venv first gets transformers VERSION (default 5.22.2, another minor than the tested 5.19.0
# of constraints.txt), as a user's environment would already hold it; `pip install .` without the
# constraints must then resolve without replacing it, `pip check` must pass, and the installed
# package must decode SmolLM2 in float32 with every method equal to transformers' greedy generate.
# Needs PyPI (or a mirror); SmolLM2 comes from the taps cache ($TAPS_HOME), fetched if absent.
# Usage: scripts/check_install.sh [VERSION]      (make install-check)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-5.22.2}
PYTHON=${PYTHON:-python3.11}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
$PYTHON -m venv "$WORK/venv"
PIP="$WORK/venv/bin/pip"
# torch as tested (the CPU wheel of constraints.txt): the check is about transformers
TORCH=$(grep '^torch==' constraints.txt)
$PIP install -q --disable-pip-version-check "transformers==$VERSION" "$TORCH"
$PIP install -q --disable-pip-version-check .
$PIP check
cd "$WORK"  # import the installed package, not the checkout's src/
"$WORK/venv/bin/python" - "$VERSION" <<'PY'
import sys
from importlib.metadata import version

import torch
import transformers

import taps
from taps.methods import NAMES

assert transformers.__version__ == sys.argv[1], f"transformers {transformers.__version__} replaced {sys.argv[1]}"
spec = taps.load("smollm2-135m", method="ar", dtype="float32")
prompt = "Write a Python function that reverses a string."
ids = spec.encode(prompt)
expected = spec.target.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
for method in NAMES:
    got = taps.load(spec.target.model, method=method, tokenizer=spec.tokenizer).generate(prompt, max_new_tokens=32)
    assert got.token_ids == expected, f"{method} differs from transformers' greedy generate"
print(f"ok: taps-decode {version('taps-decode')} installed beside transformers {transformers.__version__}, torch "
      f"{torch.__version__}; {', '.join(NAMES)} equal transformers' greedy generate (SmolLM2, float32)")
PY
