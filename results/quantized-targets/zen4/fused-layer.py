"""Decoder layers in one C++ call each (taps.layer) against taps.decoder's Python walk, end to end: `both` (the
drafter's and the target's layers fused), `drafter` (the drafter's alone, the target walking) and `walk` (neither).
One process: the w4a8 1.5B beside its shipped drafter (w4a8), T=0, 128 tokens, per prompt METHODS each way in turn
(the order reversed every other prompt), the first LIMIT HumanEval and MT-Bench (turn 1) prompts. Writes OUT
(default fused-layer.jsonl, one line per run) and prints, per set and method, median tokens/s, tau and draft- and
verification-stage ms a round each way, each way's median paired ratio of tokens/s to `walk` with a 95% bootstrap
interval, and the exactness checks: `drafter` gives `walk`'s tokens (same target), and every method gives its
own target's plain decoding (`ar`, when METHODS has it) in each way. A fused target is another float order of
the same w4a8 model (taps.layer), so `both` may pick other tokens than `walk` where two logits nearly tie.

    .venv/bin/python results/quantized-targets/zen4/fused-layer.py  # LIMIT=5 METHODS=ar,taps:32 WAYS=both,drafter,walk

Session 54's runs: fused-drafter.jsonl (LIMIT=10 METHODS=taps:32,ddtree:8 WAYS=drafter,walk OUT=fused-drafter.jsonl,
before the target's layers could fuse) and fused-layer.jsonl (LIMIT=10 METHODS=ar,taps:32).
"""

import os
from pathlib import Path

import ways

import taps

HERE = Path(__file__).parent
LIMIT = int(os.environ.get("LIMIT", "5"))
METHODS = os.environ.get("METHODS", "ar,taps:32").split(",")
WAYS = tuple(os.environ.get("WAYS", "both,drafter,walk").split(","))
OUT = HERE / os.environ.get("OUT", "fused-layer.jsonl")
# every run prefills its prompt whole (no reuse of the previous run's cache)
spec = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8", profile=str(HERE / "profile-w4a8-draft-w4a8.json"), reuse_prefix=False)
drafter_layers, target_layers = spec.drafter.decoder.fused, spec.target.decoder.fused
assert drafter_layers is not None and target_layers is not None, "the layers do not fit taps.layer here"


def setup(way: str) -> None:
    spec.drafter.decoder.fused = drafter_layers if way != "walk" else None
    spec.target.decoder.fused = target_layers if way == "both" else None


records = ways.interleave(spec, OUT, LIMIT, METHODS, WAYS, setup)

ways.summarize(records, METHODS, WAYS, "walk" if "walk" in WAYS else WAYS[-1])
for dataset in ("humaneval", "mt-bench"):
    by = {(r["prompt"], r["method"], r["way"]): r for r in records if r["dataset"] == dataset}
    prompts = sorted({p for p, _, _ in by})
    for way in WAYS:
        if "ar" in METHODS:
            same = all(by[p, m, way]["token_ids"] == by[p, "ar", way]["token_ids"] for p in prompts for m in METHODS)
            print(f"{dataset:9s} {way}: every method = its ar: {same}")
    if "drafter" in WAYS and "walk" in WAYS:
        same = all(by[p, m, "drafter"]["token_ids"] == by[p, m, "walk"]["token_ids"] for p in prompts for m in METHODS)
        print(f"{dataset:9s} drafter = walk: {same}")
print(records[0]["cpu"])
