"""The default linear kernel for bfloat16 (taps.linear): packed oneDNN weights against plain ones, end to end.

One process (taps.bench.run_side_by_side): per prompt and method a run with the target's linear
layers on plain weights (`--linear onednn`, the default before), then one on packed weights
(`onednn-packed`, the default for bfloat16 now), each with its own copy of the target and drafter
and its own latency profile (`taps profile` with that kernel on this machine, made first), each
into an ordinary `taps bench` file. Methods ar, ddtree:8 and taps:32 on the first LIMIT (5)
HumanEval problems and MT-Bench questions (turn 1), T=0, 128 new tokens, the 1.5B in bfloat16, its
shipped drafter int8. Resumable: a rerun runs what either file lacks.
Prints per set and method the packed run's tokens/s over the plain run's (median of the paired
ratios, 95% bootstrap interval), then pooled over sets.
    [LIMIT=5] .venv/bin/python results/linear-default/side-by-side.py
"""

import os
import subprocess
from dataclasses import replace
from pathlib import Path

from taps.bench import BenchConfig, run_side_by_side
from taps.summary import paired, ratio_text, summarize

TARGET, KERNELS = "qwen2.5-coder-1.5b", ("onednn", "onednn-packed")
out = Path(__file__).parent
base = BenchConfig(target=TARGET, methods=("ar", "ddtree:8", "taps:32"), datasets=("humaneval", "mt-bench"),
                   turns=1, limit=int(os.environ.get("LIMIT", 5)), max_new_tokens=128, dtype="bfloat16",
                   drafter_quant="int8")
for kernel in KERNELS:
    profile = out / f"profile-{kernel}.json"
    if not profile.exists():
        subprocess.run([".venv/bin/taps", "profile", "--target", TARGET, "--dtype", "bfloat16", "--drafter-quant",
                        "int8", "--linear", kernel, "--out", str(profile)], check=True)
plain, packed = run_side_by_side([(replace(base, linear=k, profile=str(out / f"profile-{k}.json")), out / f"{k}.jsonl")
                                  for k in KERNELS])


rows = {(r["method"], r["dataset"]): r for r in summarize(plain)}
print(f"{'set':<10} {'method':<8} {'tokens/s plain':>14} {'packed':>7} {'tau plain':>9} {'packed':>7}  packed / plain")
for row in summarize(packed):
    key = row["method"], row["dataset"]
    pairs = paired([r for r in packed if (r["method"], r["dataset"]) == key],
                   [r for r in plain if (r["method"], r["dataset"]) == key])
    print(f"{row['dataset']:<10} {row['method']:<8} {rows[key]['tokens_per_second']:>14.2f} "
          f"{row['tokens_per_second']:>7.2f} {rows[key]['tau'] or 1:>9.2f} {row['tau'] or 1:>7.2f}  "
          f"{ratio_text(pairs)}")
for method in dict.fromkeys(r["method"] for r in packed):
    pairs = paired([r for r in packed if r["method"] == method], [r for r in plain if r["method"] == method])
    print(f"pooled {method}: {ratio_text(pairs)}")
