"""A bfloat16 target's forward by rows through oneDNN's packed linear (taps.linear.PackedOneDNNLinear, the default
for bfloat16): TARGET (default the 1.5B) unquantized, 256 tokens of context, trees of 0, 1 and 3 drafted nodes
(1, 2 and 4 rows), unpadded (`plain`) and with every product of fewer than 4 rows padded with zero rows to 4 and cut
back (`padded`: taps.linear's padding with PAD_MIN_WEIGHTS at 0, every weight; the size it has by default came from
this measurement). Each way twice in turn, 5 timed forwards a size after one untimed; prints the medians in ms by
(way, rows). Session 56 on the 2-core Zen 4 EPYC: plain 136.9 / 147.9 / 118.5, padded 126.7 / 121.0 / 116.2 (1 / 2
/ 4 rows): one or two rows cost more than four on this kernel here. TARGET=smollm2-135m (its products 9x smaller):
plain 41.8 / 42.6 / 44.1, padded 46.0 / 40.8 / 41.0: one row padded costs more there.

    [TARGET=smollm2-135m] .venv/bin/python results/quantized-targets/zen4/bf16-rows.py
"""

import os
import statistics
import time

import torch

import taps
from taps import linear
from taps.costmodel import random_tree

SMALLEST = {"plain": 1 << 62, "padded": 0}  # the least weight each way pads (taps.linear.PAD_MIN_WEIGHTS)

TARGET = os.environ.get("TARGET", "qwen2.5-coder-1.5b")
spec = taps.load(TARGET, dtype="bfloat16", method="ar")
target = spec.target
gen = torch.Generator().manual_seed(0)
ids = torch.randint(target.vocab_size, (257,), generator=gen).tolist()
target.prefill(ids[:-1])
trees = {n: random_tree(n, ids[-1], target.vocab_size, gen) for n in (0, 1, 3)}


def once(tree) -> float:
    start = time.perf_counter()
    target.forward_tree(tree)
    seconds = time.perf_counter() - start
    target.commit([], tree.n_nodes)  # the context stays as it was
    return seconds


times = {}
for way in tuple(SMALLEST) * 2:
    linear.PAD_MIN_WEIGHTS = SMALLEST[way]
    for n, tree in trees.items():
        once(tree)
        times.setdefault((way, n + 1), []).extend(once(tree) for _ in range(5))
print({key: round(1e3 * statistics.median(v), 1) for key, v in times.items()})
