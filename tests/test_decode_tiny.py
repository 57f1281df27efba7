"""The engine on tiny random Llama and Qwen2 targets: exactness, boundaries, KV cache, errors."""

import pytest
import torch

import taps
from taps.decode import DecodeConfig, generate
from taps.drafters import TEST_DRAFTERS, load_drafter
from taps.methods import every_method
from taps.scorer import EdgeScorer
from taps.target import Target
from tiny import DEVICE, FeatureRecorder, hf_greedy, tiny_model

PROMPT = [5, 17, 33, 2, 9, 41]


# every check runs on Llama in the fast set; Qwen2 (attention biases) repeats them all in the slow set
@pytest.fixture(scope="module", params=["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def model(request):
    return tiny_model(request.param)


def run(model, method, drafter, n, stop=(), budget=8, block_len=6, prompt=PROMPT, **kw):
    target = Target(model, feature_layers=(0, 2))
    d = load_drafter(drafter, target, block_len=block_len) if drafter else None
    return generate(target, prompt, DecodeConfig(method=method, budget=budget, max_new_tokens=n, stop_ids=stop, **kw), d)


# rollout methods need a drafter with its own model to roll out (a grown one): tested in test_grown.py
SPECULATIVE = [m for m in every_method() if m != "ar" and "rollout" not in m]


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("drafter", list(TEST_DRAFTERS))
@pytest.mark.parametrize("method", SPECULATIVE)
def test_greedy_equals_transformers_generate(model, drafter, method):
    ref = hf_greedy(model, PROMPT, 48)
    res = run(model, method, drafter, 48)
    assert res.token_ids == ref
    s = res.stats
    assert s.new_tokens == 48 and s.rounds >= 48 / 7  # many rounds, each commits <= block_len + 1
    assert max(s.tree_sizes) <= 8
    assert sum(a + 1 for a in s.accepted_per_round) == 48
    if drafter == "oracle" and method == "chain":
        assert s.tau == pytest.approx(48 / 7, rel=0.01)  # accepts all 6 drafted tokens every round
    if drafter == "random" and "copy" not in method:  # copy rounds do not need the drafter
        assert s.tau < 1.3


def test_autoregressive_is_the_same_loop_without_draft(model):
    res = run(model, "ar", None, 20)
    assert res.token_ids == hf_greedy(model, PROMPT, 20)
    assert res.stats.rounds == 20 and res.stats.tree_sizes == [0] * 20 and res.stats.stage_seconds["draft"] == 0


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("method", ["chain", "ddtree", "taps"])
def test_the_api_decodes_exactly_on_the_tests_device(model, method):
    """taps.load, the composition root, told the device (TAPS_TEST_DEVICE: a GPU under
    scripts/check_device.sh): greedy equals transformers' generate there; a seeded sample repeats."""
    scorer = EdgeScorer() if method == "taps" else None  # a learned scorer's features meet the device's marginals
    spec = taps.load(model, "noisy", method=method, budget=8, dtype="float32", device=DEVICE, scorer=scorer)
    assert spec.generate(PROMPT, max_new_tokens=24).token_ids == hf_greedy(model, PROMPT, 24)
    sampled = [spec.generate(PROMPT, max_new_tokens=24, temperature=1.0, seed=3).token_ids for _ in range(2)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == 24


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("method", ["cost-aware", "taps"])
def test_proposals_carry_each_rounds_context(model, method):
    """`context` = the tokens cached before the round's root: the prompt's but one, plus all committed.
    Seen through the loop's seam: every round's proposal and what it committed."""
    rounds = []
    target = Target(model, feature_layers=(0, 2))
    cfg = DecodeConfig(method=method, budget=8, max_new_tokens=30, stop_ids=())
    res = generate(target, PROMPT, cfg, load_drafter("noisy", target, block_len=6), on_round=rounds.append)
    assert len(rounds) == res.stats.rounds
    committed = 0
    for i, r in enumerate(rounds):
        # every round proposes but a last one with a single token left (root only, nothing to draft)
        assert r.proposal is not None or i == len(rounds) - 1
        if r.proposal is not None:
            assert r.proposal.context == len(PROMPT) - 1 + committed
            assert r.proposal.marginals.shape[0] <= 30 - committed - 1
        committed += len(r.committed)
    assert [t for r in rounds for t in r.committed] == res.token_ids


@pytest.mark.parametrize("n", [1, 2, 6, 7, 8, 13])
def test_max_new_tokens_boundary_is_exact(model, n):
    # block_len 6: n = 7 is exactly one fully accepted oracle round, 8 spills one token over
    res = run(model, "chain", "oracle", n)
    assert res.token_ids == hf_greedy(model, PROMPT, n) and res.finish_reason == "length"


@pytest.mark.parametrize("drafter", ["oracle", "noisy"])
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("method", ["ddtree", "taps"])
def test_stop_token_ends_generation_inside_an_accepted_path(model, drafter, method):
    ref = hf_greedy(model, PROMPT, 30)
    stop = ref[9]  # a token the greedy output emits (maybe earlier too): first occurrence ends it
    expected = ref[: ref.index(stop) + 1]
    assert hf_greedy(model, PROMPT, 30, eos=stop) == expected
    res = run(model, method, drafter, 30, stop=(stop,))
    assert res.token_ids == expected
    assert res.finish_reason == "stop"


def test_context_limit_is_respected_exactly():
    model = tiny_model("llama", max_positions=32)
    prompt = list(range(3, 27))  # 24 tokens: 8 positions left
    res = run(model, "chain", "oracle", 100, prompt=prompt)
    assert len(res.token_ids) == 8 and res.finish_reason == "context"
    assert res.token_ids == hf_greedy(model, prompt, 8)


def test_kv_cache_after_commits_equals_token_by_token_cache(model):
    target = Target(model)
    res = generate(target, PROMPT, DecodeConfig("ddtree", budget=8, max_new_tokens=25, stop_ids=()),
                   load_drafter("noisy", target, block_len=5))
    assert max(res.stats.accepted_per_round) > 0 and res.stats.rounds < 25  # real commits happened
    committed = PROMPT + res.token_ids[:-1]  # the last token is the next root, not yet cached
    assert target.n_cached == len(committed)
    ref = Target(model)
    ref.prefill([])
    with torch.inference_mode():
        for pos, tok in enumerate(committed):
            model(input_ids=torch.tensor([[tok]]), position_ids=torch.tensor([[pos]]),
                  past_key_values=ref.cache, use_cache=True)
    for got, want in zip(target.cache.layers, ref.cache.layers):
        assert got.keys.shape == want.keys.shape
        torch.testing.assert_close(got.keys, want.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.values, want.values, atol=1e-4, rtol=1e-4)


def test_features_follow_committed_tokens(model):
    """The drafter receives exactly one feature row per committed token, root excluded."""
    target = Target(model, feature_layers=(0, 2))
    recorder = FeatureRecorder(target)
    generate(target, PROMPT, DecodeConfig("chain", budget=4, max_new_tokens=10, stop_ids=()), recorder)
    assert recorder.calls[0] == (len(PROMPT), len(PROMPT) - 1)
    assert recorder.got_each_token_once() and recorder.widths == {2 * model.config.hidden_size}


def test_bad_inputs_give_clear_errors(model):
    target = Target(model)
    with pytest.raises(ValueError, match="empty"):
        generate(target, [], DecodeConfig("ar"))
    with pytest.raises(ValueError, match="context"):
        generate(target, [1] * 256, DecodeConfig("ar"))
    with pytest.raises(ValueError, match="budget"):
        DecodeConfig("chain", budget=0)
    with pytest.raises(ValueError, match="unknown method"):
        DecodeConfig("nope")
    with pytest.raises(ValueError, match="does not apply"):
        DecodeConfig("chain+no-scorer")
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, PROMPT, DecodeConfig("chain"))
    other = Target(tiny_model("llama", vocab=50))
    with pytest.raises(ValueError, match="another target"):
        generate(target, PROMPT, DecodeConfig("chain"), load_drafter("random", other))
