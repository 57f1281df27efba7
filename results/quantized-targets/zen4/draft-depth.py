"""Drafts as deep as the last tree went plus one (taps.rounds.DraftProposer with a prefix drafter; `shallow`),
plus two (`shallow2`), against every draft of all L positions (`full`, as before session 53). One process: the
w4a8 1.5B beside its shipped drafter (w4a8), T=0, 128 tokens, per prompt METHODS each way in turn (the order
reversed every other prompt), the first LIMIT HumanEval and MT-Bench (turn 1) prompts. Writes draft-depth.jsonl
(one line per run) and prints, per set and method, median tokens/s, tau and stage ms a round each way, and each
shallow way's median paired ratio of tokens/s to `full` with a 95% bootstrap interval and how many prompts gave
`full`'s tokens (ways.summarize). Session 53's runs: draft-depth.jsonl (LIMIT=10 METHODS=taps:32
WAYS=shallow,shallow2,full) and draft-depth-two-ways.jsonl (LIMIT=10 METHODS=taps:32).

    .venv/bin/python results/quantized-targets/zen4/draft-depth.py  # LIMIT=5 METHODS=taps:32,ddtree:8 WAYS=shallow,full
"""

import os
from pathlib import Path

import ways

import taps
from taps import rounds

HERE = Path(__file__).parent
LIMIT = int(os.environ.get("LIMIT", "5"))
METHODS = os.environ.get("METHODS", "taps:32,ddtree:8").split(",")
WAYS = tuple(os.environ.get("WAYS", "shallow,full").split(","))  # shallow (+1), shallow2 (+2) or full
HEADROOM = {"shallow": 1, "shallow2": 2}
# every run prefills its prompt whole (no reuse of the previous run's cache)
spec = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8", profile=str(HERE / "profile-w4a8-draft-w4a8.json"), reuse_prefix=False)


def setup(way: str) -> None:
    spec.drafter.prefix_drafts = way != "full"  # read by each run's DraftProposer
    rounds.DEPTH_HEADROOM = HEADROOM.get(way, 1)


records = ways.interleave(spec, HERE / "draft-depth.jsonl", LIMIT, METHODS, WAYS, setup)

ways.summarize(records, METHODS, WAYS, "full")
print(records[0]["cpu"])
