"""w8a8's two int8 products, oneDNN's and taps.vnni's (the same bits, asserted), by weight shape and rows:
bfloat16 rows, weights out of cache, the two interleaved, median of 15 after 3 untimed, ms. One JSON line
per shape and row count on stdout (session 53: int8-kernels.jsonl).

    .venv/bin/python results/quantized-targets/zen4/int8-kernels.py > results/quantized-targets/zen4/int8-kernels.jsonl
"""

import json
import statistics
import time

import torch

from taps.costmodel import cpu_name
from taps.weightonly import W8A8Product

SHAPES = [(151936, 1536, "head"), (8960 * 2, 1536, "gate+up"), (1536, 8960, "down"), (2048, 1536, "qkv")]  # the 1.5B's
ROWS = (1, 2, 4, 6, 8, 12, 16, 32, 64, 256)


def ms(product, x) -> float:
    start = time.perf_counter()
    product(x)
    return (time.perf_counter() - start) * 1e3


for n, k, name in SHAPES:
    weight = torch.randn(n, k) * 0.05
    onednn, ours = W8A8Product(weight, "onednn"), W8A8Product(weight, "vnni")
    del weight
    for rows in ROWS:
        x = torch.randn(rows, k).bfloat16()
        assert torch.equal(onednn(x), ours(x))
        for _ in range(3):
            ms(onednn, x), ms(ours, x)
        pairs = [(ms(onednn, x), ms(ours, x)) for _ in range(15)]
        print(json.dumps({"shape": name, "n": n, "k": k, "rows": rows,
                          "onednn_ms": statistics.median(a for a, _ in pairs),
                          "vnni_ms": statistics.median(b for _, b in pairs), "cpu": cpu_name()}))
