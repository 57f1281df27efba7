"""What one draft of a grown drafter folder costs, interleaved with others in one process.

Each folder is loaded beside the float32 1.5B target (only its config matters here), in int8 as
the benchmarks run it; each round feeds a fresh cache 256 tokens of an answer, then times the
draft of one more token (the masks' forward, what a decoding round pays). Rounds alternate
between the folders; medians over ROUNDS rounds, milliseconds, one JSON line per folder.
    .venv/bin/python results/drafter-distill/draftcost.py FOLDER [FOLDER ...]
"""

import json
import statistics
import sys
import time

import torch

from taps.assets import load_model
from taps.drafters import load_drafter
from taps.records import read_records
from taps.target import Target

ROUNDS, CONTEXT = 12, 256
ANSWERS = "data/drafters/qwen2.5-coder-1.5b/distill-vllm-chat-bf16.jsonl"

model, tokenizer = load_model("qwen2.5-coder-1.5b", dtype=torch.float32)
target = Target(model, tokenizer)
drafters = {folder: load_drafter(folder, target, quantize="int8") for folder in sys.argv[1:]}
ids = [i for r in read_records(ANSWERS) if "ids" in r for i in r["ids"]][: CONTEXT + ROUNDS + 1]
times = {folder: [] for folder in drafters}
for r in range(ROUNDS + 1):  # round 0 warms each drafter up and is not counted
    for folder, drafter in drafters.items():
        drafter.start(ids[:1])
        drafter.draft(ids[: CONTEXT + r], None)  # the committed context, cached
        start = time.perf_counter()
        drafter.draft(ids[: CONTEXT + r + 1], None)  # one round: the new token and the masks
        if r:
            times[folder].append((time.perf_counter() - start) * 1000)
for folder, ms in times.items():
    print(json.dumps({"drafter": folder, "draft_ms_median": round(statistics.median(ms), 1),
                      "draft_ms": [round(t, 1) for t in ms], "torch_threads": torch.get_num_threads()}))
