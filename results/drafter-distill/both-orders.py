"""Issue 22: a candidate against the shipped drafter over two side-by-side.py folders of the same
prompts, one made with each session first (SWAP=1 for the second), their pairs taken together.

Why: the session a process makes second ran faster (side-by-side.py, SWAP), so one folder's
ratios carry that order's bias; with each drafter second in one of the folders the bias enters
the pooled pairs once each way. Prints, per method, the candidate's tokens/s over the shipped
drafter's (median of the paired ratios of both folders, 95% bootstrap interval), each folder's
own median, and tau (mean accepted tokens a round, both folders) of each drafter.
    .venv/bin/python results/drafter-distill/both-orders.py FOLDER FOLDER_SWAPPED
"""

import statistics
import sys
from pathlib import Path

from taps.records import read_records
from taps.summary import median_speed_ratio, paired, ratio_text


def runs(folder: str, name: str) -> list[dict]:
    return [r for r in read_records(Path(folder) / f"{name}.jsonl") if "prompt_id" in r]


def tau(records: list[dict]) -> float:
    return statistics.mean(r["new_tokens"] / len(r["accepted_per_round"]) for r in records)


def of(records: list[dict], method: str, dataset: str) -> list[dict]:
    return [r for r in records if r["method"] == method and dataset in ("all", r["dataset"])]


folders = sys.argv[1:3]
shipped = {f: runs(f, "shipped") for f in folders}
cand = {f: runs(f, "candidate") for f in folders}
print(f"{'method':<8} {'set':<10} {'tau shipped':>11} {'tau cand.':>9}  {'each folder':>13}  "
      "candidate / shipped tokens/s, both")
for method in dict.fromkeys(r["method"] for f in folders for r in cand[f]):
    for dataset in [*dict.fromkeys(r["dataset"] for f in folders for r in cand[f]), "all"]:
        pairs = {f: paired(of(cand[f], method, dataset), of(shipped[f], method, dataset)) for f in folders}
        both = [p for f in folders for p in pairs[f]]
        each = " ".join(f"{median_speed_ratio(pairs[f]):.3f}" for f in folders)
        taus = (tau([b for _, b in both]), tau([r for r, _ in both])) if method != "ar" else (1.0, 1.0)
        print(f"{method:<8} {dataset:<10} {taus[0]:>11.2f} {taus[1]:>9.2f}  {each:>13}  {ratio_text(both)}")
