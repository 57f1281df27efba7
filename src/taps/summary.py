"""Summaries of benchmark records: the numbers `taps bench` prints and `taps report` tabulates,
and Spec-Bench's answer files. Always recomputed from the raw records (taps.records), never
stored, so a record edited or added shows in every number. No torch.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Iterable
from pathlib import Path

from taps.records import group_label, tokens_per_second


def _prompt_key(rec: dict) -> tuple:
    return rec["dataset"], rec["prompt_id"], rec["temperature"]


def paired(records: Iterable[dict], baseline: Iterable[dict]) -> list[tuple[dict, dict]]:
    """(record, the baseline's record of the same prompt and temperature) for every record that
    has one and both have a speed (the baseline's above 0): the pairs every speedup is a median
    of, so that each prompt is compared with itself."""
    base = {_prompt_key(b): b for b in baseline}
    pairs = [(r, base.get(_prompt_key(r))) for r in records]
    return [(r, b) for r, b in pairs if b is not None and tokens_per_second(b) and tokens_per_second(r) is not None]


def median_speed_ratio(pairs: list[tuple[dict, dict]]) -> float | None:
    """Median over pairs of the record's tokens/s over its baseline's (None without pairs)."""
    return statistics.median(tokens_per_second(r) / tokens_per_second(b) for r, b in pairs) if pairs else None


def ratio_interval(pairs: list[tuple[dict, dict]], level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of `median_speed_ratio`: the prompts are resampled with
    replacement, each with its own baseline run (paired), and the median ratio of each resample
    is taken; the interval spans the middle `level` of those medians. (None, None) below two
    pairs. Seeded, so a report is reproducible; tests/test_summary.py checks its coverage."""
    if len(pairs) < 2:
        return None, None
    ratios = [tokens_per_second(r) / tokens_per_second(b) for r, b in pairs]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    tail = round((1 - level) / 2 * resamples)
    return medians[tail], medians[resamples - 1 - tail]


def is_level(low: float | None, high: float | None) -> bool:
    """Whether an interval of a ratio contains 1: neither side is shown faster."""
    return low is not None and high is not None and low <= 1 <= high


def summarize(records: Iterable[dict]) -> list[dict]:
    """Per (method, dataset, budget, temperature): tau, median tokens/s, median paired speedup
    over ar on the same prompts with its 95% bootstrap interval (`ci_low`, `ci_high`), mean verified
    tree size, and the share of outputs equal to ar's."""
    records = list(records)
    ar = [r for r in records if r["method"] == "ar"]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["method"], group_label(r), r["budget"], r["temperature"]), []).append(r)
    rows = []
    for (method, dataset, budget, temperature), recs in groups.items():
        tps = [v for v in map(tokens_per_second, recs) if v is not None]
        pairs = paired(recs, ar)
        rounds = [sum(r["rounds"]) for r in recs if r["rounds"] is not None]
        # tau needs every record's rounds (peers expose none), and some rounds (a 0-token run has none)
        tau = sum(r["new_tokens"] for r in recs) / sum(rounds) if len(rounds) == len(recs) and sum(rounds) else None
        sizes = [s for r in recs for s in r["tree_sizes"]]
        low, high = ratio_interval(pairs) if method != "ar" else (None, None)
        rows.append({
            "method": method, "dataset": dataset, "budget": budget, "temperature": temperature,
            "prompts": len(recs),
            "tau": tau,
            "tokens_per_second": statistics.median(tps) if tps else None,
            "speedup_vs_ar": median_speed_ratio(pairs),
            "ci_low": low,
            "ci_high": high,
            "mean_tree_size": sum(sizes) / len(sizes) if sizes else None,
            "match_rate_vs_ar": sum(r["token_ids"] == a["token_ids"] for r, a in pairs) / len(pairs) if pairs else None,
        })  # fmt: skip
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    rows.sort(key=lambda x: (x["dataset"], x["temperature"], order[x["method"]], x["budget"] or 0))
    return rows


