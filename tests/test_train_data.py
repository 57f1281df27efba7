"""Drafter training data: prompt sources, the evaluation-overlap guard, the data file in the
records store, self-distillation on SmolLM2 and the gen-data / train-drafter commands."""

import dataclasses
import json

import pytest
import torch

from taps import datasets
from taps.cli import build_parser, main
from taps.datasets import GSM_SYMBOLIC_SEED, Prompt
from taps.records import read_records, read_settings
from taps.train import cli as T
from taps.train import data as D
from taps.train import followup as F
from taps.train import overlap as O
from taps.train import prompts as P
from taps.train import chat as chat_mod
from taps.train import stdlib as S
from taps.train.cli import TRAIN_HELP, TRAIN_REQUIRED
from taps.train.drafter import TrainDrafterConfig, load_sequences

# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def test_prompts_are_deterministic_prefix_stable_and_mixed():
    long = P.training_prompt_records(30, seed=0)
    assert P.training_prompt_records(30, seed=0) == long
    assert P.training_prompts(12, seed=0) == [p.text for p in long[:12]]  # prefix-stable: resumable with more
    assert P.training_prompts(12, seed=1) != [p.text for p in long[:12]]
    assert len({p.text for p in long}) == 30
    assert {p.source for p in long} == set(P.DEFAULT_MIX)
    for p in long:
        if p.source == "code-write":
            assert p.text.startswith(("Write a Python", "Implement the Python", "In Python, write")) and "`" in p.text
        if p.source == "code-explain":
            assert "```python\n" in p.text and len(p.text) < P.MAX_SOURCE_CHARS + 200


def test_chat_prompts_are_seeded_distinct_of_every_kind_and_opt_in():
    chat = P.training_prompt_records(400, seed=0, mix={"chat": 1.0})
    assert chat == P.training_prompt_records(400, seed=0, mix={"chat": 1.0}) and {p.source for p in chat} == {"chat"}
    assert len({p.text for p in chat}) == 400
    starts = {"Write ": 0, "Imagine you are ": 0, "Here are this week's orders": 0, "Compare ": 0}
    for p in chat:
        for start in starts:
            starts[start] += p.text.startswith(start)
    assert all(starts.values()), starts  # writing, role-play, extraction, comparisons all come early
    assert P.training_prompts(5, seed=1, mix={"chat": 1.0}) != [p.text for p in chat[:5]]
    assert "chat" not in P.DEFAULT_MIX  # files made with the default keep their prompts
    sizes = chat_mod.chat_sizes()
    assert sizes["extraction"] is None and sizes["writing"] == len(chat_mod.FORMS) * len(chat_mod.SUBJECTS) * len(chat_mod.CONSTRAINTS)
    O.check_no_eval_overlap([p.text for p in chat])


def test_gen_data_mix_option_parses_and_refuses_bad_input(capsys):
    args = build_parser().parse_args(["gen-data", "--target", "t", "--out", "o", "--prompts", "1", "--mix", "chat=1,math=0.5"])
    assert args.mix == {"chat": 1.0, "math": 0.5}
    for bad, says in [("poetry=1", "unknown prompt source 'poetry'"), ("chat", "has no weight"),
                      ("chat=-1", "must be >= 0"), ("chat=0", "no source a weight above 0")]:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["gen-data", "--target", "t", "--out", "o", "--prompts", "1", "--mix", bad])
        assert says in capsys.readouterr().err


def test_mix_selects_sources_and_rejects_bad_weights():
    only_math = P.training_prompt_records(5, seed=0, mix={"math": 1.0})
    assert {p.source for p in only_math} == {"math"}
    with pytest.raises(ValueError):
        P.training_prompts(3, mix={"humaneval": 1.0})
    with pytest.raises(ValueError):
        P.training_prompts(3, mix={"math": 0.0})


def test_gsm_symbolic_never_uses_the_evaluation_seed(monkeypatch):
    for seed in (0, 1, 7):
        for chunk in (0, 1, 100):
            s = P.rg_seed(seed, chunk)
            assert s != GSM_SYMBOLIC_SEED and s >= GSM_SYMBOLIC_SEED + P.GSM_EVAL_RESERVED
    first = next(P._math(0))
    # an evaluation item that a training seed happens to reproduce is dropped
    monkeypatch.setattr(O, "gsm_eval_questions", lambda: frozenset({S.normalize_space(first)}))
    assert next(P._math(0)) != first
    # and the stream refuses to run on the evaluation's seeds at all
    monkeypatch.setattr(P, "GSM_SYMBOLIC_SEED", P.rg_seed(0, 0))
    with pytest.raises(AssertionError):
        next(P._math(0))


