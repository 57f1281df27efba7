"""Learning curves of the two drafter kinds for qwen2.5-coder-1.5b, trained on the same data and
evaluated on the same held-out blocks: the shipped grown drafter's log and train-dflash.sh's.
Writes learning_curves.png here and in the shipped drafter's folder, and prints a markdown table
(held-out slot accuracy and estimated chain tau at each evaluation).

    .venv/bin/python results/drafter-kinds/curves.py
"""

import shutil
from pathlib import Path

from taps.records import read_records
from taps.report_plots import plot_learning_curves
from taps.train.drafter import tau_gain_per_doubling

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
DATA = ROOT / "data/drafters/qwen2.5-coder-1.5b/train.jsonl"
MAX_SEQ_LEN = 384  # both runs' --max-seq-len
LOGS = {
    "grown: Qwen2.5-Coder-0.5B + LoRA": ROOT / "src/taps/shipped/qwen2.5-coder-1.5b/train_log.jsonl",
    "DFlash layout: 2 layers over target features": HERE / "dflash-train_log.jsonl",
}


def main() -> None:
    lengths = [min(len(r["ids"]), MAX_SEQ_LEN) for r in read_records(DATA)]
    per_step = sum(lengths) / len(lengths)  # one sequence per optimizer step in both runs
    evals = {name: [r for r in read_records(path) if "eval_slot_acc" in r] for name, path in LOGS.items()}
    runs = {name: (log, per_step) for name, log in evals.items()}
    png = HERE / "learning_curves.png"
    plot_learning_curves(runs, png)
    shutil.copy(png, ROOT / "src/taps/shipped/qwen2.5-coder-1.5b/learning_curves.png")
    print(f"{per_step:.1f} training tokens per step\n")
    print("| drafter | step | training tokens | minutes | held-out slot accuracy 1..7 | est. chain tau |")
    print("|---|---:|---:|---:|---|---:|")
    for name, log in evals.items():
        for r in log:
            acc = " ".join(f"{a:.2f}" for a in r["eval_slot_acc"])
            print(f"| {name.split(':')[0]} | {r['step']} | {r['step'] * per_step:,.0f} | {r['elapsed_s'] / 60:.1f} "
                  f"| {acc} | {r['eval_tau_chain']:.2f} |")
    print()
    for name, log in evals.items():
        print(f"{name}: estimated chain tau {tau_gain_per_doubling(log, per_step):+.2f} per doubling of training tokens")


if __name__ == "__main__":
    main()
