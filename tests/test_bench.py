"""The benchmark harness without models: plan order, resumption, torn or damaged lines, interrupted
runs, settings pinned per results file, question files checked whole, and summaries recomputed
from the raw records."""

import dataclasses
import json
import time

import pytest

from taps import bench
from taps.cli import main
from taps import cpuload
from taps.cpuload import MIN_SECONDS
from taps.datasets import SPEC_BENCH_FILE, Prompt, load_prompts
from taps.linear import linear_in_use
from taps.records import Run, read_records, read_settings, record_key
from taps.summary import summarize, write_spec_bench_answers

PROMPTS = [Prompt("humaneval", f"HumanEval/{i}", "coding", (f"task {i}",)) for i in range(3)]
METHODS = ("ar", "chain", "ddtree", "hf-assisted")
MAX_NEW = 32  # recorded runs; the unrecorded warm-up runs use 8
RECORD_FIELDS = {
    "dataset", "prompt_id", "category", "method", "budget", "temperature", "target", "drafter", "token_ids", "texts",
    "seconds", "rounds", "accepted_per_round", "tree_sizes", "stage_seconds", "new_tokens", "total_seconds",
    "peak_rss_mb", "env", "copy_rounds", "others_cpu",
}  # fmt: skip


def config(limit=3):
    return bench.BenchConfig(drafter="oracle", methods=METHODS, limit=limit, temperatures=(0.0, 1.0),
                             budgets=(4, 16), max_new_tokens=MAX_NEW, dtype="bfloat16")  # fmt: skip


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
            return Run([[1, 2, 3, 4]], ["a b c d"], [0.2])
        accepted = [0, 0, 0, 0] if method == "ar" else [1, 2]
        ids = [[7] * sum(a + 1 for a in accepted)]
        return Run(ids, ["x"], [0.1 * len(accepted)], [len(accepted)], accepted,
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
    return [record_key(r) for r in records]


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
    assert len(lines) == 1 + len(records) == 1 + len(set(keys(read_records(out))))  # the settings line first


def test_a_larger_config_runs_only_what_is_missing(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    harness(FakeRunner())
    bench.run_bench(config(limit=2), out, progress=False)
    more = harness(FakeRunner())
    records = bench.run_bench(config(limit=3), out, progress=False)
    assert {pid for pid, *_ in more.recorded} == {"HumanEval/2"}
    assert len(records) == len(set(keys(records))) == len(bench.plan(config(limit=3)))


def test_configs_side_by_side_interleave_job_by_job_each_into_its_own_file(harness, tmp_path):
    """Two drafters of one target: each job runs under one drafter, then the other, before the next
    job; each file holds its own drafter's records and resumes on its own; plans must match."""
    order = []

    def runner(session, prompt, temperature, method, budget, max_new):
        if max_new == MAX_NEW:
            order.append((session.cfg.drafter, prompt.id, method, budget, temperature))
        return FakeRunner()(session, prompt, temperature, method, budget, max_new)

    harness(runner)
    cfgs = [config(limit=2), dataclasses.replace(config(limit=2), drafter="noisy")]
    outs = [tmp_path / "oracle.jsonl", tmp_path / "noisy.jsonl"]
    jobs = [[p.id, m, b, t] for p, t, m, b in bench.plan(cfgs[0])]
    bench.run_bench(cfgs[1], outs[1], progress=False)  # the second file is already complete
    order.clear()
    oracle, noisy = bench.run_side_by_side(list(zip(cfgs, outs)), progress=False)
    assert [key for _, *key in order] == jobs and {d for d, *_ in order} == {"oracle"}  # noisy's file was done
    outs[1].unlink()
    order.clear()
    oracle, noisy = bench.run_side_by_side(list(zip(cfgs, outs)), progress=False)
    assert order == [("noisy", *key) for key in jobs]
    outs[0].unlink()
    outs[1].unlink()
    order.clear()
    oracle, noisy = bench.run_side_by_side(list(zip(cfgs, outs)), progress=False)
    assert order == [(d, *key) for key in jobs for d in ("oracle", "noisy")]
    assert keys(oracle) == keys(noisy) == keys(read_records(outs[0]))
    assert {r["drafter"] for r in noisy} == {None, "noisy"} and {r["drafter"] for r in oracle} == {None, "oracle"}
    with pytest.raises(ValueError, match="same prompts, temperatures, methods and budgets"):
        bench.run_side_by_side([(cfgs[0], outs[0]), (config(limit=3), tmp_path / "more.jsonl")], progress=False)


def test_records_carry_every_field_with_the_drafter_only_on_speculative_methods(harness, tmp_path):
    harness(FakeRunner())
    records = bench.run_bench(config(), tmp_path / "r.jsonl", progress=False)
    for r in records:
        assert set(r) == RECORD_FIELDS
        assert r["drafter"] == (None if r["method"] in ("ar", "hf-assisted") else "oracle")
        assert r["new_tokens"] == sum(len(t) for t in r["token_ids"])
        assert r["total_seconds"] == pytest.approx(sum(r["seconds"]))
    assert all(r["rounds"] is None and r["stage_seconds"] == {} for r in records if r["method"] == "hf-assisted")


class TimedRunner(FakeRunner):
    """FakeRunner whose recorded runs last long enough for taps.cpuload to measure them."""

    def __call__(self, session, prompt, temperature, method, budget, max_new):
        if max_new == MAX_NEW:
            time.sleep(MIN_SECONDS)
        return super().__call__(session, prompt, temperature, method, budget, max_new)


def test_each_record_says_how_busy_the_machine_was_and_a_busy_run_is_reported_as_it_ends(harness, tmp_path,
                                                                                          capsys, monkeypatch):
    harness(TimedRunner())
    one = bench.BenchConfig(drafter="oracle", methods=("ar", "chain"), limit=1, temperatures=(0.0,),
                            max_new_tokens=MAX_NEW, dtype="bfloat16")
    records = bench.run_bench(one, tmp_path / "measured.jsonl", progress=False)
    assert all(0 <= r["others_cpu"] <= 1 for r in records)  # measured (Linux), a share of the machine
    monkeypatch.setattr(cpuload, "BUSY", -1.0)  # every measured run now counts as shared
    capsys.readouterr()
    records = bench.run_bench(one, tmp_path / "busy.jsonl", progress=False)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "other processes used" in line]
    assert len(warnings) == len(records) == 2 and "humaneval/HumanEval/0 ar ran" in warnings[0]


def test_redo_busy_runs_again_exactly_the_records_that_shared_the_cpu(harness, tmp_path):
    out = tmp_path / "r.jsonl"
    harness(FakeRunner())
    records = bench.run_bench(config(limit=1), out, progress=False)
    busy = records[2]
    lines = out.read_text().splitlines()
    lines = [lines[0]] + [json.dumps({**r, "others_cpu": 0.5 if r is busy else 0.0}) for r in records]
    out.write_text("\n".join(lines) + "\n")  # as if the third run had shared the machine
    runner = harness(FakeRunner())
    bench.run_bench(config(limit=1), out, progress=False)
    assert runner.recorded == []  # without --redo-busy a finished record stays
    again = bench.run_bench(config(limit=1), out, progress=False, redo_busy=True)
    assert runner.recorded == [(busy["prompt_id"], busy["temperature"], busy["method"], busy["budget"])]
    assert sorted(keys(again)) == sorted(keys(records)) == sorted(keys(read_records(out)))  # no duplicates
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]  # the rewrite left nothing beside it


