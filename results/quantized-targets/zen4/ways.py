"""The loop draft-depth.py and fused-layer.py share: the first LIMIT HumanEval and MT-Bench (turn 1) prompts, each
method on each prompt once a way, the ways in turn (the order reversed every other time), one JSONL record a run."""

import json

from taps.costmodel import cpu_name
from taps.datasets import load_prompts


def interleave(spec, out_path, limit: int, methods: list[str], ways: tuple[str, ...], setup) -> list[dict]:
    """Run `spec` (taps.load's) on every prompt, method (NAME or NAME:BUDGET) and way, `setup(way)` before each run
    (and before a warm-up of each way first), T=0, 128 tokens; write and return the records: set, prompt, method,
    way, tokens/s, tau, the draft and verification stages' ms a round, the mean tree, the tokens and the CPU."""
    cpu, records, n = cpu_name(), [], 0
    for way in ways:
        setup(way)
        spec.generate("Say hi.", max_new_tokens=8)
    with open(out_path, "w") as out:
        for dataset in ("humaneval", "mt-bench"):
            for prompt in load_prompts(dataset, limit):
                for spec_method in methods:
                    method, _, budget = spec_method.partition(":")
                    for way in ways if n % 2 == 0 else ways[::-1]:
                        setup(way)
                        result = spec.generate(prompt.turns[0], method=method, budget=int(budget) if budget else None,
                                               max_new_tokens=128)
                        stats, rounds = result.stats, max(result.stats.rounds, 1)
                        record = {"dataset": dataset, "prompt": prompt.id, "method": spec_method, "way": way,
                                  "tokens_per_second": stats.tokens_per_second, "tau": stats.tau,
                                  "draft_ms": 1e3 * stats.stage_seconds["draft"] / rounds,
                                  "verify_ms": 1e3 * stats.stage_seconds["verify"] / rounds,
                                  "mean_tree": stats.mean_tree_size, "token_ids": result.token_ids, "cpu": cpu}
                        records.append(record)
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                    n += 1
    return records
