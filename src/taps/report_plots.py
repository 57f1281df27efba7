"""The benchmark report's figures (PNG, drawn by matplotlib's Agg canvas) and the drafter
learning curves. Imported only when a figure is drawn: `taps.report` itself needs no plotting
stack. The tree-size plots pool every dataset, so each point is one (method, budget,
temperature) over all prompts, with `taps.summary`'s definitions (tau, paired speedup, mean tree
size).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from taps.summary import distinct, machine_label, pooled_rows


def _panels(n: int, title: str, machine: str = "", panel_width_in: float = 4.5,
            panel_height_in: float = 3.6) -> tuple[Figure, list]:
    """A figure of n panels, at most three per row, drawn by Agg (no pyplot: no global state); the
    machine the numbers come from goes under the title."""
    cols = min(n, 3)
    fig = Figure(figsize=(panel_width_in * cols, panel_height_in * math.ceil(n / cols)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(math.ceil(n / cols), cols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    # about 11 characters of 10-point text per inch: the machine line wraps inside the figure
    machine = textwrap.fill(machine, width=int(11 * panel_width_in * cols))
    fig.suptitle(f"{title}\n{machine}" if machine else title, fontsize=10 if machine else None)
    return fig, axes[:n]


def plot_against_tree_size(rows: list[dict], y_key: str, y_label: str, path: Path, machine: str = "") -> bool:
    """`y_key` against mean tree size: a line per method, one marker per budget, a panel per
    temperature. Methods without trees (peers) that still have a value get a dashed level.
    Returns False (and writes nothing) when there is nothing to draw."""
    rows = [r for r in rows if r[y_key] is not None]
    temperatures = sorted({r["temperature"] for r in rows})
    if not temperatures:
        return False
    # a method keeps its colour in every panel
    colors = {method: f"C{i}" for i, method in enumerate(distinct(r["method"] for r in rows))}
    fig, axes = _panels(len(temperatures), f"{y_label} against mean tree size (all datasets)", machine)
    for ax, temperature in zip(axes, temperatures):
        at_t = [r for r in rows if r["temperature"] == temperature]
        for method in distinct(r["method"] for r in at_t):
            mine = [r for r in at_t if r["method"] == method]
            points = sorted((r for r in mine if r["mean_tree_size"] is not None), key=lambda r: r["mean_tree_size"])
            if points:
                x, y = [r["mean_tree_size"] for r in points], [r[y_key] for r in points]
                ax.plot(x, y, marker="o", color=colors[method], label=method)
                for r in points:
                    if r["budget"] is not None:
                        ax.annotate(f"b{r['budget']}", (r["mean_tree_size"], r[y_key]),
                                    textcoords="offset points", xytext=(4, 4), fontsize=7)  # fmt: skip
            else:
                ax.axhline(mine[0][y_key], linestyle="--", color=colors[method], label=f"{method} (no tree)")
        ax.set_title(f"T = {temperature:g}")
        ax.set_xlabel("mean tree size (drafted nodes per round)")
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    return True




def plot_accepted_lengths(records: list[dict], path: Path, machine: str = "") -> bool:
    """Histogram of tokens committed per round (accepted + 1), a panel per speculative method and
    a step line per (budget, temperature). Non-drafting methods (ar, peers) have nothing to show."""
    speculative = [r for r in records if r["drafter"] is not None and r["accepted_per_round"]]
    methods = distinct(r["method"] for r in speculative)
    if not methods:
        return False
    most_committed = 1 + max(a for r in speculative for a in r["accepted_per_round"])
    bin_edges = np.arange(0.5, most_committed + 1.5)  # one unit-wide bin per committed count
    fig, axes = _panels(len(methods), "tokens committed per round (accepted + 1)", machine)
    for ax, method in zip(axes, methods):
        committed: dict[tuple, list[int]] = {}
        for r in speculative:
            if r["method"] == method:
                committed.setdefault((r["budget"], r["temperature"]), []).extend(a + 1 for a in r["accepted_per_round"])
        for (budget, temperature), counts in committed.items():
            label = f"b{budget} T{temperature:g}"
            ax.hist(counts, bins=bin_edges, density=True, histtype="step", linewidth=1.5, label=label)
        ax.set_title(method)
        ax.set_xlabel("tokens committed in the round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("share of rounds")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    return True


def stage_shares(records: list[dict]) -> tuple[list[str], list[str], np.ndarray]:
    """Bar labels (method, budget), stage names (as recorded, then "other") and shares
    [bar, stage] of the summed total seconds. Records without stage times (peers) are left out."""
    timed = [r for r in records if r["stage_seconds"] and r["total_seconds"] > 0]
    stages = distinct(k for r in timed for k in r["stage_seconds"])
    groups: dict[str, list[dict]] = {}
    for r in timed:
        groups.setdefault(r["method"] + ("" if r["budget"] is None else f" b{r['budget']}"), []).append(r)
    shares = np.zeros((len(groups), len(stages) + 1))
    for i, recs in enumerate(groups.values()):
        total_s = sum(r["total_seconds"] for r in recs)
        shares[i, :-1] = [sum(r["stage_seconds"].get(s, 0.0) for r in recs) / total_s for s in stages]
        # the stages are disjoint spans of the timed call; the rest is loop overhead (clamped: float noise)
        shares[i, -1] = max(0.0, 1.0 - shares[i, :-1].sum())
    return list(groups), [*stages, "other"], shares




def plot_stage_split(records: list[dict], path: Path, machine: str = "") -> bool:
    """Stacked bars: the share of wall time spent in each decoding stage, per method and budget."""
    labels, stages, shares = stage_shares(records)
    if not labels:
        return False
    fig, (ax,) = _panels(1, "time per decoding stage (all prompts)", machine,
                         panel_width_in=max(5.0, 0.9 * len(labels) + 2))
    bottom = np.zeros(len(labels))
    for j, stage in enumerate(stages):
        ax.bar(labels, shares[:, j], bottom=bottom, label=stage)
        bottom += shares[:, j]
    ax.set_ylabel("share of total seconds")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.savefig(path, dpi=100)
    return True




def plots(records: list[dict]) -> dict[str, tuple[str, Callable[[Path], bool]]]:
    """File name -> (caption, draw); each draw writes the file and says whether it had data."""
    pooled, machine = pooled_rows(records), machine_label(records)
    return {
        "tau_vs_tree_size.png": ("tau against mean tree size",
                                 lambda p: plot_against_tree_size(pooled, "tau", "tau (tokens per round)", p, machine)),
        "speedup_vs_tree_size.png": ("speedup vs ar against mean tree size",
                                     lambda p: plot_against_tree_size(pooled, "speedup_vs_ar", "speedup vs ar", p, machine)),
        "accepted_length_hist.png": ("tokens committed per round", lambda p: plot_accepted_lengths(records, p, machine)),
        "stage_split.png": ("time per decoding stage", lambda p: plot_stage_split(records, p, machine)),
    }  # fmt: skip




def plot_learning_curves(runs: dict[str, tuple[list[dict], float]], path: Path) -> bool:
    """Held-out accuracy of every block slot against training tokens, one panel per run (e.g. the
    two drafter kinds side by side), each from a `train-drafter` log.jsonl (its evaluation records)
    and its tokens per step. Runs without evaluations are left out; False when none has any."""
    evaluated = {name: ([r for r in log if "eval_slot_acc" in r], per_step) for name, (log, per_step) in runs.items()}
    evaluated = {name: run for name, run in evaluated.items() if run[0]}
    if not evaluated:
        return False
    fig, axes = _panels(len(evaluated), "drafter learning curves (held-out)")
    for ax, (name, (evals, per_step)) in zip(axes, evaluated.items()):
        tokens = [r["step"] * per_step for r in evals]
        for slot in range(len(evals[-1]["eval_slot_acc"])):
            ax.plot(tokens, [r["eval_slot_acc"][slot] for r in evals], marker=".", label=f"slot {slot + 1}")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("top-1 accuracy")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    FigureCanvasAgg(fig).print_png(str(path))
    return True
