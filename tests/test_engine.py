"""The public API (taps.load -> Speculator) on SmolLM2-135M in float32: exact against transformers'
greedy `generate`, streaming, stop strings, chat turns that reuse the cached prefix."""

import pytest
import torch

import taps
from taps.text import TextStream

MESSAGES = [{"role": "user", "content": "Write a Python function that reverses a string."}]
N = 24


@pytest.fixture(scope="module")
def spec(smollm2):
    model, tokenizer = smollm2
    return taps.load(model, tokenizer=tokenizer, method="taps", profile=None)


def hf_greedy(model, ids, n):
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=n)
    return out[0, len(ids):].tolist()


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_generate_equals_transformers_greedy_for_text_messages_and_a_loaded_model(spec, smollm2):
    model, tokenizer = smollm2
    ids = spec.encode(MESSAGES)
    assert ids == spec.encode(MESSAGES[0]["content"])  # a string goes through the same chat template
    ref = hf_greedy(model, ids, N)
    for prompt in (MESSAGES, MESSAGES[0]["content"], ids):
        res = spec.generate(prompt, max_new_tokens=N)
        assert res.token_ids == ref
        assert res.text == tokenizer.decode(ref, skip_special_tokens=True)
        assert res.finish_reason in ("length", "stop") and res.prompt_tokens == len(ids)
    assert res.stats.tau > 1  # the shipped drafter's trees were accepted


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_packaged_name_loads_the_shipped_drafter_and_decodes_exactly(smollm2):
    model, _ = smollm2
    spec = taps.load("smollm2-135m", method="chain", dtype="float32")
    assert spec.drafter is not None and spec.drafter_name.endswith("smollm2-135m")
    ids = spec.encode(MESSAGES)
    assert spec.generate(ids, max_new_tokens=N).token_ids == hf_greedy(model, ids, N)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_stream_pieces_concatenate_to_the_generated_text(spec):
    res = spec.generate(MESSAGES, max_new_tokens=N)
    pieces = list(spec.stream(MESSAGES, max_new_tokens=N))
    assert len(pieces) > 1 and "".join(pieces) == res.text
    assert spec.last_result.token_ids == res.token_ids


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_stop_strings_cut_the_answer(spec):
    full = spec.generate(MESSAGES, max_new_tokens=N).text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = full[: full.index(stop)]
    res = spec.generate(MESSAGES, max_new_tokens=N, stop=[stop])
    assert res.text == cut and res.finish_reason == "stop"
    assert stop in spec.tokenizer.decode(res.token_ids) and stop not in spec.tokenizer.decode(res.token_ids[:-1])
    assert "".join(spec.stream(MESSAGES, max_new_tokens=N, stop=[stop])) == cut


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_a_second_turn_reuses_the_cache_and_equals_a_fresh_decode(spec, smollm2):
    model, tokenizer = smollm2
    first = spec.generate(MESSAGES, max_new_tokens=N)
    turn2 = MESSAGES + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Now in C."}]
    ids = spec.encode(turn2)
    res = spec.generate(turn2, max_new_tokens=N)
    reused = res.stats.prefill_seconds
    assert res.token_ids == hf_greedy(model, ids, N)
    spec.target.reset()  # nothing cached: the whole conversation is prefilled
    fresh = spec.generate(turn2, max_new_tokens=N)
    assert fresh.token_ids == res.token_ids
    assert spec.target.cached_ids[: len(ids) - 1] == ids[:-1]
    assert reused < fresh.stats.prefill_seconds * 2  # a sanity bound, not a speed claim


class _Streamer:  # the transformers streamer protocol: put(token ids), end()
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_a_transformers_style_streamer_gets_the_prompt_then_every_round(spec):
    streamer = _Streamer()
    res = spec.generate(MESSAGES, max_new_tokens=N, streamer=streamer)
    assert streamer.puts[0] == spec.encode(MESSAGES) and streamer.ended
    assert [t for put in streamer.puts[1:] for t in put] == res.token_ids


def test_bad_prompts_and_options_are_refused(spec):
    with pytest.raises(ValueError, match="prompt"):
        spec.generate([1.5, "x"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        spec.generate(MESSAGES, max_new_tokens=0)
    with pytest.raises(ValueError, match="unknown method"):
        spec.generate(MESSAGES, method="nope")
    with pytest.raises(ValueError, match="dtype"):
        taps.load("smollm2-135m", dtype="float16")


def test_text_stream_holds_back_partial_characters_and_stop_prefixes(smollm2):
    _, tokenizer = smollm2
    ids = tokenizer("naïve café — 日本語 END tail", add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer, stop=["END"])
    pieces = [stream.push([t]) for t in ids]
    assert stream.stopped and "".join(pieces) == "naïve café — 日本語 "
    assert all("\ufffd" not in p for p in pieces)
    plain = TextStream(tokenizer)
    text = "".join(plain.push([t]) for t in ids) + plain.flush()
    assert text == tokenizer.decode(ids)