def test_stdlib_scan_public_documented_definitions():
    files = S.stdlib_files()
    assert files and all("test" not in f.parts and "site-packages" not in f.parts for f in files)
    assert all(not part.startswith("_") for f in files for part in f.relative_to(S.stdlib_root()).parts[:-1])
    shlex = S.scan_module(S.stdlib_root() / "shlex.py")
    by_name = {d.name: d for d in shlex.definitions}
    assert by_name["shlex"].kind == "class"
    assert by_name["shlex"].signature == "shlex(instream=None, infile=None, posix=False, punctuation_chars=False)"
    assert by_name["shlex.push_token"].signature == "shlex.push_token(tok)"  # self dropped
    assert by_name["shlex.push_token"].source.startswith("def push_token(self, tok):")
    assert all(not d.name.split(".")[-1].startswith("_") for d in shlex.definitions)
    assert shlex.name == "shlex" and "lexical analyzer" in shlex.paragraph


# ---------------------------------------------------------------------------------------------
# The evaluation-overlap guard
# ---------------------------------------------------------------------------------------------

HUMANEVAL_CODE = 'def add(a, b):\n    """Add two numbers a and b and return the sum."""\n'


@pytest.fixture
def fake_eval_sets(monkeypatch, tmp_path):
    def fake(rows):
        return lambda limit, path=None: rows[:limit]

    monkeypatch.setitem(datasets.DATASETS, "humaneval", fake([
        Prompt("humaneval", "0", "coding", (f"Complete the following Python function.\n\n```python\n{HUMANEVAL_CODE}```",))]))
    monkeypatch.setitem(datasets.DATASETS, "mt-bench", fake([
        Prompt("mt-bench", "81", "writing", ("Compose an engaging travel blog post about Hawaii.", "Rewrite it in verse."))]))
    monkeypatch.setitem(datasets.DATASETS, "gsm-symbolic", fake([
        Prompt("gsm-symbolic", "0", "math", ("Ann has 3 apples and buys 4 more. How many apples does she have?",))]))
    spec = tmp_path / "question.jsonl"
    spec.write_text(json.dumps({"question_id": 1, "category": "translation",
                                "turns": ["Translate German-to-English: Guten Morgen, liebe Freunde."]}) + "\n")
    return spec


def test_eval_overlap_guard(fake_eval_sets, tmp_path):
    texts = O.eval_prompt_texts(fake_eval_sets, gsm_symbolic=5)
    assert set(texts) == {"humaneval", "mt-bench", "spec-bench", "gsm-symbolic"}
    clean = ["Summarize what the Python module `json` is for.", "Calculate 3 + 4.", "Rewrite it in prose."]
    O.check_no_eval_overlap(clean, fake_eval_sets, gsm_symbolic=5)
    bad = {
        "equal": "Compose an engaging travel blog post about Hawaii.",
        "second turn": "Please: Rewrite it in verse.",
        "contains, other whitespace": "Answer this:\n Ann has 3 apples  and buys 4 more.\nHow many apples does she have? Thanks",
        "spec-bench": "Translate German-to-English: Guten Morgen,\nliebe Freunde. Be brief.",
        "humaneval code alone": f"Explain:\n```python\n{HUMANEVAL_CODE}```",
    }
    for what, prompt in bad.items():
        with pytest.raises(O.EvalOverlapError):
            O.check_no_eval_overlap(clean + [prompt], fake_eval_sets, gsm_symbolic=5)
    hits = O.find_eval_overlap(list(bad.values()) + clean, texts)
    assert [h[0] for h in hits] == [0, 1, 2, 3, 4]
    # without the Spec-Bench file, that set is simply not loaded
    with pytest.warns(UserWarning, match="not found"):
        assert "spec-bench" not in O.eval_prompt_texts(tmp_path / "missing.jsonl", gsm_symbolic=5)


def test_the_guard_reads_the_spec_bench_copy_in_the_package(fake_eval_sets):
    texts = O.eval_prompt_texts(gsm_symbolic=0)  # the default: taps/data/spec_bench/question.jsonl
    assert len(texts["spec-bench"]) == 480 + 80  # 400 one-turn questions and 80 two-turn ones


