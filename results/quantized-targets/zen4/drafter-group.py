"""The drafter's int4 groups (issue 22): the shipped grown drafter in w4a8 with groups of 32 inputs a scale and
minimum (`g32`, as --drafter-quant w4a8 packs it) against groups of 128 (`g128`: a quarter of the scales to read
and of the kernel's per-group epilogue, a coarser copy of the same weights). A drafter only proposes, so its grid
changes what a round costs and how much it accepts, never the tokens (docs/method.md section 4). One process:
the w4a8 1.5B (loaded once) beside each drafter, T=0, 128 tokens, METHODS per prompt each way in turn (taps.load's
online profile one copy a way), the first LIMIT HumanEval and MT-Bench (turn 1) prompts. Writes OUT (default
drafter-group.jsonl) and prints per set and method each way's median tokens/s, tau and stage ms a round, each other
way's median paired ratio of tokens/s to g32 with a 95% bootstrap interval, and how many prompts gave g32's tokens
(ways.summarize).

    .venv/bin/python results/quantized-targets/zen4/drafter-group.py  # LIMIT=10 METHODS=taps:32 WAYS=g32,g128

TARGET=smollm2-135m TARGET_QUANT=none: SmolLM2 in bfloat16 beside its shipped grown drafter (its inputs of 576 take
groups of 64 at most: WAYS=g32,g64). Session 55's runs: drafter-group.jsonl (LIMIT=10), drafter-group-20.jsonl
(LIMIT=20 WAYS=g32,g64,g128), drafter-group-smollm2.jsonl (the SmolLM2 line above, LIMIT=20).
"""

import copy
import os
from pathlib import Path

import ways

import taps
from taps import weightonly
from taps.drafters import load_drafter, shipped_drafter

HERE = Path(__file__).parent
LIMIT = int(os.environ.get("LIMIT", "10"))
METHODS = os.environ.get("METHODS", "taps:32").split(",")
OUT = HERE / os.environ.get("OUT", "drafter-group.jsonl")
TARGET = os.environ.get("TARGET", "qwen2.5-coder-1.5b")
TARGET_QUANT = os.environ.get("TARGET_QUANT", "w4a8")
# the 1.5B's: this folder's profile; another target's: the one `taps profile` saved for it (None: that one)
PROFILE = str(HERE / "profile-w4a8-fused-draft-w4a8.json") if TARGET == "qwen2.5-coder-1.5b" else None
WAYS = tuple(os.environ.get("WAYS", "g32,g128").split(","))  # gN: groups of N inputs; g32 first (the baseline)

# every run prefills its prompt whole (no reuse of the previous run's cache)
base = taps.load(TARGET, method="taps", budget=32, dtype="bfloat16", target_quant=TARGET_QUANT, drafter_quant="w4a8",
                 profile=PROFILE, reuse_prefix=False)
kept = {}  # way -> its drafter beside base's target, and a copy of the online profile of its own
for way in WAYS:
    weightonly.GROUP_SIZE = int(way[1:])  # read when a product is packed (the target's were, in groups of 32)
    drafter = base.drafter if way == "g32" else load_drafter(shipped_drafter(TARGET), base.target, quantize="w4a8")
    kept[way] = (drafter, copy.deepcopy(base.profile))
weightonly.GROUP_SIZE = 32


def setup(way: str) -> None:
    base.drafter, base.profile = kept[way]


records = ways.interleave(base, OUT, LIMIT, METHODS, WAYS, setup)

ways.summarize(records, METHODS, WAYS, "g32")
