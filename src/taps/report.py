"""Benchmark report: report.md's markdown tables, computed from raw `taps bench` records.

The full table is `taps.summary.summarize` of the records (the numbers `taps bench` prints);
the other tables compare methods on the same prompts with the same paired definitions. The
figures are drawn by taps.report_plots, loaded only then. This module and what it imports need
no torch: a report is made where no model runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from taps.cpuload import BUSY
from taps.files import make_folder
from taps.records import LLAMA_CPP_PEERS, group_label, is_peer, portable_name
from taps.summary import (
    distinct,
    interval_text,
    is_level,
    machine_label,
    median_speed_ratio,
    paired,
    ratio_interval,
    summarize,
)

# (summary key, header, format); "s" columns are text, the others right-aligned numbers
COLUMNS = (
    ("dataset", "dataset", "s"),
    ("temperature", "T", ".1f"),
    ("method", "method", "s"),
    ("budget", "budget", "d"),
    ("prompts", "prompts", "d"),
    ("tau", "tau", ".2f"),
    ("tokens_per_second", "tokens/s", ".2f"),
    ("speedup_vs_ar", "speedup vs ar", ".2f"),
    ("ci", "95% CI", "interval"),
    ("mean_tree_size", "mean tree size", ".1f"),
    ("match_rate_vs_ar", "match rate vs ar", ".2f"),
)

HEAD_TO_HEAD_COLUMNS = (
    ("dataset", "dataset", "s"),
    ("temperature", "T", ".1f"),
    ("method", "method", "s"),
    ("budget", "budget", "d"),
    ("rival", "rival", "s"),
    ("rival_budget", "rival budget", "d"),
    ("prompts", "prompts", "d"),
    ("speedup_vs_rival", "speedup vs rival", ".2f"),
    ("ci", "95% CI", "interval"),
    ("verdict", "verdict", "s"),
)

DEFINITIONS = """\
- tau: tokens committed per target forward (sum of new tokens / sum of rounds); `-` for peers, which do not expose rounds.
- tokens/s: median over prompts of new tokens / wall seconds (all turns).
- speedup vs ar: median over prompts of tokens/s divided by ar's tokens/s on the same prompt and temperature.
- 95% CI: percentile bootstrap interval of that median, prompts resampled with their own ar run (2,000 resamples);
  "level" where it contains 1.
- mean tree size: drafted nodes verified per round (0 for ar; `-` for peers).
- match rate vs ar: share of prompts whose generated tokens equal ar's."""


def markdown_table(rows: list[dict], columns: tuple = COLUMNS) -> str:
    """A markdown table of `summarize` rows (or others, given their columns); `-` where a
    value does not apply."""

    def cell(row: dict, key: str, fmt: str) -> str:
        if fmt == "interval":
            return interval_text(row["ci_low"], row["ci_high"])
        return "-" if row[key] is None else format(row[key], fmt)

    header = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---" if fmt == "s" else "---:" for _, _, fmt in columns) + "|"
    body = ["| " + " | ".join(cell(row, key, fmt) for key, _, fmt in columns) + " |" for row in rows]
    return "\n".join([header, rule, *body])


def complete_only(records: list[dict]) -> list[dict]:
    """The records of prompts that every (method, budget) of their set and temperature has finished,
    so that each row of a report in progress covers the same prompts."""
    entries: dict[tuple, set] = {}  # (dataset label, T) -> {(method, budget)}
    done: dict[tuple, set] = {}  # (dataset, prompt, T) -> {(method, budget)}
    for r in records:
        entries.setdefault((group_label(r), r["temperature"]), set()).add((r["method"], r["budget"]))
        done.setdefault((r["dataset"], r["prompt_id"], r["temperature"]), set()).add((r["method"], r["budget"]))
    return [r for r in records
            if done[r["dataset"], r["prompt_id"], r["temperature"]] == entries[group_label(r), r["temperature"]]]


def verdict(ratio: float | None, low: float | None, high: float | None) -> str | None:
    """"faster", "slower" or "level" (the interval contains 1); None without a ratio or interval."""
    if ratio is None or low is None:
        return None
    return "level" if is_level(low, high) else ("faster" if low > 1 else "slower")


