"""`taps gen-data --engine vllm` (issue 22): the target's answers through vLLM's offline engine,
in the records of the transformers path, resumable, the engine pinned, and greedy answers equal
to the target's own greedy decoding. SmolLM2-135M in float32 (both engines exact enough that
its greedy answers agree). Runs only where the vllm extra is installed (make install-vllm)."""

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed (make install-vllm; docs/vllm.md)")

import taps.train.data as D
from taps.records import read_records, read_settings

pytestmark = pytest.mark.vllm

FAST = {"enforce_eager": True}  # no compilation: the test times engine starts, not decoding


def answers(path):  # by prompt: a file holds them in batch order (by length)
    return {r["prompt_index"]: r["ids"] for r in read_records(path)}


def test_vllm_answers_are_the_targets_greedy_and_resume(tmp_path):
    kw = dict(max_new_tokens=12, progress=False)
    out = tmp_path / "vllm.jsonl"
    first = D.generate_data("smollm2-135m", out, 3, batch_size=2, engine="vllm", vllm_options=FAST, **kw)
    assert (first.n_prompts, first.generated) == (3, 3)
    assert read_settings(out)["engine"] == "vllm"
    again = D.generate_data("smollm2-135m", out, 4, batch_size=2, engine="vllm", vllm_options=FAST, **kw)
    assert again.generated == 1 and again.tokens == sum(len(ids) for ids in answers(out).values())
    reference = tmp_path / "transformers.jsonl"
    D.generate_data("smollm2-135m", reference, 4, batch_size=1, **kw)
    assert "engine" not in read_settings(reference)
    assert read_records(out)[0].keys() == read_records(reference)[0].keys()
    assert answers(out) == answers(reference)  # eos kept where an answer ended, as transformers' path keeps it
    with pytest.raises(ValueError, match="engine"):
        D.generate_data("smollm2-135m", out, 4, batch_size=2, **kw)  # the file's engine is pinned


def test_sampled_answers_do_not_depend_on_their_batch(tmp_path):
    kw = dict(max_new_tokens=8, progress=False, engine="vllm", vllm_options=FAST, temperature=1.0)
    together, alone = tmp_path / "together.jsonl", tmp_path / "alone.jsonl"
    D.generate_data("smollm2-135m", together, 3, batch_size=3, **kw)
    D.generate_data("smollm2-135m", alone, 3, batch_size=1, **kw)
    assert answers(together) == answers(alone)
    greedy = tmp_path / "greedy.jsonl"
    D.generate_data("smollm2-135m", greedy, 3, **{**kw, "temperature": 0.0})
    assert answers(greedy) != answers(together)  # it does sample
    # a step's budget under the batch's prompts: each prompt still prefilled whole, in a step of its own (vLLM's
    # CPU runner cannot rewind a seeded request's generator after a prompt prefilled in parts)
    short = tmp_path / "short-steps.jsonl"
    D.generate_data("smollm2-135m", short, 3, batch_size=3,
                    **{**kw, "vllm_options": {**FAST, "max_num_batched_tokens": 16}})
    assert answers(short) == answers(together)
