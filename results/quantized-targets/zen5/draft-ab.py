"""The w4a8 drafter's draft as now against as before session 48, in the real decoding loop, one process.

Before: the drafter's LM head in int8 (`--target-quant w4a8` keeps a target's so) and its attention
through SDPA with a causal mask; now: the head in int4 with its layers and the attention on taps'
row-wise kernel (taps.drafters.decoder). One session (the 1.5B w4a8 target, bfloat16, the shipped
drafter in w4a8, taps:32, T=0, 128 tokens, the first 5 HumanEval and 5 MT-Bench turn-1 prompts); per
prompt both versions run, in alternating order, by swapping the head and the attention of the one
drafter. Writes one JSON line per run to OUT (default draft-ab.jsonl here) and prints the draft's median
cost a round and the median paired tokens/s ratio now / before with its 95% bootstrap interval
(taps.summary); outputs must be equal (the target verifies every token).

    .venv/bin/python results/quantized-targets/zen5/draft-ab.py [OUT]
"""

import json
import statistics
import sys
from pathlib import Path

from torch import nn

from taps.bench import BenchConfig, Session, plan, run_job
from taps.summary import median_speed_ratio, paired, ratio_interval
from taps.weightonly import WeightOnlyLinear

HERE = Path(__file__).parent
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "draft-ab.jsonl"
cfg = BenchConfig(target="qwen2.5-coder-1.5b", methods=("ar", "taps:32"), datasets=("humaneval", "mt-bench"), limit=5,
                  turns=1, max_new_tokens=128, dtype="bfloat16", drafter_quant="w4a8", target_quant="w4a8",
                  profile=str(HERE / "profile-w4a8-draft-draft-w4a8.json"))
session = Session(cfg)
decoder = session.spec.drafter.decoder
embedding = session.spec.drafter.model.get_input_embeddings().weight  # the 0.5B's head is tied to it
head = nn.Linear(embedding.shape[1], embedding.shape[0], bias=False)
head.weight.data = embedding.detach().float().clone()
VERSIONS = {"now": (decoder.head, decoder.rowwise), "before": (WeightOnlyLinear(head, "w8a8"), None)}


def use(version: str) -> None:
    decoder.head, decoder.rowwise = VERSIONS[version]


jobs = [job for job in plan(cfg) if job[2] == "taps"]
for version in VERSIONS:  # warm-up, not recorded
    use(version)
    run_job(session, *jobs[0][:2], "taps", 32, 16)
records = {version: [] for version in VERSIONS}
outputs = {version: [] for version in VERSIONS}
with OUT.open("w") as out:
    for k, (prompt, temperature, method, budget) in enumerate(jobs):
        for version in ("now", "before") if k % 2 else ("before", "now"):
            use(version)
            run = run_job(session, prompt, temperature, method, budget, cfg.max_new_tokens)
            rounds = len(run.accepted_per_round)
            record = {"version": version, "dataset": prompt.dataset, "prompt": prompt.id, "temperature": temperature,
                      "method": f"{method}:{budget}", "new_tokens": len(run.token_ids[0]),
                      "total_seconds": run.seconds[0], "rounds": rounds,
                      "draft_ms_per_round": run.stage_seconds["draft"] / rounds * 1000}
            out.write(json.dumps(record) + "\n")
            records[version].append(record)
            outputs[version].append(run.token_ids)
for version, done in records.items():
    print(f"{version}: draft {statistics.median(r['draft_ms_per_round'] for r in done):.2f} ms a round (median)")
# (a "prompt" field, not the bench's "prompt_id": these are no bench records, which tests/test_records.py reads)
pairs = paired(*([{**r, "prompt_id": r["prompt"]} for r in records[v]] for v in ("now", "before")))
low, high = ratio_interval(pairs)
print(f"tokens/s now / before: median {median_speed_ratio(pairs):.3f} [{low:.3f}-{high:.3f}] over {len(pairs)} prompts")
print("outputs equal:", outputs["now"] == outputs["before"])