# ---------------------------------------------------------------------------------------------
# Self-distillation on SmolLM2
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_generate_data_resumes_and_matches_unbatched_greedy(smollm2, tmp_path):
    model, tokenizer = smollm2
    out = tmp_path / "data.jsonl"
    first = D.generate_data("smollm2-135m", out, 2, max_new_tokens=4, batch_size=2, progress=False)
    assert (first.n_prompts, first.generated) == (2, 2)
    assert read_settings(out) == {"target": "smollm2-135m", "seed": 0, "mix": D.DEFAULT_MIX, "max_new_tokens": 4,
                                  "dtype": "float32"}  # fmt: skip
    with open(out, "ab") as f:
        f.write(b'{"prompt_index": 7, "ids"')  # torn by an interruption
    with pytest.warns(UserWarning, match="cut short"):
        again = D.generate_data("smollm2-135m", out, 3, max_new_tokens=4, batch_size=2, progress=False,
                                model=model, tokenizer=tokenizer)
    assert again.generated == 1
    records = read_records(out)
    assert sorted(r["prompt_index"] for r in records) == [0, 1, 2]  # batches go by prompt length
    prompts = P.training_prompt_records(3, seed=0)
    ids_of = {r["prompt_index"]: r for r in records}
    assert len(ids_of[0]["ids"][: ids_of[0]["n_prompt"]]) != len(ids_of[1]["ids"][: ids_of[1]["n_prompt"]])  # padded
    eos = tokenizer.eos_token_id
    for i, r in ids_of.items():
        assert r["prompt"] == prompts[i].text and r["source"] == prompts[i].source
        prompt_ids, response = r["ids"][: r["n_prompt"]], r["ids"][r["n_prompt"] :]
        assert prompt_ids == D.chat_ids(tokenizer, r["prompt"])  # no padding in front
        assert 1 <= len(response) <= 4 and eos not in response[:-1]  # nothing after an eos
        text = tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                             tokenize=False)
        assert tokenizer.decode(r["ids"]) == text + tokenizer.decode(response)
    # the batch mate with the shorter prompt was left-padded: its answer must equal plain greedy
    short = min(ids_of.values(), key=lambda r: r["n_prompt"])
    ids = torch.tensor([short["ids"][: short["n_prompt"]]])
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4,
                           pad_token_id=eos)[0, ids.shape[1] :].tolist()
    cut = next((j + 1 for j, t in enumerate(plain) if t == eos), len(plain))
    assert short["ids"][short["n_prompt"] :] == plain[:cut]
    # complete: nothing to do, and other settings are refused
    assert D.generate_data("smollm2-135m", out, 3, max_new_tokens=4, progress=False).generated == 0
    with pytest.raises(ValueError, match="max_new_tokens: 4 in the file, 5 now"):
        D.generate_data("smollm2-135m", out, 3, max_new_tokens=5, progress=False)
    # the trainer reads the file past its settings line
    assert len(load_sequences(out, len(tokenizer), 512, "answer")) == 3


