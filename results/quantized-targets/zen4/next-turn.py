"""A chat's second turn with the drafter keeping its cache of the first (what the target keeps, `reuse_prefix`,
the library's and server's default) against the drafter reading the whole conversation again (before session
51). One process: the w4a8 1.5B beside its shipped drafter (w4a8), taps:32, T=0, 128 tokens a turn; per
MT-Bench question its first turn, then its second turn one way; the first turn again, then the second turn
the other way (the order alternating by question), so each second turn starts from the same cache. Writes
next-turn.jsonl (one line per second turn) and prints per way the median turn seconds and draft-stage seconds,
and the median paired ratio kept / again of the turn's seconds with a 95% bootstrap interval.

    .venv/bin/python results/quantized-targets/zen4/next-turn.py        # LIMIT=8 questions
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
LIMIT = int(os.environ.get("LIMIT", "8"))
spec = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8", profile=str(HERE / "profile-w4a8-draft-w4a8.json"))
drafter = spec.drafter
keeping = drafter.start


def forgetting(prompt_ids, reused=0):  # the drafter as it was: every call starts empty
    keeping(prompt_ids, 0)


cpu = cpu_name()
spec.generate("Say hi.", max_new_tokens=8)  # warm-up
records = []
with (HERE / "next-turn.jsonl").open("w") as out:
    for n, prompt in enumerate(load_prompts("mt-bench", LIMIT)):
        first = [{"role": "user", "content": prompt.turns[0]}]
        for way in ("kept", "again") if n % 2 == 0 else ("again", "kept"):
            answer = spec.generate(first, max_new_tokens=128).text  # the first turn, the same each time (T=0)
            second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": prompt.turns[1]}]
            drafter.start = keeping if way == "kept" else forgetting
            result = spec.generate(second, max_new_tokens=128)
            drafter.start = keeping
            stats = result.stats
            record = {"question": prompt.id, "way": way, "prompt_tokens": result.prompt_tokens,
                      "reused": spec.target.reused, "seconds": stats.seconds, "draft_s": stats.stage_seconds["draft"],
                      "prefill_s": stats.prefill_seconds, "rounds": stats.rounds, "token_ids": result.token_ids,
                      "cpu": cpu}
            records.append(record)
            out.write(json.dumps(record) + "\n")
            out.flush()

by = {(r["question"], r["way"]): r for r in records}
questions = sorted({r["question"] for r in records})
for way in ("again", "kept"):
    runs = [by[q, way] for q in questions]
    median = {key: statistics.median(r[key] for r in runs) for key in ("seconds", "draft_s", "prompt_tokens", "reused")}
    print(f"{way:5s} turn s {median['seconds']:.2f}  draft s {median['draft_s']:.2f}  prompt tokens "
          f"{median['prompt_tokens']:.0f} (reused {median['reused']:.0f})")
ratios = [by[q, "kept"]["seconds"] / by[q, "again"]["seconds"] for q in questions]
rng = random.Random(0)
boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
same = all(by[q, "kept"]["token_ids"] == by[q, "again"]["token_ids"] for q in questions)
print(f"turn seconds kept / again {statistics.median(ratios):.3f} [{boot[50]:.3f}-{boot[1949]:.3f}], "
      f"same tokens {same}")
print(cpu)
