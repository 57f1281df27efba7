"""A quantized target's forward through transformers against taps' own walk of its layers
(taps.decoder, which taps.target uses for targets on row-wise attention): the same modules and
kernels in the same order, so the same tokens; what differs is the time. One process, one loaded
w4a8 1.5B beside its shipped drafter (w4a8), the path switched per run (`Target.decoder`), each prompt
and method run on both paths in turn, the order alternating by prompt. LIMIT HumanEval + LIMIT MT-Bench
turn 1 (default 5), T=0, 128 new tokens, bfloat16, methods ar and taps:32 (the profile measured for this
pairing). Writes decoder-ab.jsonl (one line per run) and prints per path and method the median tokens/s,
the median paired ratio decoder/transformers with a 95% bootstrap interval, and the stages' median ms.

    .venv/bin/python results/quantized-targets/xeon-amx/decoder-ab.py
"""

import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import taps
from taps.datasets import load_prompts

HERE = Path(__file__).parent
LIMIT = int(os.environ.get("LIMIT", "5"))
METHODS = ("ar", "taps")
spec = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8", profile=str(HERE / "profile-w4a8-vnni-w4a8.json"), reuse_prefix=False)
decoder = spec.target.decoder
assert decoder is not None, "this target does not walk through taps.decoder here"
with open("/proc/cpuinfo") as info:
    cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), platform.processor())
prompts = load_prompts("humaneval", LIMIT) + load_prompts("mt-bench", LIMIT)
spec.generate(prompts[0].turns[0], max_new_tokens=16)  # warm-up: kernels built, caches touched
records = []
with (HERE / "decoder-ab.jsonl").open("w") as out:
    for n, prompt in enumerate(prompts):
        for method in METHODS:
            paths = ("decoder", "transformers") if n % 2 == 0 else ("transformers", "decoder")
            for path in paths:
                spec.target.decoder = decoder if path == "decoder" else None
                rounds = []
                start = time.perf_counter()
                result = spec.generate(prompt.turns[0], max_new_tokens=128, method=method, on_round=rounds.append)
                seconds = time.perf_counter() - start
                record = {"prompt": prompt.id, "dataset": prompt.dataset, "method": method, "path": path,
                          "tokens": len(result.token_ids), "seconds": seconds,
                          "tokens_per_s": len(result.token_ids) / seconds, "rounds": len(rounds),
                          "stage_ms": [1000 * statistics.median(r.seconds[i] for r in rounds) for i in range(4)],
                          "token_ids": result.token_ids, "cpu": cpu}
                records.append(record)
                out.write(json.dumps(record) + "\n")
                out.flush()

by = {(r["prompt"], r["method"], r["path"]): r for r in records}
rng = random.Random(0)
for method in METHODS:
    for dataset in ("humaneval", "mt-bench"):
        ids = [p.id for p in prompts if p.dataset == dataset]
        same = all(by[i, method, "decoder"]["token_ids"] == by[i, method, "transformers"]["token_ids"] for i in ids)
        ratios = [by[i, method, "decoder"]["tokens_per_s"] / by[i, method, "transformers"]["tokens_per_s"] for i in ids]
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        line = [f"{method:5s} {dataset:9s}"]
        for path in ("transformers", "decoder"):
            runs = [by[i, method, path] for i in ids]
            stages = [statistics.median(r["stage_ms"][s] for r in runs) for s in range(4)]
            line.append(f"{path} {statistics.median(r['tokens_per_s'] for r in runs):6.2f} tok/s "
                        f"(propose/select/verify/commit ms {'/'.join(f'{x:.1f}' for x in stages)})")
        line.append(f"ratio {statistics.median(ratios):.3f} [{boot[50]:.3f}-{boot[1949]:.3f}] same tokens {same}")
        print("  ".join(line))
print(cpu)
