"""Plain decoding of a bfloat16 target with taps.linear's padding of a few rows on large packed weights
(PackedOneDNNLinear: `pad`) and without it (`plain`: PAD_MIN_WEIGHTS out of reach), in one process, each way in
turn per prompt (the order reversed every other prompt), the first LIMIT MT-Bench and HumanEval prompts, 128
tokens, T=0. Prints each way's median tokens/s and the median paired ratio pad / plain with a 95% bootstrap
interval, and whether the tokens were the same.

    [TARGET=smollm2-135m] [LIMIT=5] .venv/bin/python results/quantized-targets/zen4/bf16-pad.py
"""

import os
import random
import statistics

import taps
from taps import linear
from taps.datasets import load_prompts

TARGET = os.environ.get("TARGET", "qwen2.5-coder-1.5b")
LIMIT = int(os.environ.get("LIMIT", 5))
WAYS = {"pad": linear.PAD_MIN_WEIGHTS, "plain": 1 << 62}

spec = taps.load(TARGET, dtype="bfloat16", method="ar", reuse_prefix=False)
spec.generate("Say hi.", max_new_tokens=8)
runs = {}
prompts = [p for dataset in ("mt-bench", "humaneval") for p in load_prompts(dataset, LIMIT)]
for i, prompt in enumerate(prompts):
    for way in list(WAYS) if i % 2 == 0 else list(WAYS)[::-1]:
        linear.PAD_MIN_WEIGHTS = WAYS[way]
        result = spec.generate(prompt.turns[0], max_new_tokens=128)
        runs[i, way] = result
rng = random.Random(0)
ratios = [runs[i, "pad"].stats.tokens_per_second / runs[i, "plain"].stats.tokens_per_second
          for i in range(len(prompts))]
boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
same = sum(runs[i, "pad"].token_ids == runs[i, "plain"].token_ids for i in range(len(prompts)))
print(TARGET, {way: round(statistics.median(runs[i, way].stats.tokens_per_second for i in range(len(prompts))), 2)
               for way in WAYS}, f"pad/plain {statistics.median(ratios):.3f} [{boot[50]:.3f}-{boot[1949]:.3f}]",
      f"same tokens {same}/{len(prompts)}")
