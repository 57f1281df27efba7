"""Which drafter quantization to pair with a w4a8 target on taps.vnni (Zen 5, session 46): the
shipped grown drafter as int8 (dynamic, fbgemm: `--drafter-quant auto`'s choice off AMX) and as w4a8
(the target's kernel), side by side in one process (taps.bench.run_side_by_side), 10 HumanEval + 10
MT-Bench turn 1, T=0, 128 tokens, bfloat16 activations, ar, ddtree:8 and taps:32; each drafter's profile
measured before (`taps profile ... --drafter-quant Q`). Resumable.

    .venv/bin/python results/quantized-targets/zen5/drafter-quant/run.py   # -> int8.jsonl, w4a8.jsonl"""

import subprocess
from pathlib import Path

from taps.bench import BenchConfig, run_side_by_side

HERE = Path(__file__).parent
benches = []
for quant in ("int8", "w4a8"):
    profile = HERE / f"profile-w4a8-draft-{quant}.json"
    if not profile.exists():
        subprocess.run([".venv/bin/taps", "profile", "--target", "qwen2.5-coder-1.5b", "--dtype", "bfloat16",
                        "--target-quant", "w4a8", "--drafter-quant", quant, "--sizes", "0,1,3,7,15,31",
                        "--contexts", "256", "--repeats", "3", "--out", str(profile)], check=True)
    benches.append((BenchConfig(target="qwen2.5-coder-1.5b", methods=("ar", "ddtree:8", "taps:32"),
                                datasets=("humaneval", "mt-bench"), turns=1, limit=10, max_new_tokens=128,
                                dtype="bfloat16", temperatures=(0.0,), drafter_quant=quant, target_quant="w4a8",
                                profile=str(profile)), HERE / f"{quant}.jsonl"))
run_side_by_side(benches)
