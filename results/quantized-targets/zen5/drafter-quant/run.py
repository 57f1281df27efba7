"""Which drafter quantization to pair with a w4a8 target on taps.vnni (Zen 5, session 46): the
shipped grown drafter as int8 (dynamic, fbgemm: `--drafter-quant auto`'s choice off AMX) and as w4a8
(the target's kernel), side by side in one process (taps.bench.run_side_by_side), 10 HumanEval + 10
MT-Bench turn 1, T=0, 128 tokens, bfloat16 activations, ar, ddtree:8 and taps:32; each drafter's profile
measured before (`taps profile ... --drafter-quant Q`). Resumable.

    .venv/bin/python results/quantized-targets/zen5/drafter-quant/run.py   # -> int8.jsonl, w4a8.jsonl

TARGET_QUANT=none (session 48) runs the same pair beside the bfloat16 target instead, methods ar and
taps:32, into int8-none.jsonl and w4a8-none.jsonl, each drafter with its profile beside that target.
QUANTS=w8a8,w4a8 compares other drafter quantizations (default int8,w4a8), OUT=folder writes another
CPU's files (session 49: OUT=results/quantized-targets/xeon-amx/drafter-quant, w8a8 being auto's choice
with AMX before)."""

import os
import subprocess
from pathlib import Path

from taps.bench import BenchConfig, run_side_by_side

HERE = Path(os.environ.get("OUT", Path(__file__).parent))
QUANTS = os.environ.get("QUANTS", "int8,w4a8").split(",")
TARGET_QUANT = os.environ.get("TARGET_QUANT", "w4a8")
METHODS = ("ar", "ddtree:8", "taps:32") if TARGET_QUANT == "w4a8" else ("ar", "taps:32")
SUFFIX = "" if TARGET_QUANT == "w4a8" else f"-{TARGET_QUANT}"  # the files of session 46 keep their names
HERE.mkdir(exist_ok=True)
benches = []
for quant in QUANTS:
    profile = HERE / f"profile-{TARGET_QUANT}-draft-{quant}.json"
    if not profile.exists():
        subprocess.run([".venv/bin/taps", "profile", "--target", "qwen2.5-coder-1.5b", "--dtype", "bfloat16",
                        "--target-quant", TARGET_QUANT, "--drafter-quant", quant, "--sizes", "0,1,3,7,15,31",
                        "--contexts", "256", "--repeats", "3", "--out", str(profile)], check=True)
    benches.append((BenchConfig(target="qwen2.5-coder-1.5b", methods=METHODS,
                                datasets=("humaneval", "mt-bench"), turns=1, limit=10, max_new_tokens=128,
                                dtype="bfloat16", temperatures=(0.0,), drafter_quant=quant, target_quant=TARGET_QUANT,
                                profile=str(profile)), HERE / f"{quant}{SUFFIX}.jsonl"))
run_side_by_side(benches)
