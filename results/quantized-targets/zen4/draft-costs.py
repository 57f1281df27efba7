"""What a draft and a prompt's passes cost beside the w4a8 1.5B, by drafter quantization: the shipped grown
drafter's forward (taps.decoder) over 7 and 10 rows after 256 tokens of context (new tokens and 6 masks, as
a round's draft; median of 15 after 3 untimed), and the drafter's and the target's pass over a prompt of 64
and 160 random tokens (fastest of 3, a fresh cache each). One process per quantization, each loading its
own target and drafter; QUANTS in turn, ROUNDS times (alternating, for the host's drift). Appends one JSON
line per process to draft-costs.jsonl and prints it.

    .venv/bin/python results/quantized-targets/zen4/draft-costs.py            # QUANTS=w4a8,w8a8,int8 ROUNDS=2
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from taps.costmodel import cpu_name

HERE = Path(__file__).parent


def measure(quant: str) -> dict:
    import torch

    import taps

    spec = taps.load("qwen2.5-coder-1.5b", method="ddtree", budget=8, dtype="bfloat16", target_quant="w4a8",
                     drafter_quant=quant)
    drafter, target = spec.drafter.decoder, spec.target.decoder
    cache = drafter.new_cache()
    drafter(torch.randint(0, 150000, (256,)), cache, 0, 1)

    def draft(rows: int) -> float:
        start = time.perf_counter()
        drafter(torch.randint(0, 150000, (rows,)), cache, 6, 7)
        cache.crop(256)
        return (time.perf_counter() - start) * 1e3

    record = {"drafter_quant": quant}
    for rows in (7, 10):
        for _ in range(3):
            draft(rows)
        record[f"draft_ms_{rows}_rows"] = statistics.median(draft(rows) for _ in range(15))
    for name, decoder in (("drafter", drafter), ("target", target)):
        for tokens in (64, 160):
            times = []
            for _ in range(3):
                fresh = decoder.new_cache()
                start = time.perf_counter()
                decoder.walk(torch.randint(0, 150000, (tokens,)), fresh)
                times.append(time.perf_counter() - start)
            record[f"{name}_prompt_s_{tokens}"] = min(times)
    return record


if __name__ == "__main__":
    if len(sys.argv) > 1:  # one quantization, in a process of its own
        print(json.dumps(measure(sys.argv[1])))
        sys.exit()
    cpu = cpu_name()
    for _ in range(int(os.environ.get("ROUNDS", "2"))):
        for quant in os.environ.get("QUANTS", "w4a8,w8a8,int8").split(","):
            line = subprocess.run([sys.executable, __file__, quant], capture_output=True, text=True,
                                  check=True).stdout.strip().splitlines()[-1]
            record = json.loads(line) | {"cpu": cpu}
            print(json.dumps(record), flush=True)
            with (HERE / "draft-costs.jsonl").open("a") as out:
                out.write(json.dumps(record) + "\n")
