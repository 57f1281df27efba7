"""The benchmark harness without models: plan order, resumption, torn or garbage lines, interrupted
runs, and summaries recomputed from the raw records."""

import json

import pytest

from taps import bench
from taps.datasets import Prompt

PROMPTS = [Prompt("humaneval", f"HumanEval/{i}", "coding", (f"task {i}",)) for i in range(3)]
METHODS = ("ar", "chain", "ddtree", "hf-assisted")
MAX_NEW = 32  # recorded runs; the unrecorded warm-up runs use 8
RECORD_FIELDS = {
    "dataset", "prompt_id", "category", "method", "budget", "temperature", "target", "drafter", "token_ids", "texts",
    "seconds", "rounds", "accepted_per_round", "tree_sizes", "stage_seconds", "new_tokens", "total_seconds",
    "peak_rss_mb", "env", "copy_rounds",
}  # fmt: skip


def config(limit=3):
    return bench.BenchConfig(drafter="oracle", methods=METHODS, limit=limit, temperatures=(0.0, 1.0),
                             budgets=(4, 16), max_new_tokens=MAX_NEW)  # fmt: skip


class FakeSession:
    created = 0

    def __init__(self, cfg):
        FakeSession.created += 1
        self.cfg = cfg


class FakeRunner:
    """Stands in for bench.run_job: a Run whose numbers depend on the job; optionally raises on
    the n-th recorded run, as a crash or Ctrl-C mid-benchmark would."""

    def __init__(self, fail_at=None):
        self.recorded = []  # (prompt id, temperature, method, budget) of each recorded run
        self.fail_at = fail_at

    def __call__(self, session, prompt, temperature, method, budget, max_new):
        if max_new == MAX_NEW:
            if len(self.recorded) == self.fail_at:
                raise KeyboardInterrupt
            self.recorded.append((prompt.id, temperature, method, budget))
        if method in bench.PEERS:
            return bench.Run([[1, 2, 3, 4]], ["a b c d"], [0.2])
        accepted = [0, 0, 0, 0] if method == "ar" else [1, 2]
        ids = [[7] * sum(a + 1 for a in accepted)]
        return bench.Run(ids, ["x"], [0.1 * len(accepted)], [len(accepted)], accepted,
                         [budget or 0] * len(accepted), {"verify": 0.05, "prefill": 0.01})  # fmt: skip


@pytest.fixture
def harness(monkeypatch):
    """No models and no dataset downloads: prompts from PROMPTS, a fake session."""
    monkeypatch.setattr(bench, "load_prompts", lambda name, limit, path=None, categories=None: PROMPTS[:limit])
    monkeypatch.setattr(bench, "Session", FakeSession)
    FakeSession.created = 0

    def use(runner):
        monkeypatch.setattr(bench, "run_job", runner)
        return runner

    return use


def keys(records):
    return [bench.record_key(r) for r in records]


def test_plan_interleaves_methods_per_prompt_and_budgets_only_speculative_methods(harness):
    jobs = bench.plan(config())
    assert len(jobs) == 3 * 2 * (1 + 2 + 2 + 1)  # prompts x temperatures x (ar, chain x2, ddtree x2, peer)
    first = [(p.id, t, m, b) for p, t, m, b in jobs[:6]]
    assert first == [("HumanEval/0", 0.0, "ar", None), ("HumanEval/0", 0.0, "chain", 4),
                     ("HumanEval/0", 0.0, "chain", 16), ("HumanEval/0", 0.0, "ddtree", 4),
                     ("HumanEval/0", 0.0, "ddtree", 16), ("HumanEval/0", 0.0, "hf-assisted", None)]  # fmt: skip
    assert len(set((p.id, t, m, b) for p, t, m, b in jobs)) == len(jobs)


def test_a_budget_after_a_colon_fixes_that_entrys_budget(harness):
    cfg = bench.BenchConfig(drafter="oracle", methods=("ar", "chain:7", "ddtree:8", "ddtree:64", "taps"), budgets=(32,))
    assert cfg.runs == [("ar", None), ("chain", 7), ("ddtree", 8), ("ddtree", 64), ("taps", 32)]
    assert [(m, b) for _, _, m, b in bench.plan(cfg)][:5] == cfg.runs
    for bad in ("ar:4", "ddtree:0", "ddtree:x", "hf-assisted:8"):
        with pytest.raises(ValueError, match="applies only to speculative methods"):
            bench.BenchConfig(drafter="oracle", methods=("ar", bad))


