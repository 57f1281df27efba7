"""Plain decoding of a bfloat16 target with taps.linear's padding of a few rows on large packed weights
(PackedOneDNNLinear: `pad`) and without it (`plain`: PAD_MIN_WEIGHTS out of reach), in one process, each way in
turn per prompt (ways.interleave), the first LIMIT HumanEval and MT-Bench (turn 1) prompts, 128 tokens, T=0. Writes
OUT (default bf16-pad-TARGET.jsonl) and prints per set each way's median tokens/s and pad's median paired ratio to
plain with a 95% bootstrap interval and how many prompts gave plain's tokens (ways.summarize).

    [TARGET=smollm2-135m] [LIMIT=5] .venv/bin/python results/quantized-targets/zen4/bf16-pad.py
"""

import os
from pathlib import Path

import ways

import taps
from taps import linear

HERE = Path(__file__).parent
TARGET = os.environ.get("TARGET", "qwen2.5-coder-1.5b")
LIMIT = int(os.environ.get("LIMIT", 5))
OUT = HERE / os.environ.get("OUT", f"bf16-pad-{TARGET}.jsonl")
SMALLEST = {"pad": linear.PAD_MIN_WEIGHTS, "plain": 1 << 62}  # the least weight each way pads


def setup(way: str) -> None:
    linear.PAD_MIN_WEIGHTS = SMALLEST[way]


# every run prefills its prompt whole (no reuse of the previous run's cache)
spec = taps.load(TARGET, dtype="bfloat16", method="ar", reuse_prefix=False)
records = ways.interleave(spec, OUT, LIMIT, ["ar"], tuple(SMALLEST), setup)
ways.summarize(records, ["ar"], tuple(SMALLEST), "plain")
