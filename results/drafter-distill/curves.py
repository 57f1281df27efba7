"""Learning curves of the drafters trained on the target's own answers (train-grown.sh and the
runs after it): held-out slot accuracy against training tokens (learning_curves.png here for the
1.5B's drafters, learning_curves_smollm2.png for SmolLM2-135M's) and a markdown table of every
evaluation, with the trend of estimated chain tau per doubling of tokens.

    .venv/bin/python results/drafter-distill/curves.py
"""

from pathlib import Path

from taps.records import read_records
from taps.report_plots import plot_learning_curves
from taps.train.drafter import tau_gain_per_doubling

HERE = Path(__file__).parent
QWEN = {
    "grown on own answers: Qwen2.5-Coder-0.5B + LoRA, 24 layers": HERE / "grown-train_log.jsonl",
    "grown on code + chat answers: 24 layers": HERE / "grown-mixed-train_log.jsonl",
    "grown on code + chat answers: 12 of 24 layers, 16,384-id head": HERE / "grown-mixed-l12-train_log.jsonl",
    "grown on code + chat answers: adapters on the masks only": HERE / "grown-mixed-masks-train_log.jsonl",
    "the same, float32, a 400-step schedule": HERE / "grown-mixed-masks-float32-400-train_log.jsonl",
    "the same, extended at step 400 to 1,000 (learning rate restarted)":
        HERE / "grown-mixed-masks-float32-1000-train_log.jsonl",
    "the same, bfloat16, one 1,000-step schedule (shipped in session 27)":
        HERE / "grown-mixed-masks-bfloat16-1000-train_log.jsonl",
    "on from the shipped one, + chat second turns, 800 steps (x: tokens after it)":
        HERE / "grown-mixed-masks-bfloat16-800-from-shipped-lr3e-4-train_log.jsonl",
    "on from the shipped one, + chat and code second turns and T=1 answers, 1,600 steps (x: tokens after it)":
        HERE / "grown-mixed-masks-bfloat16-1600-from-shipped-lr3e-4-train_log.jsonl",
    "that run extended at step 1,600 to 3,200 (learning rate restarted; x: tokens after the shipped one)":
        HERE / "grown-mixed-masks-bfloat16-3200-from-shipped-lr3e-4-train_log.jsonl",
}
SMOLLM2 = {
    "SmolLM2-135M, DFlash layout, random layers (stopped)": HERE / "smollm2-dflash-random-train_log.jsonl",
    "SmolLM2-135M, DFlash layout, its last 2 layers (stopped)": HERE / "smollm2-dflash-last-train_log.jsonl",
    "SmolLM2-135M grown from itself, adapters on the masks only": HERE / "smollm2-grown-masks-train_log.jsonl",
}
PLOTS = {"learning_curves.png": QWEN, "learning_curves_smollm2.png": SMOLLM2}


def tokens_per_step(log: list[dict]) -> float:
    """Mean training tokens per optimizer step, from the log's own count (its last record)."""
    last = max((r for r in log if r.get("step", 0) > 0 and r.get("tokens")), key=lambda r: r["step"])
    return last["tokens"] / last["step"]


def main() -> None:
    runs = {}
    for png, logs in PLOTS.items():
        plotted = {name: read_records(path) for name, path in logs.items() if path.exists()}
        plotted = {name: (log, tokens_per_step(log)) for name, log in plotted.items()}
        plot_learning_curves(plotted, HERE / png)
        runs |= plotted
    print("| drafter | step | training tokens | minutes | held-out slot accuracy 1..7 | est. chain tau |")
    print("|---|---:|---:|---:|---|---:|")
    for name, (log, per_step) in runs.items():
        for r in (r for r in log if "eval_slot_acc" in r):
            acc = " ".join(f"{a:.2f}" for a in r["eval_slot_acc"])
            print(f"| {name} | {r['step']} | {r['step'] * per_step:,.0f} | {r['elapsed_s'] / 60:.1f} "
                  f"| {acc} | {r['eval_tau_chain']:.2f} |")
    print()
    for name, (log, per_step) in runs.items():
        evals = [r for r in log if "eval_slot_acc" in r]
        print(f"{name}: {per_step:.0f} tokens a step; estimated chain tau "
              f"{tau_gain_per_doubling(evals, per_step):+.2f} per doubling of training tokens")


if __name__ == "__main__":
    main()