def runs_by_key(records: list[dict]) -> dict[tuple, list[dict]]:
    """(dataset label, T, method, budget) -> its records: the runs paired prompt by prompt."""
    runs: dict[tuple, list[dict]] = {}
    for r in records:
        runs.setdefault((group_label(r), r["temperature"], r["method"], r["budget"]), []).append(r)
    return runs


def head_to_head(records: list[dict], summary: list[dict], method: str = "taps",
                 tree_rival: str = "ddtree") -> list[dict]:
    """`method` against what a user would pick instead, per (dataset, temperature) and budget of
    `method`: every peer present (hf-assisted, prompt-lookup) and the `tree_rival` budget with the
    best median speedup over ar there. The ratio is the median over prompts of `method`'s tokens/s
    over the rival's on the same prompt (paired, like speedup vs ar); above 1, `method` is faster.
    `summary` is `summarize(records)`, passed in so that a report bootstraps its intervals once."""
    runs = runs_by_key(records)
    peers = {r["method"] for r in records if is_peer(r)}
    rows = []
    for own in (x for x in summary if x["method"] == method):
        group = [x for x in summary if (x["dataset"], x["temperature"]) == (own["dataset"], own["temperature"])]
        trees = [x for x in group if x["method"] == tree_rival and x["speedup_vs_ar"] is not None]
        rivals = [x for x in group if x["method"] in peers]
        if trees:
            rivals.append(max(trees, key=lambda x: x["speedup_vs_ar"]))
        mine = runs[own["dataset"], own["temperature"], method, own["budget"]]
        for rival in rivals:
            pairs = paired(mine, runs[rival["dataset"], rival["temperature"], rival["method"], rival["budget"]])
            ratio, (low, high) = median_speed_ratio(pairs), ratio_interval(pairs)
            rows.append({
                "dataset": own["dataset"], "temperature": own["temperature"], "method": method, "budget": own["budget"],
                "rival": rival["method"], "rival_budget": rival["budget"], "prompts": len(pairs),
                "speedup_vs_rival": ratio, "ci_low": low, "ci_high": high, "verdict": verdict(ratio, low, high),
            })  # fmt: skip
    return rows


SAME_SIZE_COLUMNS = (
    ("dataset", "dataset", "s"),
    ("temperature", "T", ".1f"),
    ("method", "method", "s"),
    ("budget", "budget", "d"),
    ("mean_tree_size", "mean tree size", ".1f"),
    ("tau", "tau", ".2f"),
    ("reference_tau", "ddtree tau at that size", ".2f"),
    ("tau_ratio", "tau / ddtree's", ".3f"),
)


def tau_at_size(points: list[tuple[float, float]], size: float) -> float | None:
    """tau of a reference curve at `size`, from (mean tree size, tau) points: linear in log size
    between the two measured points around it; None outside the measured range (tau against size is
    concave, so extrapolating, or reaching down to tau(0) = 1, would misstate the reference)."""
    points = sorted(points)
    for (s0, t0), (s1, t1) in zip(points, points[1:]):
        if s0 <= size <= s1 and s0 > 0:
            w = 0.0 if s1 == s0 else math.log(size / s0) / math.log(s1 / s0)
            return t0 + w * (t1 - t0)
    return next((t for s, t in points if s == size), None)  # a single point, matched exactly


def same_size_tau(summary: list[dict], reference: str = "ddtree") -> list[dict]:
    """Every other drafting method's tau against the `reference` policy's tau at the same mean tree
    size, per (dataset, temperature): issue 4's "taps against ddtree at the same size" (the paper
    reports +14% for TAPS), read off the reference's measured budgets by `tau_at_size`; from the
    `summarize` rows of the records."""
    measured = [x for x in summary if x["tau"] is not None and x["mean_tree_size"]]
    rows = []
    for x in measured:
        if x["method"] == reference:
            continue
        curve = [(y["mean_tree_size"], y["tau"]) for y in measured
                 if y["method"] == reference and (y["dataset"], y["temperature"]) == (x["dataset"], x["temperature"])]
        ref = tau_at_size(curve, x["mean_tree_size"])
        rows.append({
            "dataset": x["dataset"], "temperature": x["temperature"], "method": x["method"], "budget": x["budget"],
            "mean_tree_size": x["mean_tree_size"], "tau": x["tau"], "reference_tau": ref,
            "tau_ratio": None if ref is None else x["tau"] / ref,
        })  # fmt: skip
    return rows


