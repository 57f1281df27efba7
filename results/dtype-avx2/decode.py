"""Plain decoding (ar) through taps.load in float32 and bfloat16, interleaved, on this CPU: one
short prompt, the median tokens/s of REPEATS runs after a warm-up round; prints one JSON line.

    .venv/bin/python results/dtype-avx2/decode.py TARGET NEW_TOKENS REPEATS
"""

import json
import statistics
import sys

import taps
from taps.costmodel import cpu_name
from taps.linear import bf16_native

PROMPT = "Write a Python function that checks whether a number is prime."


def main(target: str, tokens: int, repeats: int) -> dict:
    specs = {dt: taps.load(target, method="ar", dtype=dt) for dt in ("float32", "bfloat16")}
    runs = {dt: [] for dt in specs}
    for round_ in range(repeats + 1):
        for dt, spec in specs.items():
            result = spec.generate(PROMPT, max_new_tokens=tokens, temperature=0.0)
            if round_:  # the first round warms up
                runs[dt].append(result.stats.tokens_per_second)
    return {"cpu": cpu_name(), "bf16_native": bf16_native(), "target": target, "new_tokens": tokens,
            **{dt: round(statistics.median(v), 2) for dt, v in runs.items()}, "runs": runs}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