def test_a_rerun_skips_finished_records_and_writes_no_duplicates(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    first = harness(FakeRunner())
    records = bench.run_bench(config(), out, progress=False)
    assert len(first.recorded) == len(records) == len(bench.plan(config()))

    again = harness(FakeRunner())
    assert keys(bench.run_bench(config(), out, progress=False)) == keys(records)
    assert again.recorded == [] and FakeSession.created == 1  # no models loaded for nothing to do
    lines = out.read_text().splitlines()
    assert len(lines) == len(records) == len(set(keys(bench.read_records(out))))


def test_a_larger_config_runs_only_what_is_missing(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    harness(FakeRunner())
    bench.run_bench(config(limit=2), out, progress=False)
    more = harness(FakeRunner())
    records = bench.run_bench(config(limit=3), out, progress=False)
    assert {pid for pid, *_ in more.recorded} == {"HumanEval/2"}
    assert len(records) == len(set(keys(records))) == len(bench.plan(config(limit=3)))


def test_records_carry_every_field_with_the_drafter_only_on_speculative_methods(harness, tmp_path):
    harness(FakeRunner())
    records = bench.run_bench(config(), tmp_path / "r.jsonl", progress=False)
    for r in records:
        assert set(r) == RECORD_FIELDS
        assert r["drafter"] == (None if r["method"] in ("ar", "hf-assisted") else "oracle")
        assert r["new_tokens"] == sum(len(t) for t in r["token_ids"])
        assert r["total_seconds"] == pytest.approx(sum(r["seconds"]))
    assert all(r["rounds"] is None and r["stage_seconds"] == {} for r in records if r["method"] == "hf-assisted")


def test_an_interrupted_run_keeps_completed_records_and_a_rerun_completes_the_rest(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    crashed = harness(FakeRunner(fail_at=5))
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(config(), out, progress=False)
    kept = bench.read_records(out)
    assert len(kept) == 5 and len(out.read_text().splitlines()) == 5

    rest = harness(FakeRunner())
    records = bench.run_bench(config(), out, progress=False)
    jobs = bench.plan(config())
    assert len(rest.recorded) == len(jobs) - 5
    assert len(records) == len(set(keys(records))) == len(jobs)
    assert records[:5] == kept  # completed records are untouched
    assert crashed.recorded == [(k[1], k[4], k[2], k[3]) for k in keys(kept)]


def test_a_torn_last_record_is_skipped_and_rerun(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    harness(FakeRunner())
    records = bench.run_bench(config(), out, progress=False)
    text = out.read_text()
    out.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # crash halfway through the last write
    assert keys(bench.read_records(out)) == keys(records[:-1])

    rerun = harness(FakeRunner())
    assert keys(bench.run_bench(config(), out, progress=False)) == keys(records)
    assert len(rerun.recorded) == 1


def test_garbage_lines_are_skipped_and_the_next_append_starts_on_its_own_line(tmp_path):
    out = tmp_path / "results.jsonl"
    good = {"dataset": "d", "prompt_id": "0", "method": "ar", "budget": None, "temperature": 0.0, "new_tokens": 3}
    bench.append_record(out, good)
    with open(out, "ab") as f:
        f.write(b"not json\n[1, 2]\n" + b'{"dataset": "d"}\n'  # not records: bad JSON, a list, missing keys
                + b"\xff\xfe\x00 binary\n"  # bytes that are not UTF-8 (a corrupted block)
                + b'{"dataset": "d", "prompt_id": "1", "met')  # a torn tail, no newline
    assert bench.read_records(out) == [good]

    later = {**good, "prompt_id": "2"}
    bench.append_record(out, later)
    assert bench.read_records(out) == [good, later]
    assert out.read_bytes().endswith((json.dumps(later) + "\n").encode())


def test_summaries_are_recomputed_from_the_raw_records(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    harness(FakeRunner())
    records = bench.run_bench(config(), out, progress=False)

    def chain4_at_0(rows):
        return next(r for r in rows if (r["method"], r["budget"], r["temperature"]) == ("chain", 4, 0.0))

    before = chain4_at_0(bench.summarize(bench.read_records(out)))
    assert before["tau"] == pytest.approx(5 / 2)  # 5 tokens in 2 rounds on every prompt
    assert before["speedup_vs_ar"] == pytest.approx((5 / 0.2) / (4 / 0.4))

    # edit one raw record on disk: 9 tokens in 3 rounds and twice as slow
    edited = [dict(r) for r in records]
    target = next(r for r in edited if (r["method"], r["budget"], r["temperature"]) == ("chain", 4, 0.0))
    target.update(token_ids=[[7] * 9], new_tokens=9, rounds=[3], accepted_per_round=[2, 2, 2], total_seconds=0.4)
    out.write_text("".join(json.dumps(r) + "\n" for r in edited))

    after = chain4_at_0(bench.summarize(bench.read_records(out)))
    assert after["tau"] == pytest.approx((5 + 5 + 9) / (2 + 2 + 3))
    assert after["tokens_per_second"] == pytest.approx(25.0)  # median of 25, 25, 22.5
    assert after["match_rate_vs_ar"] == 0.0  # ar committed 4 tokens, chain 5 or 9


def answer_record(dataset, prompt_id, category, method, budget, accepted, seconds):
    """A bench record with what the Spec-Bench answer files read (one turn)."""
    tokens = [5] * sum(a + 1 for a in accepted)
    return {"dataset": dataset, "prompt_id": prompt_id, "category": category, "method": method, "budget": budget,
            "temperature": 0.0, "texts": [f"answer to {prompt_id}"], "token_ids": [tokens], "seconds": [seconds],
            "rounds": [len(accepted)], "accepted_per_round": accepted}  # fmt: skip


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_spec_bench_answer_files_feed_its_speed_and_equal_scripts(tmp_path):
    # written out of order, two datasets; HumanEval's category "coding" is also one of the MT-Bench
    # categories Spec-Bench's speed.py selects, so each dataset gets its own folder
    records = [
        answer_record("spec-bench", "81", "translation", "chain", 4, [3, 1, 2], 2.0),
        answer_record("humaneval", "HumanEval/2", "coding", "ar", None, [0] * 6, 3.0),
        answer_record("spec-bench", "81", "translation", "ar", None, [0] * 9, 4.0),
        answer_record("spec-bench", "9", "writing", "ar", None, [0] * 4, 1.0),
        answer_record("spec-bench", "9", "writing", "chain", 4, [3], 0.5),
    ]
    paths = bench.write_spec_bench_answers(records, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "humaneval/ar-t0.0.jsonl", "spec-bench/ar-t0.0.jsonl", "spec-bench/chain-b4-t0.0.jsonl"]
    ar, chain = read_jsonl(tmp_path / "spec-bench/ar-t0.0.jsonl"), read_jsonl(tmp_path / "spec-bench/chain-b4-t0.0.jsonl")
    assert [row["question_id"] for row in ar] == [row["question_id"] for row in chain] == [9, 81]
    # speed.py: per row sum(new_tokens) / sum(wall_time); mean of accept_lengths is tau
    assert [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in chain] == [4 / 0.5, 9 / 2.0]
    lengths = [a for r in chain for a in r["choices"][0]["accept_lengths"]]
    assert sum(lengths) / len(lengths) == (4 + 9) / 4
    assert [r["category"] for r in ar] == ["writing", "translation"]
    # equal.py: the i-th lines' turns compared as text
    assert [str(r["choices"][0]["turns"]) for r in ar] == [str(r["choices"][0]["turns"]) for r in chain]


def test_a_file_never_mixes_dtypes_drafter_precisions_or_machines(harness, tmp_path, monkeypatch):
    harness(FakeRunner())
    out = tmp_path / "r.jsonl"
    bench.run_bench(config(limit=1), out, progress=False)
    n = len(bench.read_records(out))
    for other in ({"drafter_quant": "int8"}, {"dtype": "float32"}):
        cfg = bench.BenchConfig(**{**config(limit=2).__dict__, **other})
        with pytest.raises(ValueError, match=f"holds runs with {next(iter(other))}"):
            bench.run_bench(cfg, out, progress=False)
    monkeypatch.setattr(bench, "cpu_name", lambda: "Other CPU (avx2)")  # a later session on another machine
    with pytest.raises(ValueError, match="holds runs with cpu .*this run has Other CPU"):
        bench.run_bench(config(limit=2), out, progress=False)
    assert len(bench.read_records(out)) == n
    with pytest.raises(ValueError, match="unknown drafter quantization"):
        bench.BenchConfig(drafter="oracle", drafter_quant="int3")


def test_categories_choose_within_the_sets_that_have_them(monkeypatch):
    sets = {"humaneval": [Prompt("humaneval", "0", "coding", ("def f():",))],
            "spec-bench": [Prompt("spec-bench", str(i), c, ("q",)) for i, c in enumerate(["translation", "qa", "translation"])]}  # fmt: skip
    monkeypatch.setattr(bench, "load_prompts", lambda name, limit, path=None: sets[name][:limit])

    def cfg(*categories):
        return bench.BenchConfig(methods=("ar",), datasets=("humaneval", "spec-bench"), spec_bench="q.jsonl",
                                 categories=categories, temperatures=(0.0,))  # fmt: skip

    assert [p.id for p, *_ in bench.plan(cfg("translation"))] == ["0", "0", "2"]  # humaneval whole, 2 translations
    assert len(bench.plan(cfg())) == 4
    with pytest.raises(ValueError, match=r"in categories \['writing'\]"):
        bench.plan(cfg("translation", "writing"))
