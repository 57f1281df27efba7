"""taps.heap in the decoding loop: the same run in fresh processes with glibc's default malloc
thresholds (`taps.load(..., keep_freed_memory=False)`) and with the ones `keep_freed_memory` sets,
alternating, PAIRS pairs (default 3; the setting is process-wide, so each run is its own process).
Each run: the w4a8 1.5B beside its shipped drafter (w4a8), bfloat16, T=0, 128 new tokens, LIMIT
MT-Bench turn-1 prompts (default 4) after a warm-up answer, methods ar and taps:32. Writes
heap-ab.jsonl (one line per process and method) and prints per setting the median tokens/s and
stages, the minor page faults a round took (the mechanism: deterministic, where times drift with the
machine's neighbours), and the paired ratios kept/default with their median.

    .venv/bin/python results/quantized-targets/xeon-amx/heap-ab.py          # -> heap-ab.jsonl, heap-ab.txt
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
PAIRS = int(os.environ.get("PAIRS", "3"))
LIMIT = int(os.environ.get("LIMIT", "4"))


def run(keep: bool) -> list[dict]:
    """One process's records (this file run with a setting as its argument)."""
    out = subprocess.run([sys.executable, __file__, "keep" if keep else "default"], capture_output=True, text=True,
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def child(setting: str) -> None:
    import resource

    import taps
    from taps.datasets import load_prompts

    spec = taps.load("qwen2.5-coder-1.5b", method="taps", budget=32, dtype="bfloat16", target_quant="w4a8",
                     drafter_quant="w4a8", profile=str(HERE / "profile-w4a8-vnni-w4a8.json"), reuse_prefix=False,
                     keep_freed_memory=setting == "keep")
    prompts = load_prompts("mt-bench", LIMIT + 1)
    spec.generate(prompts[0].turns[0], max_new_tokens=16)  # warm-up
    for method in ("ar", "taps"):
        rates, rounds = [], []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for prompt in prompts[1:]:
            start = time.perf_counter()
            result = spec.generate(prompt.turns[0], max_new_tokens=128, method=method, on_round=rounds.append)
            rates.append(len(result.token_ids) / (time.perf_counter() - start))
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / len(rounds)
        stages = [1000 * statistics.median(r.seconds[i] for r in rounds) for i in range(4)]
        print(json.dumps({"setting": setting, "method": method, "tokens_per_s": rates, "stage_ms": stages,
                          "faults_per_round": faults}))


def main() -> None:
    records = []
    with (HERE / "heap-ab.jsonl").open("w") as out:
        for pair in range(PAIRS):
            for keep in ((False, True) if pair % 2 == 0 else (True, False)):
                for record in run(keep):
                    record["pair"] = pair
                    records.append(record)
                    out.write(json.dumps(record) + "\n")
                    out.flush()
    lines = [f"# {PAIRS} pairs of processes, {LIMIT} MT-Bench prompts each, w4a8 1.5B + shipped drafter (w4a8), "
             f"bfloat16, T=0, 128 tokens; {cpu()}"]
    for method in ("ar", "taps"):
        by = {(r["pair"], r["setting"]): r for r in records if r["method"] == method}
        for setting in ("default", "keep"):
            runs = [by[p, setting] for p in range(PAIRS)]
            rate = statistics.median(x for r in runs for x in r["tokens_per_s"])
            stages = [statistics.median(r["stage_ms"][i] for r in runs) for i in range(4)]
            faults = statistics.median(r["faults_per_round"] for r in runs)
            lines.append(f"{method:5s} {setting:8s} {rate:6.2f} tok/s  propose/select/verify/commit ms "
                         + "/".join(f"{x:.1f}" for x in stages) + f"  page faults a round {faults:.0f}")
        ratios = [statistics.median(by[p, "keep"]["tokens_per_s"]) / statistics.median(by[p, "default"]["tokens_per_s"])
                  for p in range(PAIRS)]
        lines.append(f"{method:5s} kept/default per pair {' '.join(f'{x:.3f}' for x in ratios)}, "
                     f"median {statistics.median(ratios):.3f}")
    (HERE / "heap-ab.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cpu() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown CPU")


if __name__ == "__main__":
    child(sys.argv[1]) if len(sys.argv) > 1 else main()
