"""Issue 22: a candidate against the shipped drafter over two side-by-side.py folders of the same
prompts, one made with each session first (SWAP=1 for the second), their pairs taken together.

Why: the session a process makes second ran faster (side-by-side.py, SWAP), so one folder's
ratios carry that order's bias; with each drafter second in one of the folders the bias enters
the pooled pairs once each way. Prints, per method, the candidate's tokens/s over the shipped
drafter's (median of the paired ratios of both folders, 95% bootstrap interval), each folder's
own median, and each drafter's tau over both folders (taps.summary's: new tokens over rounds), over
the temperatures both folders hold.
    .venv/bin/python results/drafter-distill/both-orders.py FOLDER FOLDER_SWAPPED
"""

import sys
from pathlib import Path

from taps.records import read_records
from taps.summary import median_speed_ratio, paired, ratio_text, summarize


def tau(records: list[dict]) -> float:
    """taps.summary's tau (every new token over every round) of one method's records, pooled over sets."""
    (row,) = summarize({**r, "dataset": "pooled", "temperature": 0.0} for r in records)
    return row["tau"]


def of(records: list[dict], method: str, dataset: str) -> list[dict]:
    return [r for r in records if r["method"] == method and dataset in ("all", r["dataset"])]


folders = sys.argv[1:3]
shipped = {f: read_records(Path(f) / "shipped.jsonl") for f in folders}
cand = {f: read_records(Path(f) / "candidate.jsonl") for f in folders}
# the temperatures both folders hold: pairs of one order alone would carry that order's bias
common = set.intersection(*({r["temperature"] for r in cand[f]} for f in folders))
shipped = {f: [r for r in records if r["temperature"] in common] for f, records in shipped.items()}
cand = {f: [r for r in records if r["temperature"] in common] for f, records in cand.items()}
print(f"{'method':<8} {'set':<10} {'tau shipped':>11} {'tau cand.':>9}  {'each folder':>13}  "
      "candidate / shipped tokens/s, both")
for method in dict.fromkeys(r["method"] for f in folders for r in cand[f]):
    for dataset in [*dict.fromkeys(r["dataset"] for f in folders for r in cand[f]), "all"]:
        pairs = {f: paired(of(cand[f], method, dataset), of(shipped[f], method, dataset)) for f in folders}
        both = [p for f in folders for p in pairs[f]]
        each = " ".join(f"{median_speed_ratio(pairs[f]):.3f}" for f in folders)
        print(f"{method:<8} {dataset:<10} {tau([b for _, b in both]):>11.2f} {tau([r for r, _ in both]):>9.2f}  "
              f"{each:>13}  {ratio_text(both)}")
