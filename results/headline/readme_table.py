"""The README's Results table, from the headline's records: a row per method, a column per set,
each cell the median paired speedup over ar at T=0 / T=1 (ar's row: its tokens/s), `~` where the
95% interval contains 1 and a dagger where the cell has fewer than 30 prompts (taps.report's FEW).

    .venv/bin/python results/headline/readme_table.py [results/headline/results.jsonl]

Prints markdown; the README pastes it. The numbers and cells are report.md's (taps.report's
`headline_cell`), laid out two temperatures to a cell.
"""

import sys

from taps.records import read_records
from taps.report import headline_cell
from taps.summary import summarize

SETS = [("humaneval", "HumanEval"), ("mt-bench", "MT-Bench"), ("math_reasoning", "math"), ("summarization", "summaries"),
        ("translation", "translation"), ("qa", "QA"), ("rag", "RAG")]  # Spec-Bench's categories by their own names
ROWS = [("ar", "`ar` (tokens/s)"), ("hf-generate", "transformers `generate`"), ("chain", "`chain` (7)"),
        ("ddtree", "`ddtree` (8)"), ("taps", "`taps` (32)"), ("hf-assisted", "transformers assisted (0.5B, int8)"),
        ("prompt-lookup", "transformers prompt lookup")]


def cell(row: dict | None) -> str:
    return (row and headline_cell(row, level=" ~", tau=False)) or "-"


def main(path: str) -> None:
    rows = {(x["method"], x["dataset"].split("/")[-1], x["temperature"]): x for x in summarize(read_records(path))}
    print("| method | " + " | ".join(label for _, label in SETS) + " |")
    print("|---|" + "---:|" * len(SETS))
    for method, label in ROWS:
        cells = [" / ".join(cell(rows.get((method, name, t))) for t in (0.0, 1.0)) for name, _ in SETS]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/headline/results.jsonl")
