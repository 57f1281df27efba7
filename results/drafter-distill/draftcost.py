"""What one draft of a grown drafter folder costs, interleaved with others in one process.

Each folder is loaded beside the 1.5B target (only its config and dtype matter here: DTYPE, default
float32), quantized as the benchmarks run it (QUANT, default int8; w8a8 where the CPU has AMX;
QUANT=none DTYPE=bfloat16 for an unquantized drafter in the target's bfloat16); its cache is fed 256
tokens of an answer once, then each round times the draft of one more token (the new token and
the masks' forward, what a decoding round pays) and drops that token again. Rounds alternate
between the folders; medians over ROUNDS rounds, milliseconds, one JSON line per folder.
PROFILE=1 also prints torch's profiler table (self time per op) over the timed rounds of every
folder, to see where a draft goes (its overhead then adds to the timed medians).
    [QUANT=w8a8] [DTYPE=bfloat16] [PROFILE=1] .venv/bin/python results/drafter-distill/draftcost.py FOLDER [FOLDER ...]
"""

import contextlib
import json
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from taps.assets import load_model
from taps.drafters import load_drafter
from taps.records import read_records
from taps.target import Target

ROUNDS, CONTEXT = 12, 256
ANSWERS = "data/drafters/qwen2.5-coder-1.5b/distill-vllm-chat-bf16.jsonl"

model, tokenizer = load_model("qwen2.5-coder-1.5b", dtype=getattr(torch, os.environ.get("DTYPE", "float32")))
target = Target(model, tokenizer)
QUANT = os.environ.get("QUANT", "int8")
drafters = {folder: load_drafter(folder, target, quantize=QUANT) for folder in sys.argv[1:]}
ids = [i for r in read_records(ANSWERS) if "ids" in r for i in r["ids"]][: CONTEXT + 1]
for drafter in drafters.values():
    drafter.start(ids[:1])
    drafter.draft(ids[:CONTEXT], None)  # the committed context, cached once


def one_round(drafter) -> float:
    """Milliseconds of one round's draft: the new token and the masks, the token dropped again after."""
    start = time.perf_counter()
    drafter.draft(ids[: CONTEXT + 1], None)
    ms = (time.perf_counter() - start) * 1000
    drafter.cache.crop(-1)  # every round sees the same context
    drafter.cached = ids[:CONTEXT]
    return ms


for drafter in drafters.values():
    one_round(drafter)  # warm-up, not counted
times = {folder: [] for folder in drafters}
profiler = profile(activities=[ProfilerActivity.CPU]) if os.environ.get("PROFILE") else contextlib.nullcontext()
with profiler:
    for _ in range(ROUNDS):
        for folder, drafter in drafters.items():
            times[folder].append(one_round(drafter))
for folder, ms in times.items():
    print(json.dumps({"drafter": folder, "quant": QUANT, "draft_ms_median": round(statistics.median(ms), 1),
                      "draft_ms": [round(t, 1) for t in ms], "torch_threads": torch.get_num_threads()}))
if isinstance(profiler, profile):
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
