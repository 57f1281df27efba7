"""The w4a8 1.5B's forward (taps profile's: a random tree of 1, 4 or 8 rows after 256 tokens) with its int8
head on oneDNN's product or on taps.vnni's (the same bits, asserted), swapped in one process, interleaved
in alternating order, 12 pairs each; prints one JSON line per row count with the paired median ratio.

    .venv/bin/python results/quantized-targets/zen4/head-ab.py
"""

import json
import statistics
import time

import torch

import taps
from taps.costmodel import cpu_name, random_tree
from taps.weightonly import W8A8Product

ROWS = (1, 4, 8)
spec = taps.load("qwen2.5-coder-1.5b", method="ddtree", budget=8, dtype="bfloat16", target_quant="w4a8",
                 drafter_quant="w4a8")
target = spec.target
head = target.decoder.head
assert head.product.kernel == "vnni", head.product.kernel
# the head's float weight is gone: oneDNN's product from its dequantized int8 weight (the same integers)
products = {"vnni": head.product, "onednn": W8A8Product(head.weight.float(), "onednn")}
x = torch.randn(4, 1536).bfloat16()
assert torch.equal(products["onednn"](x), products["vnni"](x))
context = torch.randint(100, 30000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
target.prefill(context)
gen = torch.Generator().manual_seed(1)


def forward_ms(rows: int) -> float:
    tree = random_tree(rows - 1, context[-1], 150000, gen)
    start = time.perf_counter()
    target.forward_tree(tree)
    elapsed = time.perf_counter() - start
    target.cache.crop(target.n_cached)
    return elapsed * 1e3


times = {(kernel, rows): [] for kernel in products for rows in ROWS}
for rep in range(12):
    for rows in ROWS:
        for kernel in ("vnni", "onednn") if rep % 2 else ("onednn", "vnni"):
            head.product = products[kernel]
            forward_ms(rows)  # untimed: the other kernel's weights leave the cache
            times[(kernel, rows)].append(forward_ms(rows))
for rows in ROWS:
    a, b = times[("onednn", rows)], times[("vnni", rows)]
    print(json.dumps({"rows": rows, "onednn_ms": statistics.median(a), "vnni_ms": statistics.median(b),
                      "paired_ratio": statistics.median(y / x for x, y in zip(a, b)), "cpu": cpu_name()}))
