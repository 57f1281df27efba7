"""Drafts as deep as the last tree went plus one (taps.rounds.DraftProposer with a prefix drafter; `shallow`),
plus two (`shallow2`), against every draft of all L positions (`full`, as before session 53). One process: the
w4a8 1.5B beside its shipped drafter (w4a8), T=0, 128 tokens, per prompt METHODS each way in turn (the order
reversed every other prompt), the first LIMIT HumanEval and MT-Bench (turn 1) prompts. Writes draft-depth.jsonl
(one line per run) and prints, per set and method, median tokens/s, tau and draft-stage ms a round each way,
and each shallow way's median paired ratio of tokens/s to `full` with a 95% bootstrap interval and whether
every output was the same. Session 53's runs: draft-depth.jsonl (LIMIT=10 METHODS=taps:32
WAYS=shallow,shallow2,full) and draft-depth-two-ways.jsonl (LIMIT=10 METHODS=taps:32).

    .venv/bin/python results/quantized-targets/zen4/draft-depth.py  # LIMIT=5 METHODS=taps:32,ddtree:8 WAYS=shallow,full
"""

import os
import random
import statistics
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

rng = random.Random(0)
for dataset in ("humaneval", "mt-bench"):
    for spec_method in METHODS:
        by = {(r["prompt"], r["way"]): r for r in records if r["dataset"] == dataset and r["method"] == spec_method}
        prompts = sorted({p for p, _ in by})
        line = [f"{dataset:9s} {spec_method:9s}"]
        for way in WAYS:
            runs = [by[p, way] for p in prompts]
            line.append(f"{way} {statistics.median(r['tokens_per_second'] for r in runs):.2f} tok/s tau "
                        f"{statistics.median(r['tau'] for r in runs):.2f} draft "
                        f"{statistics.median(r['draft_ms'] for r in runs):.1f} ms")
        for way in [w for w in WAYS if w != "full"]:
            ratios = [by[p, way]["tokens_per_second"] / by[p, "full"]["tokens_per_second"] for p in prompts]
            boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
            same = all(by[p, way]["token_ids"] == by[p, "full"]["token_ids"] for p in prompts)
            line.append(f"{way}/full {statistics.median(ratios):.3f} [{boot[50]:.3f}-{boot[1949]:.3f}] same {same}")
        print("  ".join(line))
print(records[0]["cpu"])
