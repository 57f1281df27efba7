"""Issue 25 in one run: the 1.5B's target in bfloat16, w8a8 and w4a8 side by side
(taps.bench.run_side_by_side: per prompt and method, each scheme's run in turn, one process), each
beside llama.cpp's plain decoding of the packaged Q4_K_M file, so every number in the table
comes from the same hour of the same machine. 10 HumanEval + 10 MT-Bench turn 1, T=0, 128 new
tokens, bfloat16 activations, the shipped drafter in w8a8 (auto's choice on AMX, and the best
beside a w4a8 target: README.md, session 44); methods ar, ddtree:8, taps:32 and llama-cpp in each
file (llama.cpp runs once per scheme and prompt: the same computation three times, its spread
the machine's noise). Each scheme's latency profile is the one measured for it before
(`profile-none-shared-draft-w8a8.json`, `profile-w8a8-decoder-draft-w8a8.json`,
`profile-w4a8-d8-draft-w8a8.json`), refitted online by the loop. w4a8 needs `make install-torchao`.

    .venv/bin/python results/quantized-targets/xeon-amx/schemes.py     # -> schemes/<scheme>.jsonl, report-<scheme>/
    OUT=results/quantized-targets/zen5 DRAFTERS=none:w8a8,w8a8:w8a8,w4a8:w4a8 .venv/bin/python ...schemes.py
        # another CPU's folder: each scheme's drafter quantization, its profile-<scheme>-draft-<drafter>.json

RUN=<folder> writes another run's files (default schemes/); PROFILES=scheme:file,... names profiles other
than DRAFTERS' (e.g. `RUN=schemes-attn PROFILES=w4a8:profile-w4a8-attn-draft-w4a8.json` after the row-wise
attention kernel). METHODS=a,b,... replaces the methods (the same in every file). llama.cpp's own speculation
(llama-cpp-draft, llama-cpp-lookup) in all three sessions outgrew 24 GiB of memory (Zen 5, session 48):
bench it beside one target (bench.sh). Resumable: a rerun runs what a
file lacks. Then prints each file's summary (`taps report`)."""

import os
import subprocess
from pathlib import Path

from taps.bench import BenchConfig, run_side_by_side

HERE = Path(os.environ.get("OUT", Path(__file__).parent))
OUT = HERE / os.environ.get("RUN", "schemes")
DRAFTERS = {"none": "w8a8", "w8a8": "w8a8", "w4a8": "w8a8"}  # scheme -> its drafter's quantization
PROFILES = {"none": "profile-none-shared-draft-w8a8.json", "w8a8": "profile-w8a8-decoder-draft-w8a8.json",
            "w4a8": "profile-w4a8-d8-draft-w8a8.json"}
if "DRAFTERS" in os.environ:
    DRAFTERS = dict(pair.split(":") for pair in os.environ["DRAFTERS"].split(","))
    PROFILES = {scheme: f"profile-{scheme}-draft-{drafter}.json" for scheme, drafter in DRAFTERS.items()}
if "PROFILES" in os.environ:
    PROFILES |= dict(pair.split(":") for pair in os.environ["PROFILES"].split(","))

METHODS = tuple(os.environ.get("METHODS", "ar,ddtree:8,taps:32,llama-cpp").split(","))

OUT.mkdir(exist_ok=True)
benches = [(BenchConfig(target="qwen2.5-coder-1.5b", methods=METHODS,
                        datasets=("humaneval", "mt-bench"), turns=1, limit=10, max_new_tokens=128, dtype="bfloat16",
                        temperatures=(0.0,), drafter_quant=DRAFTERS[scheme], target_quant=scheme,
                        profile=str(HERE / profile)), OUT / f"{scheme}.jsonl")
           for scheme, profile in PROFILES.items()]
run_side_by_side(benches)
for _, path in benches:
    subprocess.run([".venv/bin/taps", "report", str(path), "--out", str(OUT / f"report-{path.stem}"), "--complete-only"],
                   check=True)
