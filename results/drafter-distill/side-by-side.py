"""Issue 22: is a candidate drafter faster end to end than the shipped one, not just better on tau?

Both drafters in one process (taps.bench.run_side_by_side): per prompt and method the shipped
drafter's run, then the candidate's, each session with its own copy of the target, its drafter's
scorer and its own latency profile (`taps profile` with that drafter on this machine, made first),
each into its own records file, so each file is an ordinary `taps bench` file (`taps report` reads
it) and ar runs in both (its two medians show the machine's noise). Methods chain:7, ddtree:8 and
taps:32 beside ar on the first 10 HumanEval problems, 10 MT-Bench questions (turn 1) and 10
GSM-Symbolic problems (DATASETS=a,b picks others), T=0 (TEMPERATURES=0,1 adds T=1), at most 128
new tokens, drafters int8, the target in DTYPE (default: taps' default on this CPU, float32 where
it has no native bfloat16).
TARGET=smollm2-135m compares drafters of that target instead of qwen2.5-coder-1.5b's; QUANT=none,int8
sets each drafter's quantization (shipped, candidate; default int8 for both): SmolLM2's shipped
DFlash drafter shares the target's dtype and runs int8 only beside a float32 target.
TARGET_QUANT=w8a8 (or int8, int4) quantizes the target's weights for both (taps.weightonly; default none).
PEERS=llama-cpp adds peers (taps bench's --methods names) to both files' methods, as ar is: each file
is then a whole `taps bench` of its drafter beside the peers (issue 25's llama.cpp comparison).
Resumable: a rerun runs what either file lacks; LIMIT=N takes the first N prompts of each set (the
files stay valid for a later rerun with more).
BASELINE=FOLDER stands in for the shipped drafter: once a candidate ships, the one it replaced
(its folder as git held it), so that the comparison can still be run or finished.
SWAP=1 makes the candidate's session first (default: the shipped drafter's). Why: drafts ran
faster in whichever session the process made second, the same architecture on the same host:
per round 168-183 ms (the shipped drafter's, made first) against 113-123 on HumanEval, then 108-111
(the candidate's, made first) against 98 with the order swapped; timed alternately in one process,
6-8% (session 40, 2-core Intel Xeon with AMX, a memory-starved host). A candidate made second gains
that for nothing: run both orders into two folders and take their pairs together (both-orders.py).
Plain decoding, the same computation in both files, read 1.04-1.05x in the candidate's file in both
orders: noise between the files that the order does not explain, the yardstick for the rest.

Prints, per set and method, the candidate's tokens/s over the shipped drafter's on the same
prompts (median of the paired ratios, 95% bootstrap interval), each one's tau and speedup over ar,
then the same ratio pooled over sets per method, over all drafting methods, and for ar (noise).
    [TARGET=smollm2-135m] [QUANT=none,int8] [TARGET_QUANT=w8a8] [PEERS=llama-cpp] [DTYPE=float32] [LIMIT=10] \
      [DATASETS=humaneval,mt-bench] [TEMPERATURES=0,1] [BASELINE=FOLDER] [SWAP=1] \
      .venv/bin/python results/drafter-distill/side-by-side.py CANDIDATE OUT_DIR
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from taps.bench import BenchConfig, run_side_by_side
from taps.drafters import shipped_drafter
from taps.linear import default_dtype
from taps.summary import paired, ratio_text, summarize

TARGET = os.environ.get("TARGET", "qwen2.5-coder-1.5b")
candidate, out = sys.argv[1], Path(sys.argv[2])
dtype = os.environ.get("DTYPE") or default_dtype()
limit = int(os.environ.get("LIMIT", 10))
datasets = tuple(os.environ.get("DATASETS", "humaneval,mt-bench,gsm-symbolic").split(","))
temperatures = tuple(float(t) for t in os.environ.get("TEMPERATURES", "0").split(","))
quants = dict(zip(("shipped", "candidate"), os.environ.get("QUANT", "int8,int8").split(",")))
target_quant = os.environ.get("TARGET_QUANT", "none")
peers = tuple(filter(None, os.environ.get("PEERS", "").split(",")))
out.mkdir(parents=True, exist_ok=True)
drafters = {"shipped": os.environ.get("BASELINE") or shipped_drafter(TARGET), "candidate": candidate}
for name, drafter in drafters.items():
    profile = out / f"profile-{name}.json"
    if not profile.exists():
        subprocess.run([".venv/bin/taps", "profile", "--target", TARGET, "--drafter", drafter, "--dtype", dtype,
                        "--drafter-quant", quants[name], "--target-quant", target_quant, "--out", str(profile)],
                       check=True)
base = BenchConfig(target=TARGET, methods=("ar", "chain:7", "ddtree:8", "taps:32", *peers),
                   datasets=datasets, turns=1, limit=limit, max_new_tokens=128, dtype=dtype, temperatures=temperatures,
                   target_quant=target_quant)
cfgs = [replace(base, drafter=drafter, drafter_quant=quants[name], profile=str(out / f"profile-{name}.json"))
        for name, drafter in drafters.items()]
benches = [(cfg, out / f"{name}.jsonl") for cfg, name in zip(cfgs, drafters)]
if os.environ.get("SWAP"):  # the candidate's session made (and run) first: drafts ran faster in the second (above)
    cand, shipped = run_side_by_side(benches[::-1])
else:
    shipped, cand = run_side_by_side(benches)


def pairs_where(keep) -> list[tuple[dict, dict]]:
    """(candidate record, shipped record) of the same prompt and temperature, both kept by `keep`."""
    return paired([r for r in cand if keep(r)], [r for r in shipped if keep(r)])


undrafted = {"ar", *peers}  # the same runs in both files: their ratios are the machine's noise
rows = {(r["method"], r["dataset"], r["temperature"]): r for r in summarize(shipped)}
print(f"{'set':<10} {'T':>3} {'method':<8} {'tau shipped':>11} {'tau cand.':>9} {'x ar shipped':>12} "
      f"{'x ar cand.':>10}  candidate / shipped tokens/s")
for row in summarize(cand):
    key = method, dataset, temperature = row["method"], row["dataset"], row["temperature"]
    if method in undrafted:
        continue
    old = rows[key]
    print(f"{dataset:<10} {temperature:>3g} {method:<8} {old['tau']:>11.2f} {row['tau']:>9.2f} "
          f"{old['speedup_vs_ar']:>12.2f} {row['speedup_vs_ar']:>10.2f}  "
          f"{ratio_text(pairs_where(lambda r, key=key: (r['method'], r['dataset'], r['temperature']) == key))}")
# Pooled over sets and temperatures, each prompt still paired with itself; ar (and a peer) against
# itself is the machine's noise between the two files, the yardstick for the others.
pooled = {m: pairs_where(lambda r, m=m: r["method"] == m) for m in dict.fromkeys(r["method"] for r in cand)}
print("pooled: " + "; ".join(f"{m} {ratio_text(p)}" for m, p in pooled.items())
      + f"; all drafting methods {ratio_text([p for m, ps in pooled.items() if m not in undrafted for p in ps])}")