def environment_lines(records: list[dict]) -> list[str]:
    """Models and machine, one line per distinct environment (a resumed run may add another); models
    and scorers by `portable_name`, so older records that hold absolute paths report alike."""
    targets = ", ".join(map(str, distinct(portable_name(r["target"]) for r in records)))
    drafters = ", ".join(map(str, distinct(portable_name(r["drafter"]) for r in records if r["drafter"] is not None))) or "-"
    envs = distinct({**env, "scorer": portable_name(env["scorer"])} if env.get("scorer") else env
                    for env in (r.get("env") or {} for r in records))
    lines = [f"Models: target {targets}; drafter {drafters}."]
    lines += ["Environment: " + (", ".join(f"{k} {v}" for k, v in env.items()) or "not recorded") + "." for env in envs]
    return lines


def load_lines(records: list[dict]) -> list[str]:
    """How quiet the machine was: the share of the CPU other processes used during the runs
    (taps.cpuload), and a warning naming how many runs shared it past BUSY, whose times are not
    their methods'; a blank line after. Nothing for records made before it was measured."""
    shares = sorted(r["others_cpu"] for r in records if r.get("others_cpu") is not None)
    if not shares:
        return []
    lines = [f"Other processes' share of the CPU during a run: median {shares[len(shares) // 2]:.0%}, "
             f"most {shares[-1]:.0%} ({len(shares)} runs measured)."]
    busy = [s for s in shares if s > BUSY]
    if busy:
        lines += ["", f"**{len(busy)} of {len(shares)} runs shared the machine** (other processes used more than "
                      f"{BUSY:.0%} of its CPU): their times are not their methods'. On a quiet machine, "
                      "`taps bench --redo-busy` runs them again."]
    return [*lines, ""]


ROUND_COST_COLUMNS = (
    ("dataset", "dataset", "s"),
    ("temperature", "T", ".1f"),
    ("method", "method", "s"),
    ("budget", "budget", "d"),
    ("rounds", "rounds", "d"),
    ("draft_ms", "draft ms/round", ".1f"),
    ("verify_ms", "verify ms/round", ".1f"),
    ("draft_vs_forward", "draft / ar round", ".2f"),
    ("verify_vs_forward", "verify / ar round", ".2f"),
)


def round_costs(records: list[dict], summary: list[dict]) -> list[dict]:
    """Per (dataset, temperature, method, budget): drafting and verification seconds per round
    (stage seconds summed over prompts, over their rounds summed; prefill is a stage of its own),
    and each as a fraction of one `ar` round of the same set and temperature, i.e. one target
    forward over one token: the cost side of a speedup, which is tau over the round's cost in ar
    rounds. Records without rounds or stage times (peers) are left out; rows in the order of `summary`
    (`summarize(records)`)."""
    sums: dict[tuple, list] = {}  # (dataset label, T, method, budget) -> [draft s, verify s, rounds]
    for r in records:
        if r["rounds"] and r["stage_seconds"]:
            s = sums.setdefault((group_label(r), r["temperature"], r["method"], r["budget"]), [0.0, 0.0, 0])
            s[0] += r["stage_seconds"].get("draft", 0.0)
            s[1] += r["stage_seconds"].get("verify", 0.0)
            s[2] += sum(r["rounds"])
    rows = []
    for x in summary:
        key = (x["dataset"], x["temperature"], x["method"], x["budget"])
        if key not in sums or not sums[key][2]:
            continue
        draft, verify, rounds = sums[key]
        ar = sums.get((x["dataset"], x["temperature"], "ar", None))
        forward = ar[1] / ar[2] if ar and ar[2] and ar[1] > 0 else None  # seconds of one ar round
        rows.append({
            "dataset": x["dataset"], "temperature": x["temperature"], "method": x["method"], "budget": x["budget"],
            "rounds": rounds, "draft_ms": 1e3 * draft / rounds, "verify_ms": 1e3 * verify / rounds,
            "draft_vs_forward": None if forward is None else draft / rounds / forward,
            "verify_vs_forward": None if forward is None else verify / rounds / forward,
        })  # fmt: skip
    return rows


