"""The benchmark report's figures (PNG, drawn by matplotlib's Agg canvas) and the drafter
learning curves. Imported only when a figure is drawn: `taps.report` itself needs no plotting
stack. The tree-size plots have a panel per prompt set and temperature (each Spec-Bench category
its own set, as in the report's tables), each point one (method, budget) over the set's prompts,
with `taps.summary`'s definitions (tau, paired speedup with its 95% interval, mean tree size).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator
from matplotlib.transforms import Bbox

from taps.summary import distinct, machine_label


PANEL_WIDTH_IN = 4.5


def _panels(n: int, title: str, machine: str = "", panel_width_in: float = PANEL_WIDTH_IN,
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


def _save(fig: Figure | None, path: Path) -> bool:
    """Write a figure as PNG; False (and nothing written) when there was nothing to draw."""
    if fig is None:
        return False
    fig.savefig(path, dpi=100)
    return True


# where a budget label may sit relative to its point (offset points), in order of preference
LABEL_OFFSETS = ((4, 4), (4, -11), (-24, 4), (-24, -11), (4, 13), (-24, 13), (4, -20), (-24, -20), (14, -4),
                 (-34, -4))  # fmt: skip


def _place_labels(fig: Figure, labels: dict) -> None:
    """Annotate points with short labels (axes -> [(x, y, text)]), each at the first LABEL_OFFSETS
    position inside its axes whose box overlaps no label placed before it and no labelled point,
    else the first that overlaps no label (display coordinates, after a layout pass that fixes axis
    limits and positions); a label with no such position is left out rather than drawn over another."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax, points in labels.items():
        frame = ax.get_window_extent(renderer)
        markers = [Bbox.from_bounds(*(ax.transData.transform((x, y)) - 4), 8, 8) for x, y, _ in points]
        placed = []
        for x, y, text in points:
            notes = [ax.annotate(text, (x, y), textcoords="offset points", xytext=offset, fontsize=7)
                     for offset in LABEL_OFFSETS]
            boxes = [note.get_window_extent(renderer) for note in notes]
            free = [i for i, box in enumerate(boxes) if frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
                    and not any(box.overlaps(other) for other in placed)]
            clear = [i for i in free if not any(boxes[i].overlaps(m) for m in markers)]
            keep = (clear or free or [None])[0]
            for i, note in enumerate(notes):
                if i == keep:
                    note.set_in_layout(False)  # the saved figure keeps this layout, so the boxes stay apart
                    placed.append(boxes[i])
                else:
                    note.remove()


def figure_against_tree_size(rows: list[dict], y_key: str, y_label: str, machine: str = "",
                             interval: bool = False) -> Figure | None:
    """`y_key` against mean tree size: a panel per (prompt set, temperature), a line per method with
    its budgets labelled; `interval`: the 95% interval (ci_low, ci_high) as error bars. Methods
    without trees (peers) that still have a value get a dashed level, their interval a band. A
    legend for the figure sits below the panels, off the data. None when there is nothing to draw."""
    rows = [r for r in rows if r[y_key] is not None]
    panels = distinct((r["dataset"], r["temperature"]) for r in rows)
    if not panels:
        return None
    # a method keeps its colour in every panel
    colors = {method: f"C{i % 10}" for i, method in enumerate(distinct(r["method"] for r in rows))}
    fig, axes = _panels(len(panels), f"{y_label} against mean tree size", machine)
    budget_labels = {}
    for ax, (dataset, temperature) in zip(axes, panels):
        here = [r for r in rows if (r["dataset"], r["temperature"]) == (dataset, temperature)]
        budget_labels[ax] = []
        for method in distinct(r["method"] for r in here):
            mine = [r for r in here if r["method"] == method]
            points = sorted((r for r in mine if r["mean_tree_size"] is not None), key=lambda r: r["mean_tree_size"])
            if points:
                x, y = [r["mean_tree_size"] for r in points], [r[y_key] for r in points]
                ax.errorbar(x, y, yerr=_errors(points, y_key) if interval else None, marker="o", capsize=3,
                            color=colors[method], label=method)
                budget_labels[ax] += [(r["mean_tree_size"], r[y_key], f"b{r['budget']}") for r in points
                                      if r["budget"] is not None]
            else:
                ax.axhline(mine[0][y_key], linestyle="--", color=colors[method], label=f"{method} (no tree)")
                if interval and mine[0]["ci_low"] is not None:
                    ax.axhspan(mine[0]["ci_low"], mine[0]["ci_high"], color=colors[method], alpha=0.12, linewidth=0)
        ax.set_title(f"{dataset}, T = {temperature:g}")
        ax.set_xlabel("mean tree size (drafted nodes per round)")
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=min(len(handles), 4), fontsize=8)
    _place_labels(fig, budget_labels)
    return fig


