"""The benchmark report: table numbers recomputed by hand from raw records, plots written as PNG,
and `taps report` in a process that cannot import torch."""

import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import taps
from taps.records import RecordFile
from taps.report import (
    complete_only,
    head_to_head,
    markdown_table,
    rival_matrix,
    round_costs,
    same_size_tau,
    speedup_matrix,
    taps_rival_rows,
    tau_at_size,
    write_report,
)
from taps.report_plots import (
    figure_accepted_lengths,
    figure_against_tree_size,
    plot_learning_curves,
    stage_shares,
)
from taps.summary import summarize

ENV = {"cpu": "x86_64", "cpu_count": 2, "threads": 2, "torch": "2.13.0", "transformers": "5.19.0",
       "dtype": "bfloat16", "seed": 0}  # fmt: skip
PLOTS = ("tau_vs_tree_size.png", "speedup_vs_tree_size.png", "accepted_length_hist.png", "stage_split.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_record(dataset, prompt_id, method, budget, temperature, turns, *, accepted=None, seconds_per_round=0.01,
                prefill_s=0.02, category="coding", drafter="oracle", env=ENV):  # fmt: skip
    """A record with bench's field names. `turns` are the token ids per turn; `accepted` the
    drafted tokens accepted each round, per turn (None: a peer, which exposes no rounds)."""
    peer = accepted is None
    rounds = None if peer else [len(a) for a in accepted]
    flat = [] if peer else [a for turn in accepted for a in turn]
    # a peer's wall time grows with its tokens, a policy's with its rounds
    steps_per_turn = [len(t) for t in turns] if peer else rounds
    seconds = [prefill_s + seconds_per_round * n for n in steps_per_turn]
    loop_s = seconds_per_round * sum(steps_per_turn)
    stages = {} if peer else {  # 5% of the loop stays outside the stages ("other")
        "draft": 0.3 * loop_s, "select": 0.1 * loop_s, "verify": 0.5 * loop_s, "commit": 0.05 * loop_s,
        "prefill": prefill_s * len(turns),
    }  # fmt: skip
    return {
        "dataset": dataset, "prompt_id": prompt_id, "category": category, "method": method, "budget": budget,
        "temperature": temperature, "target": "smollm2-135m", "drafter": None if peer or budget is None else drafter,
        "token_ids": turns, "texts": [" ".join(map(str, t)) for t in turns], "seconds": seconds, "rounds": rounds,
        "accepted_per_round": flat, "tree_sizes": [] if peer else [budget or 0] * len(flat), "stage_seconds": stages,
        "new_tokens": sum(len(t) for t in turns), "total_seconds": sum(seconds), "peak_rss_mb": 512.0, "env": env,
    }  # fmt: skip


def split_accepted(n_tokens, budget, rng):
    """Accepted counts per round that commit exactly n_tokens (each round commits accepted + 1)."""
    accepted = []
    while n_tokens:
        a = min(rng.randint(0, budget), n_tokens - 1)
        accepted.append(a)
        n_tokens -= a + 1
    return accepted


SPECULATIVE = (("chain", 4), ("chain", 16), ("ddtree", 16))