def round_cost_section(records: list[dict], summary: list[dict]) -> list[str]:
    """The report's lines on what a round costs; none without timed rounds."""
    rows = round_costs(records, summary)
    if not rows:
        return []
    return [
        "## Cost per round",
        "",
        markdown_table(rows, ROUND_COST_COLUMNS),
        "",
        "- draft / verify ms per round: the stage's seconds over all prompts divided by their rounds; "
        "/ ar round: as a fraction of one plain decoding round (one target forward over one token) on the same set.",
        "",
    ]


MIN_PROMPTS = 30  # a headline cell over fewer prompts is marked FEW: its median and interval rest on little
FEW = "†"


def _few(prompts: int) -> str:
    """What a headline cell over `prompts` prompts adds: FEW below MIN_PROMPTS."""
    return f" {FEW}" if prompts < MIN_PROMPTS else ""


def _label(method: str, budget: int | None) -> str:
    return method if budget is None else f"{method}:{budget}"


def _matrix(row_keys: list, columns: list[tuple], cell: Callable[[tuple, tuple], str | None], first: str) -> str:
    """A markdown table with a row per key (labelled by its first element) and a column per
    (dataset label, temperature); `-` where `cell` has nothing."""
    header = [first, *(f"{dataset.split('/')[-1]} T={t:g}" for dataset, t in columns)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(columns)]
    for key in row_keys:
        lines.append("| " + " | ".join([key[0], *(cell(key, c) or "-" for c in columns)]) + " |")
    return "\n".join(lines)


def headline_cell(x: dict, level: str = " level", tau: bool = True) -> str | None:
    """A `summarize` row as a headline cell: ar's tokens/s, any other method's speedup vs ar with
    `level` where its interval contains 1 and (if `tau`) tau in brackets; FEW under MIN_PROMPTS
    prompts; None without a speed."""
    if x["tokens_per_second"] is None or (x["method"] != "ar" and x["speedup_vs_ar"] is None):
        return None
    if x["method"] == "ar":
        return f"{x['tokens_per_second']:.2f}{_few(x['prompts'])}"
    mark = level if is_level(x["ci_low"], x["ci_high"]) else ""
    brackets = f" ({x['tau']:.1f})" if tau and x["tau"] is not None else ""
    return f"{x['speedup_vs_ar']:.2f}x{mark}{brackets}{_few(x['prompts'])}"


def speedup_matrix(summary: list[dict]) -> str:
    """The headline in one table: a row per method and budget, a column per (dataset, temperature),
    each cell the speedup vs ar with tau in brackets; ar's row gives its tokens/s. From the
    `summarize` rows of the records."""
    cells = {(x["method"], x["budget"], x["dataset"], x["temperature"]): x for x in summary}

    def cell(key, column):
        x = cells.get((key[1], key[2], *column))
        return None if x is None else headline_cell(x)

    keys = [("ar (tokens/s)" if m == "ar" else _label(m, b), m, b) for m, b in distinct((x["method"], x["budget"]) for x in summary)]
    return _matrix(keys, distinct((x["dataset"], x["temperature"]) for x in summary), cell, "method")


def taps_rival_rows(records: list[dict], summary: list[dict]) -> list[dict]:
    """`head_to_head` rows of taps and each of its variants present (taps+rollout, the ablations, ...;
    files written before methods took options name them taps-rollout, taps-fixed, ...)."""
    present = dict.fromkeys(r["method"] for r in records)  # first-seen order: the --methods order
    return [row for m in present if m == "taps" or m.startswith(("taps+", "taps-"))
            for row in head_to_head(records, summary, m)]