def test_follow_ups_continue_each_first_turn_deterministically():
    code = "Here:\n```python\ndef f():\n    pass\n```"
    firsts = [{"prompt_index": i, "prompt": f"question {i}", "ids": [9, 9, 9, i, 1], "n_prompt": 3} for i in range(40)]
    firsts.append({"ids": [5, 6, 7]})  # a stdlib text record: no first turn

    def decode(ids):  # answers with code for even prompt indices
        return code if ids[0] % 2 == 0 else f"plain answer {ids}"

    ups = F.follow_up_prompts(firsts[::-1], 40, seed=0, decode=decode)  # by prompt index, whatever the file order
    assert ups == F.follow_up_prompts(firsts, 40, seed=0, decode=decode)
    assert ups[:10] == F.follow_up_prompts(firsts, 10, seed=0, decode=decode)  # prefix-stable
    assert [p.text for p in F.follow_up_prompts(firsts, 40, seed=1, decode=decode)] != [p.text for p in ups]
    for i, p in enumerate(ups):
        assert p.source == "follow-up" and p.history == (
            {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": decode([i, 1])})
        assert p.text in (F.CODE_REQUESTS + F.GENERAL_REQUESTS if i % 2 == 0 else F.GENERAL_REQUESTS)
    assert any(p.text in F.CODE_REQUESTS for p in ups) and len({p.text for p in ups}) > 10
    with pytest.raises(ValueError, match="answers no prompt 40 .40 of the first 41 are there.: give fewer --prompts"):
        F.follow_up_prompts(firsts, 41, seed=0, decode=decode)
    O.check_no_eval_overlap(list(F.CODE_REQUESTS + F.GENERAL_REQUESTS))


@pytest.mark.slow  # SmolLM2 answers two prompts, then two follow-ups after them
def test_follow_up_data_answer_second_turns_after_the_targets_first(smollm2, tmp_path):
    model, tokenizer = smollm2
    kw = dict(max_new_tokens=4, batch_size=2, progress=False, model=model, tokenizer=tokenizer)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    for bad, match in [(dict(follow_up=first), "no first-turn file .*first.jsonl: make it with `taps gen-data` first"),
                       (dict(follow_up=second), "cannot hold the follow-ups of its own first turns")]:
        with pytest.raises(ValueError, match=match):
            D.generate_data("smollm2-135m", second, 1, **kw, **bad)
    D.generate_data("smollm2-135m", first, 2, **kw)
    with pytest.raises(ValueError, match="a mix chooses first-turn prompts.*drop --mix"):
        D.generate_data("smollm2-135m", second, 2, **kw, follow_up=first, mix={"chat": 1.0})
    with pytest.raises(ValueError, match="holds answers of smollm2-135m, not other: .* give a first-turn file of this"):
        D.generate_data("other", second, 2, **kw, follow_up=first)
    assert not second.exists()  # refused before the file is made
    with pytest.raises(ValueError, match="answers no prompt 2"):
        D.generate_data("smollm2-135m", second, 3, **kw, follow_up=first)
    made = D.generate_data("smollm2-135m", second, 2, **kw, follow_up=first)
    assert (made.n_prompts, made.generated) == (2, 2)
    assert read_settings(second)["follow_up"] == {"file": "first.jsonl", "settings": read_settings(first)}
    firsts = {r["prompt_index"]: r for r in read_records(first)}
    for r in read_records(second):
        one = firsts[r["prompt_index"]]
        answer = tokenizer.decode(one["ids"][one["n_prompt"] :], skip_special_tokens=True)
        history = [{"role": "user", "content": one["prompt"]}, {"role": "assistant", "content": answer}]
        assert r["source"] == "follow-up" and r["prompt"] in F.GENERAL_REQUESTS + F.CODE_REQUESTS
        assert r["ids"][: r["n_prompt"]] == D.chat_ids(tokenizer, r["prompt"], history)
        assert one["prompt"] in tokenizer.decode(r["ids"]) and 1 <= len(r["ids"]) - r["n_prompt"] <= 4
    assert D.generate_data("smollm2-135m", second, 2, **kw, follow_up=first).generated == 0  # complete


def test_stdlib_text_sequences(smollm2, tmp_path):
    _, tokenizer = smollm2
    seqs = D.stdlib_text_sequences(tokenizer, 300, 128)
    assert [len(s) for s in seqs] == [128, 128, 44]
    assert seqs == D.stdlib_text_sequences(tokenizer, 300, 128)
    path = tmp_path / "d.jsonl"
    with pytest.raises(ValueError, match="make it with gen-data first"):
        D.append_text_sequences(path, tokenizer, 300, 128)
    assert D.generate_data("smollm2-135m", path, 0, progress=False).generated == 0  # text only: no model loads
    assert D.append_text_sequences(path, tokenizer, 300, 128) == 3
    assert D.append_text_sequences(path, tokenizer, 300, 128) == 0  # once
    assert [r["ids"] for r in read_records(path)] == seqs
    with pytest.raises(ValueError, match="text sequence 0 differs"):
        D.append_text_sequences(path, tokenizer, 400, 100)


# ---------------------------------------------------------------------------------------------
# The commands
# ---------------------------------------------------------------------------------------------


def test_train_drafter_options_cover_the_config():
    fields = {f.name for f in dataclasses.fields(TrainDrafterConfig)}
    assert set(TRAIN_HELP) | set(TRAIN_REQUIRED) == fields
    args = build_parser().parse_args(["train-drafter", "--target", "t", "--data", "d", "--out", "o",
                                      "--mask-token-id", "3", "--target-layer-ids", "1,4", "--gamma", "2.5"])
    assert args.target_layer_ids == (1, 4) and args.gamma == 2.5 and args.mask_token_id == 3
    for f in dataclasses.fields(TrainDrafterConfig):
        if f.name not in TRAIN_REQUIRED and f.name not in ("target_layer_ids", "gamma"):
            assert getattr(args, f.name) == f.default, f.name
    gen = build_parser().parse_args(["gen-data", "--target", "t", "--out", "o", "--prompts", "5"])
    assert (gen.max_new_tokens, gen.dtype, gen.seed, gen.engine, gen.follow_up) == (256, "float32", 0, "transformers", None)
    assert gen.batch_size is None  # the engine's default: T.TRANSFORMERS_BATCH, T.VLLM_BATCH


def test_train_drafter_picks_an_unused_special_token_and_says_so(capsys, tmp_path):
    assert main(["train-drafter", "--target", "smollm2-135m", "--data", str(tmp_path / "d"),
                 "--out", str(tmp_path / "o")]) == 2  # the data file is missing: said before any model loads
    assert "no data file" in capsys.readouterr().err
    assert T._mask_token("smollm2-135m", None) == 3
    said = capsys.readouterr().out
    assert "mask token): 3 '<repo_name>'" in said and "'<|im_end|>'" not in said  # eos is never offered
    assert T._mask_token("smollm2-135m", 7) == 7


@pytest.mark.slow  # SmolLM2 answers prompts, then a drafter trains on them
def test_train_drafter_generates_data_once_then_trains(capsys, tmp_path):
    data, out = tmp_path / "data.jsonl", tmp_path / "run"
    argv = ["train-drafter", "--target", "smollm2-135m", "--data", str(data), "--out", str(out), "--prompts", "2",
            "--gen-max-new-tokens", "4", "--mask-token-id", "3", "--block-size", "8", "--anchors-per-sequence", "4",
            "--max-seq-len", "192", "--epochs", "1", "--eval-sequences", "1", "--scorer-prompts", "0", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"drafter saved in {out / 'drafter'} (step 1 of 1)" in printed
    assert '"eval_loss"' in printed.split("last evaluation:")[1]
    assert (out / "drafter" / "config.json").is_file() and len(read_records(data)) == 2
    before = data.read_bytes()
    assert main(argv) == 0  # data reused, training already complete
    assert data.read_bytes() == before


@pytest.mark.slow  # the one command: data, drafter and scorer for a target, in the taps home, resumable
def test_train_drafter_for_a_target_alone_makes_data_drafter_and_scorer(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TAPS_HOME", str(tmp_path))
    monkeypatch.setattr(T, "DEFAULT_PROMPTS", 3)
    argv = ["train-drafter", "--target", "smollm2-135m", "--gen-max-new-tokens", "6", "--gen-batch-size", "1",
            "--block-size", "8",
            "--anchors-per-sequence", "4", "--max-seq-len", "192", "--epochs", "1", "--eval-sequences", "1",
            "--scorer-prompts", "2", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    run = tmp_path / "drafters" / "smollm2-135m"
    assert f"run folder: {run}; data: {run / 'data.jsonl'} (3 prompts)" in printed
    assert "mask token): 3 '<repo_name>'" in printed
    assert len(read_records(run / "data.jsonl")) == 3 and (run / "drafter" / "config.json").is_file()
    assert "s per batch on this machine, 2 more to go: about" in printed  # time estimates after the first unit
    assert "s per step on this machine, 1 more to go: about" in printed
    kept = (run / "drafter" / "scorer").is_dir()
    assert ("edge scorer saved in" in printed) == kept and ("edge scorer not kept" in printed) != kept
    assert (run / "scorer-run" / "log.jsonl").is_file()
    assert main(argv) == 0  # complete: a rerun changes nothing


@pytest.mark.slow
def test_sampled_data_pin_the_temperature_and_resume_with_the_same_draws(smollm2, tmp_path):
    model, tokenizer = smollm2
    kw = dict(max_new_tokens=6, batch_size=1, progress=False, model=model, tokenizer=tokenizer, temperature=1.0)
    whole = tmp_path / "whole.jsonl"
    D.generate_data("smollm2-135m", whole, 2, **kw)
    assert read_settings(whole)["temperature"] == 1.0
    split = tmp_path / "split.jsonl"  # interrupted after one prompt, then resumed
    D.generate_data("smollm2-135m", split, 1, **kw)
    D.generate_data("smollm2-135m", split, 2, **kw)

    def answers(path):  # by prompt: a file holds them in batch order (by length)
        return {r["prompt_index"]: r["ids"] for r in read_records(path)}

    assert answers(split) == answers(whole)
    greedy = tmp_path / "greedy.jsonl"
    D.generate_data("smollm2-135m", greedy, 2, **{**kw, "temperature": 0.0})
    assert answers(greedy) != answers(whole)  # it does sample
    with pytest.raises(ValueError, match="temperature"):
        D.generate_data("smollm2-135m", whole, 2, **{**kw, "temperature": 0.7})


def test_an_engine_that_cannot_run_is_refused_before_the_file_is_made(tmp_path, monkeypatch, capsys):
    out = tmp_path / "data.jsonl"
    with pytest.raises(ValueError, match="unknown engine 'sglang': use one of transformers, vllm"):
        D.generate_data("smollm2-135m", out, 1, engine="sglang")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # as in a Python without the vllm extra
    assert main(["gen-data", "--target", "smollm2-135m", "--out", str(out), "--prompts", "1", "--engine", "vllm"]) == 2
    assert "--engine vllm needs the vllm extra in this Python: make install-vllm" in capsys.readouterr().err
    assert not out.exists()