def synthetic_records(seed=0):
    """ar, two speculative methods over two budgets and a peer, on two datasets (spec-bench has two
    turns and categories) at two temperatures; sampled runs sometimes differ from ar's output."""
    rng = random.Random(seed)
    prompts = [("humaneval", f"HumanEval/{i}", "coding", 1) for i in range(3)]
    prompts += [("spec-bench", str(81 + i), cat, 2) for i, cat in enumerate(("writing", "writing", "math"))]
    records = []
    for dataset, pid, category, n_turns in prompts:
        for temperature in (0.0, 1.0):
            ar_turns = [[rng.randrange(1000) for _ in range(rng.randint(10, 30))] for _ in range(n_turns)]
            common = dict(category=category)
            records.append(make_record(dataset, pid, "ar", None, temperature, ar_turns,
                                       accepted=[[0] * len(t) for t in ar_turns], seconds_per_round=0.02, **common))
            for method, budget in SPECULATIVE:
                turns = [list(t) for t in ar_turns]
                if temperature > 0 and rng.random() < 0.5:
                    turns[-1][-1] += 1  # a different sample: same length, different tokens
                accepted = [split_accepted(len(t), budget, rng) for t in turns]
                records.append(make_record(dataset, pid, method, budget, temperature, turns, accepted=accepted,
                                           seconds_per_round=0.02 + 0.002 * budget * rng.random(), **common))
            peer_s = 0.01 + 0.01 * rng.random()
            records.append(make_record(dataset, pid, "hf-assisted", None, temperature, ar_turns,
                                       seconds_per_round=peer_s, **common))
    return records


def parse_table(markdown):
    """The full summary table's rows as dicts keyed by header (cells kept as the text written)."""
    after = markdown.split("## Every method")[-1].splitlines()
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    lines = list(itertools.takewhile(lambda line: line.startswith("|"), after[start:]))
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def by_hand(records):
    """Every table number recomputed from the raw records, keyed like the table rows."""
    ar = {(r["dataset"], r["prompt_id"], r["temperature"]): r for r in records if r["method"] == "ar"}
    groups = {}
    for r in records:
        label = f"spec-bench/{r['category']}" if r["dataset"] == "spec-bench" else r["dataset"]
        groups.setdefault((label, f"{r['temperature']:.1f}", r["method"], r["budget"]), []).append(r)
    expected = {}
    for (label, t, method, budget), recs in groups.items():
        peer = recs[0]["rounds"] is None
        speedups, matches = [], []
        for r in recs:
            a = ar[(r["dataset"], r["prompt_id"], r["temperature"])]
            speedups.append((r["new_tokens"] / r["total_seconds"]) / (a["new_tokens"] / a["total_seconds"]))
            matches.append(r["token_ids"] == a["token_ids"])
        sizes = [s for r in recs for s in r["tree_sizes"]]
        expected[(label, t, method, "-" if budget is None else str(budget))] = {
            "prompts": str(len(recs)),
            "tau": "-" if peer else f"{sum(r['new_tokens'] for r in recs) / sum(sum(r['rounds']) for r in recs):.2f}",
            "tokens/s": f"{statistics.median(r['new_tokens'] / r['total_seconds'] for r in recs):.2f}",
            "speedup vs ar": f"{statistics.median(speedups):.2f}",
            "mean tree size": "-" if not sizes else f"{sum(sizes) / len(sizes):.1f}",
            "match rate vs ar": f"{sum(matches) / len(matches):.2f}",
        }
    return expected


def test_markdown_table_formats_rows_and_missing_values():
    rows = [
        {"dataset": "humaneval", "temperature": 0.0, "method": "ar", "budget": None, "prompts": 3, "tau": 1.0,
         "tokens_per_second": 40.123, "speedup_vs_ar": 1.0, "ci_low": None, "ci_high": None, "mean_tree_size": 0.0,
         "match_rate_vs_ar": 1.0},
        {"dataset": "humaneval", "temperature": 0.0, "method": "hf-assisted", "budget": None, "prompts": 3,
         "tau": None, "tokens_per_second": 55.5, "speedup_vs_ar": 1.384, "ci_low": 1.2, "ci_high": 1.51,
         "mean_tree_size": None, "match_rate_vs_ar": 0.5},
    ]  # fmt: skip
    assert markdown_table(rows) == (
        "| dataset | T | method | budget | prompts | tau | tokens/s | speedup vs ar | 95% CI | mean tree size "
        "| match rate vs ar |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| humaneval | 0.0 | ar | - | 3 | 1.00 | 40.12 | 1.00 | - | 0.0 | 1.00 |\n"
        "| humaneval | 0.0 | hf-assisted | - | 3 | - | 55.50 | 1.38 | 1.20-1.51 | - | 0.50 |"
    )
    assert markdown_table([]).count("\n") == 1  # header and rule only