def rival_matrix(rows: list[dict]) -> str:
    """`taps_rival_rows` as one table: a row per (taps method, rival), a column per (dataset,
    temperature), each cell the paired speedup over the rival (the ddtree rival's budget in brackets)."""
    cells = {(r["method"], r["budget"], r["rival"], r["dataset"], r["temperature"]): r for r in rows}

    def cell(key, column):
        r = cells.get((*key[1:], *column))
        if r is None or r["speedup_vs_rival"] is None:
            return None
        level = " level" if r["verdict"] == "level" else ""
        rival_budget = "" if r["rival_budget"] is None else f" (:{r['rival_budget']})"
        return f"{r['speedup_vs_rival']:.2f}x{level}{rival_budget}{_few(r['prompts'])}"

    keys = [(f"{_label(m, b)} / {rival}", m, b, rival) for m, b, rival in distinct((r["method"], r["budget"], r["rival"]) for r in rows)]
    return _matrix(keys, distinct((r["dataset"], r["temperature"]) for r in rows), cell, "against")


def matrix_section(summary: list[dict], rival_rows: list[dict]) -> list[str]:
    """The report's headline: `speedup_matrix`, then `rival_matrix` of `taps_rival_rows`
    when taps met a rival, and the footnote to cells over fewer than MIN_PROMPTS prompts if any."""
    matrix = speedup_matrix(summary)
    lines = ["## Speedup over ar at a glance", "", matrix, "",
             "- cells: speedup vs ar (tau in brackets), \"level\" where its 95% interval contains 1; the full table "
             "below has every number and interval."]
    if rival_rows:
        rivals = rival_matrix(rival_rows)
        lines += ["", "Paired median ratio of tokens/s on the same prompts (ddtree: its best budget on that set):", "",
                  rivals]
        matrix += rivals
    if FEW in matrix:
        lines += ["", f"{FEW} fewer than {MIN_PROMPTS} prompts."]
    return [*lines, ""]


def head_to_head_section(rows: list[dict]) -> list[str]:
    """The report's lines comparing taps and each of its variants present (taps+rollout, the
    ablations, ...) with their rivals, from `taps_rival_rows`; none when there are no such rows."""
    if not rows:
        return []
    return [
        "## taps against what a user would pick instead",
        "",
        markdown_table(rows, HEAD_TO_HEAD_COLUMNS),
        "",
        "- speedup vs rival: median over prompts of the method's tokens/s divided by the rival's on the same prompt "
        "and temperature; the ddtree rival is its budget with the best median speedup vs ar on that set.",
        "- 95% CI: percentile bootstrap interval of that median, prompts resampled in pairs; verdict: faster or "
        "slower when the interval lies above or below 1, level when it contains 1.",
        "",
    ]


def same_size_section(summary: list[dict]) -> list[str]:
    """The report's lines comparing each method's tau with ddtree's at the same mean tree size;
    none unless ddtree ran at two or more budgets somewhere."""
    rows = [x for x in same_size_tau(summary) if x["reference_tau"] is not None]
    if not rows:
        return []
    return [
        "## tau against ddtree at the same mean tree size",
        "",
        markdown_table(rows, SAME_SIZE_COLUMNS),
        "",
        "- ddtree tau at that size: ddtree's tau interpolated between its two measured budgets around the "
        "method's mean tree size, linearly in log size; methods outside ddtree's measured sizes are left out.",
        "",
    ]


LLAMA_CPP_COLUMNS = (
    ("dataset", "dataset", "s"),
    ("temperature", "T", ".1f"),
    ("method", "method", "s"),
    ("prompts", "prompts", "d"),
    ("tokens_per_second", "tokens/s", ".2f"),
    ("ar_tokens_per_second", "taps ar tokens/s", ".2f"),
    ("fastest", "taps' fastest", "s"),
    ("fastest_vs_peer", "its tokens/s / this", ".2f"),
    ("ci_low", "95% CI low", ".2f"),
    ("ci_high", "95% CI high", ".2f"),
)


