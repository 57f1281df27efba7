"""Where a round's time goes beside the w4a8 1.5B and its shipped w4a8 drafter, both fused (taps.layer), in one
process with every part timed in turn, REPEATS times (for the host's memory bandwidth, which drifts between and
within processes): the target's forward of a tree of 0, 3 and 7 drafted nodes after 256 tokens of context
(`Target.forward_tree`), its layers' products alone (taps.vnni over the same packed weights, 1, 4 and 8 rows)
and its int8 head alone; the drafter's draft of 2 new tokens and 3 masks and of 4 new tokens and 6 masks
(`GrownDrafter.draft`) as it is, with its mask-row adapters off, and with its head off (logits of zeros), and
its layers' products alone (5 and 10 rows). Writes one JSON line per part (median ms and every sample) to OUT
and prints them.

    .venv/bin/python results/quantized-targets/zen4/round-parts.py      # REPEATS=9 OUT=round-parts.jsonl
"""

import json
import os
import statistics
import time
from pathlib import Path

import torch

import taps
from taps import vnni
from taps.costmodel import cpu_name, random_tree
from taps.datasets import load_prompts

HERE = Path(__file__).parent
REPEATS = int(os.environ.get("REPEATS", 9))
OUT = Path(os.environ.get("OUT", HERE / "round-parts.jsonl"))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    spec = taps.load("qwen2.5-coder-1.5b", dtype="bfloat16", target_quant="w4a8", drafter_quant="w4a8",
                     profile=HERE / "profile-w4a8-fused-draft-w4a8.json")
    target, drafter = spec.target, spec.drafter
    assert target.decoder.fused is not None and drafter.decoder.fused is not None, "both models fused"

    gen = torch.Generator().manual_seed(0)
    context = torch.randint(target.vocab_size, (257,), generator=gen).tolist()
    target.prefill(context[:-1])
    trees = {n: random_tree(n, context[-1], target.vocab_size, gen) for n in (0, 3, 7)}

    def forward(n: int) -> None:
        target.forward_tree(trees[n])
        target.commit([], trees[n].n_nodes)  # the context stays as it was

    def products(layers, rows: int, dtype) -> callable:
        xs = {}
        for layer in layers:
            for packed in layer.products:
                k = packed[0].shape[1] * 8
                xs.setdefault(k, torch.randn(rows, k, generator=gen).to(dtype))
        return lambda: [vnni.linear(xs[p[0].shape[1] * 8], p, layer.group) for layer in layers for p in layer.products]

    head = target.model.lm_head
    head_rows = {r: torch.randn(r, head.in_features, generator=gen).to(torch.bfloat16) for r in (1, 4, 8)}

    # the drafter's draft over a real prompt's context; `switch` turns its adapters or head off
    decoder, switch = drafter.decoder, set()
    call, logits = type(decoder).__call__, type(decoder).logits
    type(decoder).__call__ = lambda self, tokens, cache, n, keep: call(self, tokens, cache,
                                                                       0 if "adapters" in switch else n, keep)
    type(decoder).logits = lambda self, x: (torch.zeros(x.shape[0], drafter.vocab_size) if "head" in switch
                                            else logits(self, x))
    ids = spec.encode(load_prompts("mt-bench", 1)[0].turns[0]) + list(range(1000, 1400))
    drafter.start(ids[:200])
    at = [200]

    def draft(new: int, slots: int, off: str | None) -> callable:
        def run() -> None:
            switch.clear()
            switch.update({off} - {None})
            drafter.draft(ids[: at[0] + new], None, slots)
            at[0] += new
            switch.clear()
        return run

    parts = {("target forward", n + 1): lambda n=n: forward(n) for n in trees}
    parts |= {("target products", r): products(target.decoder.fused, r, torch.bfloat16) for r in (1, 4, 8)}
    parts |= {("target head", r): (lambda r=r: head(head_rows[r])) for r in (1, 4, 8)}
    for new, slots in ((2, 4), (4, 7)):
        for off in (None, "adapters", "head"):
            name = "draft" + (f", {off} off" if off else "") + f" ({new} new + {slots - 1} masks)"
            parts[name, new + slots - 1] = draft(new, slots, off)
    parts |= {("drafter products", r): products(drafter.decoder.fused, r, torch.float32) for r in (5, 10)}

    for fn in parts.values():  # first calls of a shape pay one-off costs
        fn()
    samples = {key: [] for key in parts}
    for _ in range(REPEATS):
        for key, fn in parts.items():
            samples[key].append(timed(fn))
    cpu = cpu_name()
    with open(OUT, "w") as out:
        for (part, rows), ms in samples.items():
            record = {"part": part, "rows": rows, "median_ms": round(statistics.median(ms), 2),
                      "ms": [round(m, 2) for m in ms], "cpu": cpu}
            out.write(json.dumps(record) + "\n")
            print(f"{part:45s} {rows:3d} rows {record['median_ms']:7.2f} ms")


if __name__ == "__main__":
    main()
