"""A grown drafter's layers in one C++ call each (taps.layer, `fused`) against taps.decoder's Python walk
(`walk`), end to end. One process: the w4a8 1.5B beside its shipped drafter (w4a8), T=0, 128 tokens, per
prompt METHODS each way in turn (the order reversed every other prompt), the first LIMIT HumanEval and
MT-Bench (turn 1) prompts. Writes fused-layer.jsonl (one line per run) and prints, per set and method,
median tokens/s, tau and draft-stage ms a round each way, the median paired ratio of tokens/s fused / walk
with a 95% bootstrap interval, and whether every output was the same (the target verifies every token, so
it must be).

    .venv/bin/python results/quantized-targets/zen4/fused-layer.py  # LIMIT=5 METHODS=taps:32,ddtree:8
"""

import json
import os
import random
import statistics
from pathlib import Path

import taps
from taps.costmodel import cpu_name
from taps.datasets import load_prompts

HERE = Path(__file__).parent
LIMIT = int(os.environ.get("LIMIT", "5"))
METHODS = os.environ.get("METHODS", "taps:32,ddtree:8").split(",")
WAYS = ("fused", "walk")
# every run prefills its prompt whole (no reuse of the previous run's cache)
spec = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8", profile=str(HERE / "profile-w4a8-draft-w4a8.json"), reuse_prefix=False)
layers = spec.drafter.decoder.fused
assert layers is not None, "the drafter's layers do not fit taps.layer here"
cpu = cpu_name()
spec.generate("Say hi.", max_new_tokens=8)  # warm-up
records = []
with (HERE / "fused-layer.jsonl").open("w") as out:
    n = 0
    for dataset in ("humaneval", "mt-bench"):
        for prompt in load_prompts(dataset, LIMIT):
            text = prompt.turns[0]
            for spec_method in METHODS:
                method, budget = spec_method.split(":")
                for way in WAYS if n % 2 == 0 else WAYS[::-1]:
                    spec.drafter.decoder.fused = layers if way == "fused" else None
                    result = spec.generate(text, method=method, budget=int(budget), max_new_tokens=128)
                    stats = result.stats
                    record = {"dataset": dataset, "prompt": prompt.id, "method": spec_method, "way": way,
                              "tokens_per_second": stats.tokens_per_second, "tau": stats.tau,
                              "draft_ms": 1e3 * stats.stage_seconds["draft"] / max(stats.rounds, 1),
                              "verify_ms": 1e3 * stats.stage_seconds["verify"] / max(stats.rounds, 1),
                              "mean_tree": stats.mean_tree_size, "token_ids": result.token_ids, "cpu": cpu}
                    records.append(record)
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                n += 1

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
        ratios = [by[p, "fused"]["tokens_per_second"] / by[p, "walk"]["tokens_per_second"] for p in prompts]
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        same = all(by[p, "fused"]["token_ids"] == by[p, "walk"]["token_ids"] for p in prompts)
        line.append(f"fused/walk {statistics.median(ratios):.3f} [{boot[50]:.3f}-{boot[1949]:.3f}] same {same}")
        print("  ".join(line))
print(cpu)
