"""scripts/spec_bench_eval.py: Spec-Bench's speed() and equal.py run on taps' answer files from a
checkout (here a fake one with their signatures), with the BOS its speed() subtracts given back."""

import importlib.util
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from taps.assets import resolve
from taps.summary import write_spec_bench_answers

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "spec_bench_eval.py"

# speed() and equal.py's functions with Spec-Bench's signatures; speed() counts the baseline's tokens
# as Spec-Bench's does (re-tokenized, minus one per turn) and returns them as its baseline speed
FAKE_SPEED = '''
import json
from transformers import AutoTokenizer

def speed(jsonl_file, jsonl_file_base, tokenizer, task=None, report=True):
    tok = AutoTokenizer.from_pretrained(tokenizer)
    def rows(path):
        return [r for r in map(json.loads, open(path)) if task == "overall" or r["category"] == task]
    counted = sum(len(tok(t).input_ids) - 1 for r in rows(jsonl_file_base) for t in r["choices"][0]["turns"])
    return 1.0, float(counted), 1.0 / counted, [a for r in rows(jsonl_file) for a in r["choices"][0]["accept_lengths"]]
'''
FAKE_EQUAL = '''
def get_content(jsonfile_path, output_path):
    with open(jsonfile_path) as f, open(output_path, "w") as out:
        out.writelines(line.split('"turns": ')[1].split("]")[0] + "\\n" for line in f)

def txt_compare(file_path1, file_path2):
    return open(file_path1).read() == open(file_path2).read()
'''


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("spec_bench_eval", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(prompt_id, category, method, texts, accepted):
    return {"dataset": "spec-bench", "prompt_id": prompt_id, "category": category, "method": method,
            "budget": None if method == "ar" else 4, "temperature": 0.0, "texts": texts,
            "token_ids": [[1] * 5 for _ in texts], "seconds": [1.0] * len(texts), "rounds": [len(accepted)],
            "accepted_per_round": accepted}  # fmt: skip


def test_speed_runs_raw_and_with_the_bos_given_back_and_equal_compares_with_ar(script, tmp_path):
    checkout = tmp_path / "Spec-Bench" / "evaluation"
    checkout.mkdir(parents=True)
    (checkout / "speed.py").write_text(FAKE_SPEED)
    (checkout / "equal.py").write_text(FAKE_EQUAL)
    texts = {"1": ["The house is big."], "2": ["Add the numbers.", "Then divide them by two."]}
    records = [record(pid, cat, m, texts[pid], [0] * 5 if m == "ar" else [2, 1])
               for pid, cat in (("1", "translation"), ("2", "math_reasoning")) for m in ("ar", "chain")]
    write_spec_bench_answers(records, tmp_path / "r.answers")
    tokenizer = resolve("smollm2-135m")  # prepends no BOS, as Qwen's does not
    rows = script.evaluate(*script.load(tmp_path / "Spec-Bench"), tmp_path / "r.answers", tokenizer)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    assert [(r["method"], r["task"]) for r in rows] == [("chain-b4", "translation"), ("chain-b4", "math_reasoning"),
                                                       ("chain-b4", "overall")]  # fmt: skip
    overall = rows[-1]
    tokens = sum(len(tok(t).input_ids) for turns in texts.values() for t in turns)
    assert overall["baseline_tokens_per_second"] == tokens - 3  # speed()'s count: one too few per turn (3 turns)
    assert overall["baseline_tokens_per_second_bos_corrected"] == tokens
    assert overall["mean_accepted_tokens"] == 2.5 and overall["equal_to_ar"] is True


def test_tasks_are_spec_benchs_that_select_rows_other_than_overalls(script):
    assert script.tasks([{"category": "coding"}]) == ["overall"]  # HumanEval: "mt_bench" would be the same rows
    rows = [{"category": c} for c in ("translation", "qa", "writing")]
    assert script.tasks(rows) == ["mt_bench", "translation", "qa", "overall"]
