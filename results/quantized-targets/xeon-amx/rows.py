"""Issue 25's optional item, a GGUF target on llama.cpp's own kernels: what would a tree cost?

One forward over N new rows after 256 tokens of context, for N = 1..64, by llama.cpp on the
packaged Q4_K_M file (llama-cpp-python: a decode of N tokens of one sequence; a tree's rows cost
the same products, its mask aside) and by taps' w8a8 target (`Target.forward_tree` on a random
tree of N - 1 drafted nodes, as `taps profile` times it), interleaved size by size, median of
REPEATS after one untimed call. A speculative round verifies ~8-16 rows; where one kernel's rows
cost several tokens, its trees cannot pay.
    .venv/bin/python results/quantized-targets/xeon-amx/rows.py OUT.jsonl
(one JSON line per engine and size; needs the `llama` extra, built as bench.sh says)
"""

import json
import statistics
import sys
import time

import torch

import taps
from taps.assets import gguf_file
from taps.bench import llama_cpp_build
from taps.costmodel import cpu_name, random_tree

ROWS = (1, 2, 4, 8, 16, 32, 64)
CONTEXT, REPEATS = 256, 5
TARGET = "qwen2.5-coder-1.5b"


def llama_cpp_engine():
    from llama_cpp import Llama

    llm = Llama(str(gguf_file(TARGET)), n_ctx=1024, n_batch=512, n_threads=torch.get_num_threads(),
                logits_all=True, verbose=False)
    context = torch.randint(100, 30000, (CONTEXT,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.eval(context)

    def forward(n: int) -> float:
        llm._ctx.kv_cache_seq_rm(0, CONTEXT, -1)  # back to the context alone
        llm.n_tokens = CONTEXT
        t0 = time.perf_counter()
        llm.eval(list(range(200, 200 + n)))
        return time.perf_counter() - t0

    return forward


def taps_engine():
    target = taps.load(TARGET, method="ar", dtype="bfloat16", target_quant="w8a8").target
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(target.vocab_size, (CONTEXT + 1,), generator=gen).tolist()
    target.prefill(ids[:-1])
    trees = {n: random_tree(n - 1, ids[-1], target.vocab_size, gen) for n in ROWS}

    def forward(n: int) -> float:
        t0 = time.perf_counter()
        target.forward_tree(trees[n])
        seconds = time.perf_counter() - t0
        target.commit([], trees[n].n_nodes)  # drop the tree: the context is unchanged
        return seconds

    return forward


engines = {"llama.cpp Q4_K_M": llama_cpp_engine(), "taps w8a8": taps_engine()}
env = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__, "llama_cpp": llama_cpp_build()}
with open(sys.argv[1], "w") as out:
    for n in ROWS:
        times = {}
        for forward in engines.values():
            forward(n)  # a new shape's first call
        for _ in range(REPEATS):  # interleaved: both engines see the same machine
            for name, forward in engines.items():
                times.setdefault(name, []).append(forward(n))
        for name, ts in times.items():
            ms = 1e3 * statistics.median(ts)
            out.write(json.dumps({"engine": name, "rows": n, "context": CONTEXT, "ms": ms,
                                  "times_ms": [1e3 * t for t in ts], "env": env}) + "\n")
            print(f"{name:18s} {n:3d} rows {ms:8.1f} ms", flush=True)