def test_report_table_equals_numbers_recomputed_from_raw_records(tmp_path):
    records = synthetic_records()
    text = write_report(records, tmp_path).read_text()
    table = parse_table(text)
    expected = by_hand(records)
    got = {(r["dataset"], r["T"], r["method"], r["budget"]): r for r in table}
    assert got.keys() == expected.keys()  # one row per (dataset/category, T, method, budget), no more
    for key, want in expected.items():
        assert {k: got[key][k] for k in want} == want, key
    for method in ("ar", "chain", "ddtree", "hf-assisted"):
        assert f"| {method} |" in text
    assert any(row["match rate vs ar"] != "1.00" for row in table)  # the data exercise the match rate
    assert "torch 2.13.0" in text and "target smollm2-135m" in text and "drafter oracle" in text


def test_plots_are_non_empty_pngs_linked_from_the_report(tmp_path):
    report = write_report(synthetic_records(), tmp_path / "out")
    assert report == tmp_path / "out" / "report.md"
    text = report.read_text()
    for name in PLOTS:
        data = (report.parent / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
        assert f"]({name})" in text  # relative link


def test_speedup_plot_has_a_panel_per_set_and_temperature_with_95_percent_error_bars():
    from matplotlib.container import ErrorbarContainer

    rows = summarize(synthetic_records())
    fig = figure_against_tree_size(rows, "speedup_vs_ar", "speedup vs ar", interval=True)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [  # Spec-Bench's categories are sets of their own, never pooled
        f"{dataset}, T = {t}" for dataset in ("humaneval", "spec-bench/math", "spec-bench/writing") for t in (0, 1)]
    for ax in axes:
        dataset, t = ax.get_title().split(", T = ")
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert [c.get_label() for c in bars] == ["ar", "chain", "ddtree"]  # ar: tree size 0, no interval
        for container in bars[1:]:
            mine = sorted((r for r in rows if (r["dataset"], r["temperature"], r["method"]) ==
                           (dataset, float(t), container.get_label())), key=lambda r: r["mean_tree_size"])
            ends = [y for segment in container.lines[2][0].get_segments() for y in sorted(y for _, y in segment)]
            # a set of one prompt (spec-bench/math) has no interval: its bar has no length
            expected = [(r["ci_low"], r["ci_high"]) if r["prompts"] > 1 else (r["speedup_vs_ar"],) * 2 for r in mine]
            assert ends == pytest.approx([y for pair in expected for y in pair])


def test_budget_labels_never_overlap():
    rows = summarize(synthetic_records())
    # chain:16 and ddtree:16 at the same point: their labels would start on top of each other
    same = {(r["dataset"], r["temperature"]): r["tau"] for r in rows if (r["method"], r["budget"]) == ("chain", 16)}
    rows = [{**r, "tau": same[r["dataset"], r["temperature"]]} if r["method"] == "ddtree" else r for r in rows]
    fig = figure_against_tree_size(rows, "tau", "tau")
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in (ax for ax in fig.axes if ax.get_visible()):
        assert sorted(text.get_text() for text in ax.texts) == ["b16", "b16", "b4"]  # every label placed
        boxes = [text.get_window_extent(renderer) for text in ax.texts]
        assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def test_histogram_axes_fit_each_methods_counts():
    records = synthetic_records()
    fig = figure_accepted_lengths(records)
    for ax in (ax for ax in fig.axes if ax.get_visible()):
        counts = {}
        for r in records:
            if r["method"] == ax.get_title():
                counts.setdefault((r["budget"], r["temperature"]), []).extend(a + 1 for a in r["accepted_per_round"])
        shown = max(math.ceil(np.percentile(c, 99)) for c in counts.values())
        assert ax.get_xlim() == (0.5, shown + 0.5)
        tallest = max(patch.get_path().vertices[:, 1].max() for patch in ax.patches)
        assert ax.get_ylim()[1] == pytest.approx(1.08 * tallest)


def test_ar_and_peers_alone_report_without_the_speculative_plots(tmp_path):
    records = [r for r in synthetic_records() if r["method"] in ("ar", "hf-assisted")]
    write_report(synthetic_records(), tmp_path)  # an earlier report in the same folder
    text = write_report(records, tmp_path).read_text()
    assert not (tmp_path / "accepted_length_hist.png").exists()  # stale plot removed, not linked
    assert "accepted_length_hist.png" not in text
    for name in ("tau_vs_tree_size.png", "speedup_vs_tree_size.png", "stage_split.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    peer_rows = [r for r in parse_table(text) if r["method"] == "hf-assisted"]
    assert peer_rows and all(r["tau"] == "-" and r["mean tree size"] == "-" for r in peer_rows)


def test_peers_only_still_write_a_table(tmp_path):
    records = [r for r in synthetic_records() if r["method"] == "hf-assisted"]
    text = write_report(records, tmp_path).read_text()
    assert len(parse_table(text)) == 6  # 3 dataset labels (spec-bench per category) x 2 temperatures
    assert not (tmp_path / "tau_vs_tree_size.png").exists() and not (tmp_path / "stage_split.png").exists()


def test_llama_cpp_peers_get_their_own_section_in_tokens_per_second(tmp_path):
    records = synthetic_records()
    llama = [{**r, "method": name, "token_ids": [[t + 1 for t in turn] for turn in r["token_ids"]]}
             for name in ("llama-cpp", "llama-cpp-draft") for r in records if r["method"] == "hf-assisted"]
    taps_ = [{**r, "method": "taps"} for r in records if (r["method"], r["budget"]) == ("chain", 16)]
    text = write_report(records + llama + taps_, tmp_path).read_text()
    # never as a ratio to ar: not in the headline, the full table or taps' rivals
    assert not any(r["method"].startswith("llama-cpp") for r in parse_table(text))
    assert "llama-cpp" not in text.split("## llama.cpp")[0]
    section = text.split("## llama.cpp (its own 4-bit model)")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| humaneval | 0.0 | llama-cpp |")]
    median = statistics.median(r["new_tokens"] / r["total_seconds"] for r in llama
                               if (r["method"], r["dataset"], r["temperature"]) == ("llama-cpp", "humaneval", 0.0))
    ar = statistics.median(r["new_tokens"] / r["total_seconds"] for r in records
                           if (r["method"], r["dataset"], r["temperature"]) == ("ar", "humaneval", 0.0))
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:6] == ["humaneval", "0.0", "llama-cpp", "3", f"{median:.2f}", f"{ar:.2f}"]
    assert "| humaneval | 0.0 | llama-cpp-draft |" in section
    # taps' fastest method there, paired prompt by prompt with the peer (synthetic_records' tokens/s)
    speeds = {}
    for r in records + llama + taps_:
        if r["dataset"] == "humaneval" and r["temperature"] == 0.0:
            speeds.setdefault((r["method"], r["budget"]), {})[r["prompt_id"]] = r["new_tokens"] / r["total_seconds"]
    ar_speed = speeds["ar", None]
    own = {k: v for k, v in speeds.items() if k[0] not in ("ar", "hf-assisted", "llama-cpp", "llama-cpp-draft")}
    best = max(own, key=lambda k: statistics.median(own[k][p] / ar_speed[p] for p in own[k]))
    ratio = statistics.median(own[best][p] / speeds["llama-cpp", None][p] for p in own[best])
    assert cells[6] == (best[0] if best[1] is None else f"{best[0]}:{best[1]}") and cells[7] == f"{ratio:.2f}"


def test_head_to_head_pairs_taps_with_each_peer_and_the_best_ddtree_budget(tmp_path):
    # per prompt i: ar 10 tok/s; ddtree:8 15 (the best ddtree), ddtree:32 12, hf-assisted 20 + i, taps 18 + 2i;
    # a fifth prompt only taps ran is not paired with anyone
    speeds = {"ar": lambda i: 10, ("ddtree", 8): lambda i: 15, ("ddtree", 32): lambda i: 12,
              "hf-assisted": lambda i: 20 + i, ("taps", 16): lambda i: 18 + 2 * i}  # fmt: skip
    records = []
    for i in range(5):
        for key, speed in speeds.items():
            method, budget = key if isinstance(key, tuple) else (key, None)
            if i == 4 and method != "taps":
                continue
            rec = make_record("humaneval", f"HumanEval/{i}", method, budget, 0.0, [[1] * 60],
                              accepted=None if method == "hf-assisted" else [[0] * 60])
            rec["total_seconds"] = 60 / speed(i)
            records.append(rec)
    rows = head_to_head(records, summarize(records))
    got = {(r["rival"], r["rival_budget"]): r for r in rows}
    assert got.keys() == {("hf-assisted", None), ("ddtree", 8)}  # ddtree:32 is not the best budget
    assert got["hf-assisted", None]["prompts"] == 4
    assert got["hf-assisted", None]["speedup_vs_rival"] == pytest.approx(statistics.median((18 + 2 * i) / (20 + i) for i in range(4)))
    assert got["ddtree", 8]["speedup_vs_rival"] == pytest.approx(statistics.median((18 + 2 * i) / 15 for i in range(4)))
    assert all(r["method"] == "taps" and r["budget"] == 16 and r["dataset"] == "humaneval" for r in rows)
    text = write_report(records, tmp_path).read_text()
    assert "| humaneval | 0.0 | taps | 16 | ddtree | 8 | 4 |" in text
    others = [r for r in records if r["method"] != "taps"]
    assert not head_to_head(others, summarize(others))
    # a taps variant in the file gets its own rows in the report; other methods do not
    variant = [{**r, "method": "taps+rollout"} for r in records if r["method"] == "taps"]
    chain = [{**r, "method": "chain+rollout"} for r in records if r["method"] == "taps"]
    text = write_report(records + variant + chain, tmp_path).read_text()
    assert "| humaneval | 0.0 | taps+rollout | 16 | hf-assisted | - | 4 |" in text
    assert "| chain+rollout | 16 | hf-assisted |" not in text


def test_tau_at_size_interpolates_in_log_size_and_never_extrapolates():
    curve = [(16.0, 3.0), (4.0, 2.0), (64.0, 3.5)]
    assert tau_at_size(curve, 8.0) == pytest.approx(2.5)  # halfway between 4 and 16 in log size
    assert tau_at_size(curve, 16.0) == 3.0
    assert tau_at_size(curve, 32.0) == pytest.approx(3.25)
    assert tau_at_size(curve, 3.0) is None and tau_at_size(curve, 65.0) is None
    assert tau_at_size([(7.0, 2.2)], 7.0) == 2.2 and tau_at_size([(7.0, 2.2)], 6.0) is None


def test_same_size_tau_reads_ddtree_at_each_methods_mean_tree_size(tmp_path):
    # one prompt of 60 tokens: ddtree:4 in 30 rounds (tau 2), ddtree:16 in 20 (tau 3), taps:32 with
    # trees of 8 nodes in 24 rounds (tau 2.5) and chain:2, smaller than any measured ddtree
    runs = {("ddtree", 4): 30, ("ddtree", 16): 20, ("taps", 8): 24, ("chain", 2): 40}
    records = [make_record("humaneval", "HumanEval/0", "ar", None, 0.0, [[1] * 60], accepted=[[0] * 60])]
    for (method, size), rounds in runs.items():
        records.append(make_record("humaneval", "HumanEval/0", method, size, 0.0, [[1] * 60], accepted=[[1] * rounds]))
    records[-2]["budget"] = 32  # taps' budget is a cap; its trees (tree_sizes) are what count
    rows = {r["method"]: r for r in same_size_tau(summarize(records))}
    assert rows.keys() == {"taps", "chain"}
    assert rows["taps"]["reference_tau"] == pytest.approx(2.5) and rows["taps"]["tau_ratio"] == pytest.approx(1.0)
    assert rows["chain"]["reference_tau"] is None
    text = write_report(records, tmp_path).read_text()
    assert "| humaneval | 0.0 | taps | 32 | 8.0 | 2.50 | 2.50 | 1.000 |" in text
    assert "| chain | 2 |" not in text.split("## tau against ddtree")[1].split("\n## ")[0]


def test_complete_only_drops_prompts_some_method_has_not_finished():
    records = synthetic_records()
    unfinished = [r for r in records if not (r["prompt_id"] == "HumanEval/1" and r["temperature"] == 1.0 and r["method"] == "ddtree")]
    kept = complete_only(unfinished)
    assert {(r["prompt_id"], r["temperature"]) for r in unfinished} - {(r["prompt_id"], r["temperature"]) for r in kept} == {("HumanEval/1", 1.0)}
    assert len(kept) == len(records) - 5  # that prompt's 5 runs at T=1 (ar, 3 speculative, hf-assisted): 4 left, all dropped
    assert complete_only(records) == records


def test_no_records_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        write_report([], tmp_path)


def test_stage_shares_are_stage_seconds_over_total_seconds():
    records = synthetic_records()
    labels, stages, shares = stage_shares(records)
    assert labels == ["ar", "chain b4", "chain b16", "ddtree b16"]  # peers have no stage times
    assert stages == ["draft", "select", "verify", "commit", "prefill", "other"]
    chain16 = [r for r in records if r["method"] == "chain" and r["budget"] == 16]
    total_s = sum(r["total_seconds"] for r in chain16)
    verify_s = sum(r["stage_seconds"]["verify"] for r in chain16)
    assert shares[2, 2] == pytest.approx(verify_s / total_s)
    assert shares.sum(axis=1) == pytest.approx([1.0] * 4)


def test_each_distinct_environment_gets_its_own_line(tmp_path):
    records = synthetic_records()
    records[-1] = {**records[-1], "env": {**ENV, "threads": 8}}  # a resumed run on another setting
    text = write_report(records, tmp_path).read_text()
    env_lines = [line for line in text.splitlines() if line.startswith("Environment:")]
    assert len(env_lines) == 2 and "threads 8" in env_lines[1]


def test_a_report_of_older_records_names_models_without_absolute_paths(tmp_path):
    snapshot = "/work/main/runs/bench-src-a164e01/src/taps/shipped/smollm2-135m"
    records = [{**r, "drafter": r["drafter"] and snapshot, "env": {**ENV, "scorer": snapshot + "/scorer"}}
               for r in synthetic_records()]
    text = write_report(records, tmp_path).read_text()
    assert "drafter taps/shipped/smollm2-135m." in text and "scorer taps/shipped/smollm2-135m/scorer" in text
    assert "/work/" not in text


def test_learning_curves_of_two_drafter_kinds(tmp_path):
    log = [{"step": s, "eval_slot_acc": [0.1 * s, 0.05 * s]} for s in range(4)] + [{"step": 4, "train_loss": 1.0}]
    path = tmp_path / "curve.png"
    assert plot_learning_curves({"dflash": (log, 200.0), "grown": (log[:2], 500.0)}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot_learning_curves({"x": ([{"step": 1, "train_loss": 2.0}], 200.0)}, tmp_path / "none.png")


def matrix_cells(markdown):
    """A matrix table's cells keyed by (row label, column header)."""
    lines = markdown.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = {}
    for line in lines[2:]:
        row = [c.strip() for c in line.strip("|").split("|")]
        cells.update({(row[0], h): c for h, c in zip(header[1:], row[1:])})
    return cells


def test_speedup_matrix_holds_the_summary_numbers_and_rivals_the_head_to_head_rows():
    records = synthetic_records()
    records += [{**r, "method": "taps"} for r in records if (r["method"], r["budget"]) == ("ddtree", 16)]
    summary = summarize(records)
    cells = matrix_cells(speedup_matrix(summary))
    for x in summary:
        column = f"{x['dataset'].split('/')[-1]} T={x['temperature']:g}"
        if x["method"] == "ar":
            assert cells["ar (tokens/s)", column] == f"{x['tokens_per_second']:.2f} †"
        elif x["tau"] is None:
            assert cells[x["method"], column] == f"{x['speedup_vs_ar']:.2f}x{level(x)} †"
        else:
            assert cells[f"{x['method']}:{x['budget']}", column] == f"{x['speedup_vs_ar']:.2f}x{level(x)} ({x['tau']:.1f}) †"
    assert len(cells) == 6 * len({(x["method"], x["budget"]) for x in summary})
    rivals = matrix_cells(rival_matrix(taps_rival_rows(records, summary)))
    rows = head_to_head(records, summary)
    assert len(rivals) == len(rows) and {r["rival"] for r in rows} == {"hf-assisted", "ddtree"}
    for r in rows:
        column = f"{r['dataset'].split('/')[-1]} T={r['temperature']:g}"
        suffix = "" if r["rival_budget"] is None else f" (:{r['rival_budget']})"
        assert rivals[f"taps:16 / {r['rival']}", column] == f"{r['speedup_vs_rival']:.2f}x{level(r)}{suffix} †"
        if r["ci_low"] is None:  # one prompt: no interval
            assert r["prompts"] < 2 and r["verdict"] is None
        else:
            assert r["verdict"] == ("level" if r["ci_low"] <= 1 <= r["ci_high"] else "faster" if r["ci_low"] > 1 else "slower")


def test_headline_cells_over_fewer_than_30_prompts_are_marked_with_a_footnote(tmp_path):
    def records(n):
        return [make_record("humaneval", str(i), method, budget, 0.0, [[1] * 12], accepted=accepted,
                            seconds_per_round=0.01 * (1 + i % 3))
                for i in range(n) for method, budget, accepted in (("ar", None, [[0] * 12]), ("chain", 4, [[2] * 4]))]

    few = write_report(records(29), tmp_path / "few").read_text()
    enough = write_report(records(30), tmp_path / "enough").read_text()
    assert matrix_cells(speedup_matrix(summarize(records(29))))["chain:4", "humaneval T=0"].endswith(" †")
    assert "† fewer than 30 prompts." in few
    assert "†" not in enough and "fewer than 30 prompts" not in enough


def level(row: dict) -> str:
    """What a matrix cell adds when the 95% interval contains 1."""
    return " level" if row["ci_low"] is not None and row["ci_low"] <= 1 <= row["ci_high"] else ""


def test_round_costs_are_stage_seconds_per_round_over_one_ar_round(tmp_path):
    # ar: 10 rounds, 1 s verifying (0.1 s a forward); chain:7: 5 rounds, 0.25 s drafting, 1 s verifying
    ar = make_record("humaneval", "HumanEval/0", "ar", None, 0.0, [[1] * 10], accepted=[[0] * 10])
    chain = make_record("humaneval", "HumanEval/0", "chain", 7, 0.0, [[1] * 10], accepted=[[1] * 5])
    ar["stage_seconds"] = {"draft": 0.0, "verify": 1.0, "prefill": 0.3}
    chain["stage_seconds"] = {"draft": 0.25, "verify": 1.0, "prefill": 0.3}
    peer = make_record("humaneval", "HumanEval/0", "hf-assisted", None, 0.0, [[1] * 10])
    rows = {r["method"]: r for r in round_costs([ar, chain, peer], summarize([ar, chain, peer]))}
    assert rows.keys() == {"ar", "chain"}
    assert rows["chain"]["draft_ms"] == pytest.approx(50.0) and rows["chain"]["verify_ms"] == pytest.approx(200.0)
    assert rows["chain"]["draft_vs_forward"] == pytest.approx(0.5) and rows["chain"]["verify_vs_forward"] == pytest.approx(2.0)
    assert rows["ar"]["verify_vs_forward"] == pytest.approx(1.0)
    text = write_report([ar, chain, peer], tmp_path).read_text()
    assert "| humaneval | 0.0 | chain | 7 | 5 | 50.0 | 200.0 | 0.50 | 2.00 |" in text


def test_a_record_of_no_rounds_reports_without_tau():
    # a run that committed nothing (an empty answer) has 0 rounds: no tau, and no crash
    records = synthetic_records()
    empty = make_record("humaneval", "HumanEval/9", "chain", 4, 0.0, [[]], accepted=[[]])
    empty["total_seconds"] = 0.0
    row = next(x for x in summarize([empty]) if x["method"] == "chain")
    assert row["tau"] is None and row["tokens_per_second"] is None
    records.append(empty)
    summary = summarize(records)
    assert summary and same_size_tau(summary) and round_costs(records, summary) and speedup_matrix(summary)


BLOCK_TORCH = (
    "import sys\n"
    "for name in ('torch', 'transformers', 'peft', 'accelerate', 'safetensors'):\n"
    "    sys.modules[name] = None  # import fails\n"
    "from taps.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "assert not {'torch', 'transformers', 'peft'} & {m for m, v in sys.modules.items() if v is not None}\n"
    "sys.exit(code)\n"
)


def run_without_torch(*argv: str) -> subprocess.CompletedProcess:
    src = str(Path(taps.__file__).resolve().parents[1])  # the taps under test, not another install
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *argv], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip


def test_taps_report_runs_where_torch_cannot_be_imported(tmp_path):
    results = tmp_path / "results.jsonl"
    store = RecordFile.open(results, {"target": "smollm2-135m", "max_new_tokens": 32})
    store.extend(synthetic_records())
    done = run_without_torch("report", str(results), "--out", str(tmp_path / "report"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "report" / "report.md")
    assert parse_table((tmp_path / "report" / "report.md").read_text())
    for name in PLOTS:
        assert (tmp_path / "report" / name).read_bytes()[:8] == PNG_MAGIC


def test_taps_report_errors_are_one_line_without_torch(tmp_path):
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"dataset": "humaneval"\n' + json.dumps(synthetic_records()[0]) + "\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    for argv, message in (
        (["report", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r")], "no results file"),
        (["report", str(damaged), "--out", str(tmp_path / "r")], f"{damaged}:1: not a JSON record"),
    ):
        done = run_without_torch(*argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"taps: error: {message}")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(synthetic_records()[0]) + "\n")
    done = run_without_torch("report", str(good), "--out", str(blocker / "r"))
    assert done.returncode == 2 and done.stderr.startswith(f"taps: error: cannot write the report to {blocker / 'r'}")


def test_the_report_says_how_quiet_the_machine_was_and_counts_the_runs_that_shared_it(tmp_path):
    records = synthetic_records()
    assert "Other processes" not in write_report(records, tmp_path / "old").read_text()  # unmeasured: silent
    shares = [0.0, 0.01, 0.02, 0.3]
    measured = [{**r, "others_cpu": shares[i % len(shares)]} for i, r in enumerate(records)]
    text = write_report(measured, tmp_path / "new").read_text()
    n, busy = len(measured), sum(1 for i in range(len(measured)) if shares[i % len(shares)] > 0.1)
    assert f"during a run: median 2%, most 30% ({n} runs measured)." in text
    assert f"**{busy} of {n} runs shared the machine**" in text
