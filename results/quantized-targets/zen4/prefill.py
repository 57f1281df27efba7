"""A prompt's prefill, taps against llama.cpp (issue 25's tokens/s count it on both sides): the first LIMIT MT-Bench
prompts (turn 1, chat template), each prefilled ROUNDS times in turn by the w4a8 1.5B (`Target.prefill`), its
shipped w4a8 drafter (`start` and a one-position draft: its pass over the prompt) and llama-cpp-python on the
packaged Q4_K_M file (`Llama.eval` after `reset`, 2 threads, as taps bench runs it); the fastest of ROUNDS per
prompt. Writes one JSON line per prompt to OUT and prints the medians.

    .venv/bin/python results/quantized-targets/zen4/prefill.py      # LIMIT=10 ROUNDS=3 OUT=prefill.jsonl
"""

import json
import os
import statistics
import time
from pathlib import Path

import torch
from llama_cpp import Llama

import taps
from taps.assets import gguf_file
from taps.costmodel import cpu_name
from taps.datasets import load_prompts

HERE = Path(__file__).parent
LIMIT, ROUNDS = int(os.environ.get("LIMIT", 10)), int(os.environ.get("ROUNDS", 3))
OUT = Path(os.environ.get("OUT", HERE / "prefill.jsonl"))


def seconds(fn, ids: list[int]) -> float:
    start = time.perf_counter()
    fn(ids)
    return time.perf_counter() - start


def main() -> None:
    spec = taps.load("qwen2.5-coder-1.5b", dtype="bfloat16", target_quant="w4a8", drafter_quant="w4a8",
                     profile=HERE / "profile-w4a8-fused-draft-w4a8.json", reuse_prefix=False)
    llm = Llama(model_path=str(gguf_file("qwen2.5-coder-1.5b")), n_ctx=2048, n_threads=torch.get_num_threads(),
                verbose=False)

    def target(ids: list[int]) -> None:
        spec.target.prefill(ids[:-1])

    def drafter(ids: list[int]) -> None:
        spec.drafter.start(ids[:-1])
        spec.drafter.draft(ids, None, 1)

    def llama(ids: list[int]) -> None:
        llm.reset()
        llm.eval(ids[:-1])

    ways = {"taps target": target, "taps drafter": drafter, "llama.cpp": llama}
    records, cpu = [], cpu_name()
    with open(OUT, "w") as out:
        for prompt in load_prompts("mt-bench", LIMIT):
            ids = spec.encode(prompt.turns[0])
            times = {way: min(seconds(fn, ids) for _ in range(ROUNDS)) for way, fn in ways.items()}
            record = {"prompt": prompt.id, "tokens": len(ids) - 1, **{w: round(t, 4) for w, t in times.items()},
                      "cpu": cpu}
            records.append(record)
            out.write(json.dumps(record) + "\n")
    print(f"{len(records)} prompts, {statistics.median(r['tokens'] for r in records)} tokens (median):",
          ", ".join(f"{w} {statistics.median(r[w] for r in records):.3f} s" for w in ways))


if __name__ == "__main__":
    main()