def test_records_and_settings_name_the_drafter_without_absolute_paths(harness, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    harness(FakeRunner())
    cfg = bench.BenchConfig(**{**vars(config(limit=1)), "drafter": str(tmp_path / "runs" / "drafter")})
    records = bench.run_bench(cfg, tmp_path / "r.jsonl", progress=False)
    assert {r["drafter"] for r in records} == {None, "runs/drafter"}
    assert read_settings(tmp_path / "r.jsonl")["drafter"] == "runs/drafter"


def test_an_interrupted_run_keeps_completed_records_and_a_rerun_completes_the_rest(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    crashed = harness(FakeRunner(fail_at=5))
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(config(), out, progress=False)
    kept = read_records(out)
    assert len(kept) == 5 and len(out.read_text().splitlines()) == 1 + 5

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
    assert keys(read_records(out)) == keys(records[:-1])

    rerun = harness(FakeRunner())
    with pytest.warns(UserWarning, match="cut short by an interrupted write"):
        assert keys(bench.run_bench(config(), out, progress=False)) == keys(records)
    assert len(rerun.recorded) == 1
    assert read_records(out) == json.loads("[" + ",".join(out.read_text().splitlines()[1:]) + "]")  # all whole


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    harness(FakeRunner())
    bench.run_bench(config(limit=1), out, progress=False)
    lines = out.read_bytes().split(b"\n")
    for damage in (b"not json", b"\xff\xfe\x00 binary", b"[1, 2]", b'{"dataset": "d"}'):
        out.write_bytes(b"\n".join([*lines[:3], damage, *lines[3:]]))
        with pytest.raises(ValueError, match=rf"{out}:4: "):
            read_records(out, required=bench.KEY_FIELDS)
        harness(FakeRunner())
        with pytest.raises(ValueError, match=rf"{out}:4: "):  # and nothing is appended after it
            bench.run_bench(config(limit=1), out, progress=False)
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 2


def test_summaries_are_recomputed_from_the_raw_records(harness, tmp_path):
    out = tmp_path / "results.jsonl"
    harness(FakeRunner())
    records = bench.run_bench(config(), out, progress=False)

    def chain4_at_0(rows):
        return next(r for r in rows if (r["method"], r["budget"], r["temperature"]) == ("chain", 4, 0.0))

    before = chain4_at_0(summarize(read_records(out)))
    assert before["tau"] == pytest.approx(5 / 2)  # 5 tokens in 2 rounds on every prompt
    assert before["speedup_vs_ar"] == pytest.approx((5 / 0.2) / (4 / 0.4))

    # edit one raw record on disk: 9 tokens in 3 rounds and twice as slow
    edited = [dict(r) for r in records]
    target = next(r for r in edited if (r["method"], r["budget"], r["temperature"]) == ("chain", 4, 0.0))
    target.update(token_ids=[[7] * 9], new_tokens=9, rounds=[3], accepted_per_round=[2, 2, 2], total_seconds=0.4)
    out.write_text("".join(json.dumps(r) + "\n" for r in edited))

    after = chain4_at_0(summarize(read_records(out)))
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
    paths = write_spec_bench_answers(records, tmp_path)
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
    n = len(read_records(out))
    for other in ({"drafter_quant": "int8"}, {"dtype": "float32"}):
        cfg = bench.BenchConfig(**{**config(limit=2).__dict__, **other})
        name, value = next(iter(other.items()))
        with pytest.raises(ValueError, match=rf"other settings \({name}: '[a-z0-9]+' in the file, '{value}' now"):
            bench.run_bench(cfg, out, progress=False)
    monkeypatch.setattr(bench, "cpu_name", lambda: "Other CPU (avx2)")  # a later session on another machine
    with pytest.raises(ValueError, match="cpu: .* in the file, 'Other CPU \\(avx2\\)' now"):
        bench.run_bench(config(limit=2), out, progress=False)
    assert len(read_records(out)) == n
    with pytest.raises(ValueError, match="unknown drafter quantization"):
        bench.BenchConfig(drafter="oracle", drafter_quant="int3")


# every setting that changes a record's numbers, with another value (issue 20, item 1)
NUMBER_SETTINGS = {
    "max_new_tokens": 64, "drafter": "oracle-2", "seed": 1, "dtype": "float32", "scorer": "some/scorer",
    "profile": "profile.json", "drafter_quant": "int8", "rollout_steps": 8, "rollout_reach": 0.5, "linear": "torch",
    "block_len": 7, "target": "qwen2.5-coder-1.5b", "assistant": "other-assistant", "turns": 1,
    "target_quant": "int8",
}  # fmt: skip


def test_a_rerun_with_a_setting_that_changes_numbers_is_refused_naming_it(harness, tmp_path):
    out = tmp_path / "r.jsonl"
    first = harness(FakeRunner())
    records = bench.run_bench(config(limit=1), out, progress=False)
    pinned = read_settings(out)
    # target_quant is pinned only when not "none", so that files from before it stay resumable
    assert set(NUMBER_SETTINGS) - {"target_quant"} <= set(pinned) and {"cpu", "linear", "spec_bench"} <= set(pinned)
    before = out.read_bytes()
    for name, value in NUMBER_SETTINGS.items():
        if name == "linear" and linear_in_use(config().dtype, value) == pinned["linear"]:
            continue  # bfloat16 without native kernels runs torch's linear whatever the backend: nothing changes
        rerun = harness(FakeRunner())
        cfg = bench.BenchConfig(**{**config(limit=1).__dict__, name: value})
        # another setting may change with it: float32 runs oneDNN where bfloat16 (not native) runs torch's
        refused = rf"other settings \((.*; )?{name}: [^;]* in the file, {value!r} now[;)].*another --out"
        with pytest.raises(ValueError, match=refused):
            bench.run_bench(cfg, out, progress=False)
        assert rerun.recorded == [] and out.read_bytes() == before  # refused before any model or write
    questions = tmp_path / "questions.jsonl"
    questions.write_text(SPEC_BENCH_FILE.read_text().replace("Hawaii", "Iceland"))  # other questions, same ids
    with pytest.raises(ValueError, match=r"spec_bench: '[0-9a-f]+' in the file"):
        bench.run_bench(bench.BenchConfig(**{**config(limit=1).__dict__, "spec_bench": str(questions)}), out,
                        progress=False)
    # what only selects records stays free: more prompts, methods, budgets, temperatures run the new records
    more = harness(FakeRunner())
    wider = bench.BenchConfig(drafter="oracle", methods=(*METHODS, "taps"), limit=2, temperatures=(0.0, 0.5),
                              budgets=(4, 8), max_new_tokens=MAX_NEW, dtype="bfloat16")  # fmt: skip
    assert len(bench.run_bench(wider, out, progress=False)) == len(bench.plan(wider))
    wanted = {(p.dataset, p.id, m, b, t) for p, t, m, b in bench.plan(wider)}
    assert len(more.recorded) == len(wanted - set(keys(records))) > 0 and first.recorded
    assert len(read_records(out)) == len(set(keys(read_records(out))))


def test_the_bench_command_refuses_a_changed_setting_before_loading_models(harness, tmp_path, capsys):
    from taps.drafters import shipped_drafter

    out = tmp_path / "r.jsonl"
    harness(FakeRunner())
    bench.run_bench(bench.BenchConfig(drafter=shipped_drafter("smollm2-135m"), methods=("ar", "chain"), limit=1),
                    out, progress=False)  # what `taps bench --methods ar,chain --limit 1` records
    before, sessions = out.read_bytes(), FakeSession.created
    argv = ["bench", "--methods", "ar,chain", "--limit", "1", "--out", str(out)]
    assert main([*argv, "--max-new-tokens", "64", "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"taps: error: {out} holds records made with other settings (max_new_tokens: 128 in the "
                          "file, 64 now; seed: 0 in the file, 3 now)") and "Traceback" not in err
    assert out.read_bytes() == before and FakeSession.created == sessions  # no model loaded


def test_a_file_without_pinned_settings_reads_but_is_not_resumed(harness, tmp_path):
    out = tmp_path / "old.jsonl"
    harness(FakeRunner())
    records = bench.run_bench(config(limit=1), out, progress=False)
    out.write_text("".join(json.dumps(r) + "\n" for r in records))  # as taps wrote them before pinning
    assert read_records(out, required=bench.KEY_FIELDS) == records and read_settings(out) is None
    with pytest.raises(ValueError, match="written before taps pinned settings.*another --out"):
        bench.run_bench(config(limit=1), out, progress=False)


def test_an_unwritable_out_fails_before_any_model_loads(harness, tmp_path):
    harness(FakeRunner())
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker / "r.jsonl", tmp_path):
        with pytest.raises(ValueError, match=f"{out}"):
            bench.run_bench(config(limit=1), out, progress=False)
    assert FakeSession.created == 0


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


# ---------------------------------------------------------------------------------------------
# Question files are checked whole before any model loads (issue 20, items 2 and 5)
# ---------------------------------------------------------------------------------------------

GOOD = json.dumps({"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now in French."]})
BAD_QUESTIONS = {  # line 2 of the file -> (what the message must name)
    "string turns": ('{"question_id": 2, "category": "qa", "turns": "Why is the sky blue?"}', "field 'turns'"),
    "no turns": ('{"question_id": 2, "category": "qa", "turns": []}', "field 'turns'"),
    "an empty turn": ('{"question_id": 2, "category": "qa", "turns": ["Why?", " "]}', "field 'turns': turn 2"),
    "a turn not text": ('{"question_id": 2, "category": "qa", "turns": [3]}', "field 'turns': turn 1"),
    "turns missing": ('{"question_id": 2, "category": "qa"}', "field 'turns' is missing"),
    "id missing": ('{"category": "qa", "turns": ["Why?"]}', "field 'question_id' is missing"),
    "category empty": ('{"question_id": 2, "category": "", "turns": ["Why?"]}', "field 'category'"),
    "malformed JSON": ('{"question_id": 2, "category": "qa", "turns": ["Why?"', "not a JSON line"),
    "not an object": ('["Why?"]', "a question must be a JSON object"),
    "a repeated id": ('{"question_id": 1, "category": "qa", "turns": ["Why?"]}', "field 'question_id': 1 is also on line 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_QUESTIONS)
def test_a_bad_question_line_names_file_line_and_field(tmp_path, case):
    line, message = BAD_QUESTIONS[case]
    path = tmp_path / "question.jsonl"
    path.write_text(f"{GOOD}\n{line}\n{GOOD.replace('1', '3', 1)}\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: .*{message}".replace("(", r"\(").replace(")", r"\)")):
        load_prompts("spec-bench", limit=1, path=str(path))  # limit 1: the bad line is past it, still checked


def test_an_empty_or_missing_question_file_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=f"{empty} holds no questions"):
        load_prompts("spec-bench", path=str(empty))
    with pytest.raises(ValueError, match="question file not found"):
        load_prompts("spec-bench", path=str(tmp_path / "missing.jsonl"))


def test_spec_bench_reads_the_copy_taps_ships_by_default():
    prompts = load_prompts("spec-bench", limit=1)
    assert len(prompts) == 13 and len({p.category for p in prompts}) == 13  # one per category
    assert len(load_prompts("spec-bench")) == 480
    assert all(p.turns and all(isinstance(t, str) and t for t in p.turns) for p in load_prompts("spec-bench"))


def test_bench_refuses_a_bad_question_file_in_one_line_before_loading_models(tmp_path, capsys):
    questions, out = tmp_path / "question.jsonl", tmp_path / "r.jsonl"
    questions.write_text(f"{GOOD}\n{BAD_QUESTIONS['string turns'][0]}\n")
    argv = ["bench", "--methods", "ar", "--datasets", "spec-bench", "--spec-bench", str(questions), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"taps: error: {questions}:2: field 'turns'") and "Traceback" not in err
    assert not out.exists()
