"""`+pause` against the same method without it, per set, from bench.sh's files.

Prints, per file, set and method: tokens/s of the method and of its +pause twin over plain
decoding (medians of paired per-prompt ratios), +pause over the method itself (median paired
ratio, 95% bootstrap interval), the share of +pause's rounds that were plain (tree size 0: paused,
the one measured plain round, or a last round with one token left), and both taus. Writes the
rows to compare.jsonl beside the inputs (one line per file, set and method).
    .venv/bin/python results/pause/compare.py results/pause/zen5-avx512bf16-*.jsonl
"""

import json
import sys
from pathlib import Path

from taps.records import read_records
from taps.summary import median_speed_ratio, paired, ratio_interval, summarize


def of(records: list[dict], method: str, dataset: str) -> list[dict]:
    return [r for r in records if r["method"] == method and dataset in ("all", r["dataset"])]


def tau(records: list[dict]) -> float:
    """taps.summary's tau (every new token over every round) of one method's records, pooled."""
    (row,) = summarize({**r, "dataset": "pooled"} for r in records)
    return row["tau"]


rows = []
for path in sys.argv[1:]:
    records = read_records(Path(path))
    methods = [m for m in dict.fromkeys(r["method"] for r in records) if m.endswith("+pause")]
    for dataset in [*dict.fromkeys(r["dataset"] for r in records), "all"]:
        ar = of(records, "ar", dataset)
        for gated in methods:
            base = gated.removesuffix("+pause")
            own, twin = of(records, base, dataset), of(records, gated, dataset)
            pairs = paired(twin, own)
            low, high = ratio_interval(pairs)
            sizes = [n for r in twin for n in r["tree_sizes"]]
            rows.append({
                "file": Path(path).name, "dataset": dataset, "method": base, "prompts": len(pairs),
                "vs_ar": median_speed_ratio(paired(own, ar)), "pause_vs_ar": median_speed_ratio(paired(twin, ar)),
                "pause_vs_method": median_speed_ratio(pairs), "ci_low": low, "ci_high": high,
                "plain_round_share": sizes.count(0) / len(sizes), "tau": tau(own), "pause_tau": tau(twin),
            })
print(f"{'file':<28} {'set':<10} {'method':<7} {'vs ar':>6} {'+pause':>7}  {'+pause / method':<22} "
      f"{'plain rounds':>12} {'tau':>5} {'+pause':>6}")
for r in rows:
    print(f"{r['file']:<28} {r['dataset']:<10} {r['method']:<7} {r['vs_ar']:>6.3f} {r['pause_vs_ar']:>7.3f}  "
          f"{r['pause_vs_method']:.3f} [{r['ci_low']:.3f}-{r['ci_high']:.3f}]  {r['plain_round_share']:>12.2f} "
          f"{r['tau']:>5.2f} {r['pause_tau']:>6.2f}")
out = Path(sys.argv[1]).parent / "compare.jsonl"
out.write_text("".join(json.dumps(r) + "\n" for r in rows))
