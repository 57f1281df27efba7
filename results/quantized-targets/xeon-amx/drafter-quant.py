"""The shipped grown drafter in int8 (dynamic, fbgemm) against w8a8 (oneDNN's int8 x int8 with
shared products, `--drafter-quant w8a8`) beside the 1.5B's w8a8 target: taps:32 with each, and
ar, interleaved per prompt on one loaded target (same prompts, dtype, profile kind), T=0, 128
new tokens. Each drafter has its own profile (profile-<target quant>-shared-draft-<drafter quant>.json,
measured with it: `taps profile --target-quant ... --drafter-quant ...`).
One JSONL record per run (not a `taps bench` file: "question" names the prompt); a rerun skips
the runs already written (resumable).

    .venv/bin/python results/quantized-targets/xeon-amx/drafter-quant.py OUT.jsonl [LIMIT] [TARGET_QUANT]

TARGET_QUANT (default w8a8): none runs the bfloat16 target (packed oneDNN), with its own profiles.

The summary (medians, paired ratios with 95% bootstrap intervals) is printed from the file.
"""

import json
import statistics
import sys
from pathlib import Path

import taps
from taps.costmodel import LatencyProfile, OnlineProfile, cpu_name
from taps.datasets import load_prompts
from taps.drafters import load_drafter, shipped_drafter
from taps.engine import Speculator
from taps.records import tokens_per_second
from taps.summary import interval_text, ratio_interval

HERE = Path(__file__).parent
TARGET = "qwen2.5-coder-1.5b"
QUANTS = ("int8", "w8a8")


def summary(records: list[dict]) -> None:
    for dataset in sorted({r["dataset"] for r in records}):
        runs = {key: [r for r in records if r["dataset"] == dataset and r["run"] == key]
                for key in ("ar",) + tuple(f"taps:32/{q}" for q in QUANTS)}
        for key, rs in runs.items():
            if rs:
                print(f"{dataset:10s} {key:14s} n={len(rs):2d} tok/s {statistics.median(map(tokens_per_second, rs)):6.2f}"
                      f"  tau {statistics.median(r['tau'] for r in rs):.2f}"
                      f"  draft ms {statistics.median(r['draft_ms'] for r in rs):5.1f}"
                      f"  =ar {sum(r['equals_ar'] for r in rs)}/{len(rs)}")
        int8 = {r["question"]: r for r in runs["taps:32/int8"]}
        pairs = [(r, int8[r["question"]]) for r in runs["taps:32/w8a8"] if r["question"] in int8]
        if pairs:
            ratio = statistics.median(tokens_per_second(a) / tokens_per_second(b) for a, b in pairs)
            print(f"{dataset:10s} w8a8 / int8 drafter: {ratio:.3f}x {interval_text(*ratio_interval(pairs))}")


def main(out: Path, limit: int, target_quant: str) -> None:
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if done and done[0]["cpu"] != cpu_name():
        raise SystemExit(f"{out} holds runs on {done[0]['cpu']}; this CPU is {cpu_name()}: write another file")
    if done and done[0].get("target_quant", "w8a8") != target_quant:
        raise SystemExit(f"{out} holds runs of a {done[0].get('target_quant', 'w8a8')} target: write another file")
    keys = {(r["dataset"], r["question"], r["run"]) for r in done}
    base = taps.load(TARGET, method="taps", budget=32, dtype="bfloat16", target_quant=target_quant,
                     drafter_quant="int8", profile=str(HERE / f"profile-{target_quant}-shared-draft-int8.json"))
    specs = {"int8": base}
    drafter = load_drafter(shipped_drafter(TARGET), base.target, quantize="w8a8")
    profile = OnlineProfile(LatencyProfile.load(HERE / f"profile-{target_quant}-shared-draft-w8a8.json"))
    specs["w8a8"] = Speculator(base.target, drafter, "taps", 32, profile, base.scorer, TARGET, reuse_prefix=False)
    base.reuse_prefix = False  # every run prefills its prompt (they share one target's cache)
    base.generate("Say hi.", max_new_tokens=8)  # first-call costs out of the timed runs
    prompts = load_prompts("humaneval", limit) + load_prompts("mt-bench", limit)
    with out.open("a") as f:
        for p in prompts:
            runs = [("ar", base, "ar")] + [(f"taps:32/{q}", specs[q], "taps") for q in QUANTS]
            if all((p.dataset, p.id, run) in keys for run, _, _ in runs):
                continue
            ar = None
            for run, spec, method in runs:  # a prompt cut short is run again whole, its missing runs written
                res = spec.generate(p.turns[0], method=method, max_new_tokens=128)
                ar = res.token_ids if run == "ar" else ar
                if (p.dataset, p.id, run) in keys:
                    continue
                s = res.stats
                rec = {"cpu": cpu_name(), "target_quant": target_quant, "dataset": p.dataset, "question": p.id,
                       "temperature": 0.0, "run": run,
                       "new_tokens": s.new_tokens, "total_seconds": s.seconds, "tau": s.tau,
                       "nodes": s.mean_tree_size, "draft_ms": 1e3 * s.stage_seconds["draft"] / max(s.rounds, 1),
                       "equals_ar": res.token_ids == ar}
                f.write(json.dumps(rec) + "\n")
                f.flush()
                done.append(rec)
                print(run, p.dataset, p.id, f"{tokens_per_second(rec):.2f} tok/s", flush=True)
    summary(done)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 10, sys.argv[3] if len(sys.argv) > 3 else "w8a8")