def _errors(rows: list[dict], y_key: str) -> list[list[float]]:
    """Error bar lengths below and above each row's value from its interval (0 where it has none)."""
    below = [r[y_key] - r["ci_low"] if r["ci_low"] is not None else 0.0 for r in rows]
    above = [r["ci_high"] - r[y_key] if r["ci_high"] is not None else 0.0 for r in rows]
    return [below, above]


def figure_accepted_lengths(records: list[dict], machine: str = "") -> Figure | None:
    """Histogram of tokens committed per round (accepted + 1), a panel per speculative method and a
    step line per (budget, temperature), each panel's axes fitted to its own counts (up to where 99% of
    every line's rounds lie). Non-drafting
    methods (ar, peers) have nothing to show: None when no method drafts."""
    speculative = [r for r in records if r["drafter"] is not None and r["accepted_per_round"]]
    methods = distinct(r["method"] for r in speculative)
    if not methods:
        return None
    fig, axes = _panels(len(methods), "tokens committed per round (accepted + 1)", machine)
    for ax, method in zip(axes, methods):
        committed: dict[tuple, list[int]] = {}
        for r in speculative:
            if r["method"] == method:
                committed.setdefault((r["budget"], r["temperature"]), []).extend(a + 1 for a in r["accepted_per_round"])
        most = max(max(counts) for counts in committed.values())
        bin_edges = np.arange(0.5, most + 1.5)  # one unit-wide bin per committed count, up to this panel's most
        tallest = 0.0
        for (budget, temperature), counts in committed.items():
            shares, _, _ = ax.hist(counts, bins=bin_edges, density=True, histtype="step", linewidth=1.5,
                                   label=f"b{budget} T{temperature:g}")
            tallest = max(tallest, float(np.max(shares)))
        # the axis ends where 99% of each line's rounds do: a long thin tail (rollout) would squash the rest
        shown = min(most, int(np.ceil(max(np.percentile(counts, 99) for counts in committed.values()))))
        ax.set_xlim(0.5, shown + 0.5)
        ax.set_ylim(0, 1.08 * tallest)
        ax.set_title(method)
        ax.set_xlabel("tokens committed in the round" + (f" (rounds of over {shown} off the axis)" if shown < most else ""))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("share of rounds")
        ax.legend(fontsize=8)
    return fig


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


def figure_stage_split(records: list[dict], machine: str = "") -> Figure | None:
    """Stacked bars: the share of wall time spent in each decoding stage, per method and budget
    (all prompts); bar labels slanted and right-aligned under their bars, so long names do not meet."""
    labels, stages, shares = stage_shares(records)
    if not labels:
        return None
    fig, (ax,) = _panels(1, "time per decoding stage (all prompts)", machine,
                         panel_width_in=max(5.0, 0.9 * len(labels) + 2))
    bottom = np.zeros(len(labels))
    for j, stage in enumerate(stages):
        ax.bar(range(len(labels)), shares[:, j], bottom=bottom, label=stage)
        bottom += shares[:, j]
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel("share of total seconds")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
    return fig


def plots(records: list[dict], rows: list[dict]) -> dict[str, tuple[str, Callable[[Path], bool]]]:
    """File name -> (caption, draw); each draw writes the file and says whether it had data. `rows`:
    `taps.summary.summarize(records)`, which the report has already computed for its tables."""
    machine = machine_label(records)
    return {
        "tau_vs_tree_size.png": ("tau against mean tree size", lambda p: _save(
            figure_against_tree_size(rows, "tau", "tau (tokens per round)", machine), p)),
        "speedup_vs_tree_size.png": ("speedup vs ar against mean tree size (95% intervals)", lambda p: _save(
            figure_against_tree_size(rows, "speedup_vs_ar", "speedup vs ar", machine, interval=True), p)),
        "accepted_length_hist.png": ("tokens committed per round",
                                     lambda p: _save(figure_accepted_lengths(records, machine), p)),
        "stage_split.png": ("time per decoding stage", lambda p: _save(figure_stage_split(records, machine), p)),
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
        # about 13 characters of 9-point text per inch of panel: long run names wrap, not collide
        ax.set_title(textwrap.fill(name, width=int(13 * PANEL_WIDTH_IN)), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 100k, not 100000
        ax.set_xlabel("training tokens")
        ax.set_ylabel("top-1 accuracy")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    FigureCanvasAgg(fig).print_png(str(path))
    return True
