"""Forward time of N rows (one call from an empty cache) in float32 and bfloat16 on this CPU: per
dtype and row count the median of two calls after a warm-up call; prints one JSON line.

    .venv/bin/python results/dtype-avx2/rows.py TARGET 1,8,32,256
"""

import json
import statistics
import sys
import time

import torch

from taps.assets import load_model
from taps.costmodel import cpu_name


def forward_ms(model, n: int) -> float:
    ids = torch.randint(100, 10000, (1, n))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        with torch.no_grad():
            model(ids)
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times[1:]), 1)  # the first call warms up


def main(target: str, rows: list[int]) -> dict:
    torch.set_flush_denormal(True)  # as taps.load does
    models = {dt: load_model(target, dtype=getattr(torch, dt))[0] for dt in ("float32", "bfloat16")}
    out = {"cpu": cpu_name(), "target": target}
    for n in rows:
        for dt, model in models.items():
            out[f"{dt}_{n}_ms"] = forward_ms(model, n)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], [int(x) for x in sys.argv[2].split(",")])))