def llama_cpp_section(records: list[dict], summary: list[dict]) -> list[str]:
    """The report's lines on the llama.cpp peers (records.LLAMA_CPP_PEERS): their median tokens/s
    beside taps' ar on the same set and temperature, and no ratio: they decode the GGUF's own 4-bit
    model, so their speed is not a lossless speedup of the target. None without such records.
    `summary`: `summarize(records)`."""
    runs = runs_by_key(records)
    ar = {(x["dataset"], x["temperature"]): x["tokens_per_second"] for x in summary if x["method"] == "ar"}
    rows = []
    for x in (x for x in summary if x["method"] in LLAMA_CPP_PEERS):
        group = (x["dataset"], x["temperature"])
        own = [y for y in summary if (y["dataset"], y["temperature"]) == group and y["method"] != "ar"
               and y["tau"] is not None and y["speedup_vs_ar"] is not None]  # peers expose no tau
        row = {**x, "ar_tokens_per_second": ar.get(group), "fastest": None, "fastest_vs_peer": None,
               "ci_low": None, "ci_high": None}
        if own:  # taps' fastest method on this set, paired prompt by prompt with the peer's runs
            best = max(own, key=lambda y: y["speedup_vs_ar"])
            pairs = paired(runs[(*group, best["method"], best["budget"])], runs[(*group, x["method"], None)])
            low, high = ratio_interval(pairs)
            row.update(fastest=_label(best["method"], best["budget"]), fastest_vs_peer=median_speed_ratio(pairs),
                       ci_low=low, ci_high=high)
        rows.append(row)
    if not rows:
        return []
    return [
        "## llama.cpp (its own 4-bit model)",
        "",
        markdown_table(rows, LLAMA_CPP_COLUMNS),
        "",
        "- llama.cpp decodes the packaged GGUF file's 4-bit weights, another model than the target taps "
        "decodes, so its outputs are not taps' and its speed is no lossless speedup: median tokens/s over "
        "prompts, with taps' plain decoding (ar) of the target on the same prompts for scale. llama-cpp-lookup "
        "drafts by its prompt lookup, llama-cpp-draft with the --assistant's GGUF file.",
        "- taps' fastest: its method with the best median speedup over ar on that set; its tokens/s / this: the "
        "median over prompts of its tokens/s over the peer's on the same prompt, with the 95% bootstrap interval "
        "(prompts resampled in pairs): what a user choosing between the two on this CPU gets.",
        "",
    ]


def write_report(records: Iterable[dict], out_dir: Path | str) -> Path:
    """Write out_dir/report.md (summary table, environment, links to the plots) and the PNG plots
    beside it; returns the report's path."""
    records = list(records)
    if not records:
        raise ValueError("no benchmark records to report")
    # every comparison of the target's decodings leaves llama.cpp's other model out (its own section)
    own = [r for r in records if r["method"] not in LLAMA_CPP_PEERS]
    from taps.report_plots import plots  # the plotting stack loads only here

    out_dir = make_folder(out_dir, f"the report to {out_dir}", "choose another --out")

    # bootstrap intervals for every row, computed once for every table and plot; a row depends only on
    # its own records and ar's, so the rows of `own` are those of all records less the llama.cpp rows
    summary = summarize(records)
    own_summary = [x for x in summary if x["method"] not in LLAMA_CPP_PEERS]
    figures = []
    for name, (caption, draw) in plots(own, own_summary).items():
        path = out_dir / name
        path.unlink(missing_ok=True)  # a plot with no data now must not leave an older one behind
        if draw(path):
            figures += [f"![{caption}]({name})", ""]  # a blank line each: one image per paragraph
    rival_rows = taps_rival_rows(own, own_summary)
    lines = [
        "# taps benchmark report",
        "",
        f"Machine: {machine_label(records)}. {len(records)} records.",
        "",
        *environment_lines(records),
        "",
        *load_lines(records),
        *matrix_section(own_summary, rival_rows),
        "## Every method, dataset and temperature",
        "",
        markdown_table(own_summary),
        "",
        DEFINITIONS,
        "",
        *head_to_head_section(rival_rows),
        *llama_cpp_section(records, summary),
        *same_size_section(own_summary),
        *round_cost_section(own, own_summary),
        "## Plots",
        "",
        *(figures or ["No plottable data.", ""]),
    ]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report
