"""The edge scorer beside the w4a8 1.5B (issues 22 and 25): taps:32 with the shipped drafter's scorer (`shipped`),
with the plain marginals (`marginals`: no scorer, no pass over the vocabulary for its entropies) and, where
CANDIDATE names a scorer folder (`taps train-scorer`'s scorer/), with that one (`candidate`). A scorer only ranks
a round's candidates, so every way gives the same tokens (docs/method.md section 4); what differs is tau, tree
size and a round's selection time. One process: the w4a8 1.5B and its shipped w4a8 drafter (loaded once), T=0, 128
tokens, each way in turn per prompt (taps.load's online profile one copy a way), the first LIMIT HumanEval and
MT-Bench (turn 1) prompts. Writes OUT (default scorer-ab.jsonl) and prints per set each way's median tokens/s, tau
and stage ms a round and each other way's median paired ratio of tokens/s to `shipped` (ways.summarize).

    CANDIDATE=$TAPS_HOME/runs/RUN/scorer .venv/bin/python results/quantized-targets/zen4/scorer-ab.py   # LIMIT=20
"""

import copy
import os
from pathlib import Path

import ways

import taps
from taps.scorer import EdgeScorer

HERE = Path(__file__).parent
LIMIT = int(os.environ.get("LIMIT", "20"))
OUT = HERE / os.environ.get("OUT", "scorer-ab.jsonl")
CANDIDATE = os.environ.get("CANDIDATE")

# every run prefills its prompt whole (no reuse of the previous run's cache)
base = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8", profile=HERE / "profile-w4a8-fused-draft-w4a8.json", reuse_prefix=False)
scorers = {"shipped": base.scorer, "marginals": None}
if CANDIDATE:
    scorers["candidate"] = EdgeScorer.load(CANDIDATE)
WAYS = tuple(scorers)
kept = {way: copy.deepcopy(base.profile) for way in WAYS}  # each way's tree sizes learn from its own rounds


def setup(way: str) -> None:
    base.scorer, base.profile = scorers[way], kept[way]


records = ways.interleave(base, OUT, LIMIT, ["taps:32"], WAYS, setup)
ways.summarize(records, ["taps:32"], WAYS, "shipped")
