"""The w4a8 products of one forward of the 1.5B's layers (28 x q/k/v as one, o, gate/up as one, down;
no head), on torchao's `da8w4_linear_cpu` and on taps.vnni, random weights (0.7 GB of int4, out of
cache), bfloat16 rows; ms by rows, median of 7, the two kernels interleaved. torchao's needs torchao built
with its CPU kernels (`make install-torchao`). Session 49's output on a 2-core Intel Xeon with AMX is in
forward-products.txt (the evidence behind taps.weightonly.w4a8_kernel's order); session 51's of taps.vnni
alone on a Zen 4 EPYC (`... forward-products.py vnni`) in ../zen4/forward-products.txt.

    .venv/bin/python results/quantized-targets/xeon-amx/forward-products.py [KERNELS]   # default torchao,vnni
"""

import statistics
import sys
import time

import torch

from taps.weightonly import W4A8Product

torch.manual_seed(0)
SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 28  # [out, in] of each product
KERNELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["torchao", "vnni"]
if "torchao" in KERNELS:
    import torchao  # noqa: F401  (registers its CPU ops)
REPEATS = 7
products = {k: [W4A8Product(torch.randn(n, i) * 0.02, k) for n, i in SHAPES] for k in KERNELS}
rows_of = {i: torch.randn(64, i).bfloat16() for i in (1536, 8960)}  # [64, in]


def forward(kernel: str, rows: int) -> float:
    start = time.perf_counter()
    for product, (_, i) in zip(products[kernel], SHAPES):
        product(rows_of[i][:rows])
    return (time.perf_counter() - start) * 1000


print("rows " + " ".join(f"{k:>8s}" for k in KERNELS))
for rows in (1, 4, 8, 16, 32, 64):
    times = {k: [] for k in KERNELS}
    for repeat in range(REPEATS + 1):  # the first pass of each size warms up, not counted
        for k in KERNELS:
            ms = forward(k, rows)
            if repeat:
                times[k].append(ms)
    print(f"{rows:4d} " + " ".join(f"{statistics.median(t):8.1f}" for t in times.values()), flush=True)
