"""The loop draft-depth.py and fused-layer.py share: the first LIMIT HumanEval and MT-Bench (turn 1) prompts, each
method on each prompt once a way, the ways in turn (the order reversed every other time), one JSONL record a run."""

import json
import random
import statistics

from taps.costmodel import cpu_name
from taps.datasets import load_prompts


def interleave(spec, out_path, limit: int, methods: list[str], ways: tuple[str, ...], setup) -> list[dict]:
    """Run `spec` (taps.load's) on every prompt, method (NAME or NAME:BUDGET) and way, `setup(way)` before each run
    (and before a warm-up of each way first), T=0, 128 tokens; write and return the records: set, prompt, method,
    way, tokens/s, tau, the draft, selection and verification stages' ms a round, the mean tree, the tokens and
    the CPU."""
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
                                  "select_ms": 1e3 * stats.stage_seconds["select"] / rounds,
                                  "verify_ms": 1e3 * stats.stage_seconds["verify"] / rounds,
                                  "mean_tree": stats.mean_tree_size, "token_ids": result.token_ids, "cpu": cpu}
                        records.append(record)
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                    n += 1
    return records


def summarize(records: list[dict], methods: list[str], ways: tuple[str, ...], baseline: str) -> None:
    """Print per set and method each way's median tokens/s, tau and stages' ms a round (draft, selection where
    recorded, verification), and each other way's median paired ratio of tokens/s to `baseline` (95% bootstrap
    interval) and how many prompts gave the baseline's tokens."""
    rng = random.Random(0)
    for dataset in ("humaneval", "mt-bench"):
        by = {(r["prompt"], r["method"], r["way"]): r for r in records if r["dataset"] == dataset}
        prompts = sorted({p for p, _, _ in by})
        for method in methods:
            line = [f"{dataset:9s} {method:9s}"]
            for way in ways:
                runs = [by[p, method, way] for p in prompts]
                stages = [stage for stage in ("draft", "select", "verify") if all(f"{stage}_ms" in r for r in runs)]
                line.append(f"{way} {statistics.median(r['tokens_per_second'] for r in runs):.2f} tok/s tau "
                            f"{statistics.median(r['tau'] for r in runs):.2f} "
                            + " ".join(f"{stage} {statistics.median(r[f'{stage}_ms'] for r in runs):.1f}"
                                       for stage in stages) + " ms")
            for way in [w for w in ways if w != baseline]:
                pairs = [(by[p, method, way], by[p, method, baseline]) for p in prompts]
                ratios = [a["tokens_per_second"] / b["tokens_per_second"] for a, b in pairs]
                boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
                same = sum(a["token_ids"] == b["token_ids"] for a, b in pairs)
                line.append(f"{way}/{baseline} {statistics.median(ratios):.3f} [{boot[50]:.3f}-{boot[1949]:.3f}], "
                            f"same tokens {same}/{len(prompts)}")
            print("  ".join(line))