def machine_label(records: Iterable[dict]) -> str:
    """The machine the records ran on, for titles: CPU (with its bfloat16 capability), threads, linear
    kernel, dtype and target precision; machines joined by " / " if a file holds several (it should not)."""
    labels = []
    for env in distinct(r.get("env") or {} for r in records):
        if not env:
            continue
        quant = env.get("target_quant", "none")
        labels.append(f"{env.get('cpu', '?')}, {env.get('threads', '?')} threads, {env.get('linear', '?')}, "
                      f"{env.get('dtype', '?')}" + ("" if quant == "none" else f", target {quant}"))
    # environments that differ elsewhere (a scorer path, a seed) name the same machine once
    return " / ".join(distinct(labels)) or "machine not recorded"


def distinct(values: Iterable) -> list:
    """The values in order of first appearance, each once (dicts too: no hashing)."""
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def format_table(rows: list[dict]) -> str:
    """`summarize` rows as a fixed-width text table (what `taps bench` prints)."""

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = (f"{'dataset':26s} {'T':>4s} {'method':14s} {'budget':>6s} {'n':>3s} {'tau':>6s} {'tok/s':>7s} {'speedup':>8s} "
            f"{'95% CI':>11s} {'tree':>6s} {'=ar':>5s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['dataset']:26s} {r['temperature']:4.1f} {r['method']:14s} {f(r['budget'], 'd'):>6s} {r['prompts']:3d} "
            f"{f(r['tau'], '.2f'):>6s} {f(r['tokens_per_second'], '.2f'):>7s} {f(r['speedup_vs_ar'], '.2f'):>8s} "
            f"{interval_text(r['ci_low'], r['ci_high']):>11s} {f(r['mean_tree_size'], '.1f'):>6s} {f(r['match_rate_vs_ar'], '.2f'):>5s}"
        )
    return "\n".join(lines)


def ratio_text(pairs: list[tuple[dict, dict]]) -> str:
    """The median paired tokens/s ratio with its 95% bootstrap interval, `1.040 [1.027-1.058]`."""
    low, high = ratio_interval(pairs)
    return f"{median_speed_ratio(pairs):.3f} [{low:.3f}-{high:.3f}]"


def interval_text(low: float | None, high: float | None) -> str:
    """An interval as `low-high`, `-` when there is none."""
    return "-" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _question_order(rec: dict) -> tuple:
    # Spec-Bench's ids are integers; every other set's are strings ("HumanEval/3")
    pid = str(rec["prompt_id"])
    return (0, int(pid), "") if pid.isdigit() else (1, 0, pid)


def write_spec_bench_answers(records: Iterable[dict], folder: Path) -> list[Path]:
    """Answer files in Spec-Bench's format, `folder/<dataset>/<method>[-b<budget>]-t<T>.jsonl`, so
    its evaluation/speed.py and equal.py run on our output. One folder per dataset because speed.py
    selects rows by category (HumanEval's "coding" would count as MT-Bench's), and rows sorted by
    question because equal.py compares two files line by line."""
    files: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(records, key=_question_order):
        model_id = f"{r['method']}" + (f"-b{r['budget']}" if r["budget"] else "") + f"-t{r['temperature']}"
        files.setdefault((r["dataset"], model_id), []).append({
            "question_id": int(r["prompt_id"]) if str(r["prompt_id"]).isdigit() else r["prompt_id"],
            "category": r["category"],
            "answer_id": f"{model_id}-{r['prompt_id']}",
            "model_id": model_id,
            "choices": [{
                "index": 0,
                "turns": r["texts"],
                "new_tokens": [len(t) for t in r["token_ids"]],
                "wall_time": r["seconds"],
                "decoding_steps": [len(t) for t in r["token_ids"]] if r["rounds"] is None else r["rounds"],
                "accept_lengths": [a + 1 for a in r["accepted_per_round"]],
            }],
        })  # fmt: skip
    paths = []
    for (dataset, model_id), rows in files.items():
        path = folder / dataset / f"{model_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths.append(path)
    return paths
