"""A sibling model as the drafter, used as it is (taps.drafters.sibling): lossless with every
method, its rows are its own greedy conditionals, and the oracle is the target's own sibling."""

import pytest
import torch

import taps
from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter
from taps.drafters.sibling import GreedyPathDrafter, load_sibling
from taps.methods import every_method
from taps.target import Target
from tiny import hf_greedy, tiny_model

PROMPT = [5, 17, 33, 2, 9, 41]


@pytest.fixture(scope="module")
def pair():
    """A target and a smaller-vocabulary-compatible sibling: another random model, sharper in places."""
    return tiny_model("llama", seed=0), tiny_model("qwen2", seed=1)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("method", [m for m in every_method() if m != "ar" and "rollout" not in m])
def test_sibling_drafting_is_lossless(pair, method):
    target_model, sibling = pair
    target = Target(target_model)
    drafter = load_sibling(sibling, target, block_len=5, min_reach=0.0)
    res = generate(target, PROMPT, DecodeConfig(method, budget=8, max_new_tokens=40, stop_ids=()), drafter)
    assert res.token_ids == hf_greedy(target_model, PROMPT, 40)


def test_rows_are_the_siblings_greedy_conditionals(pair):
    target_model, sibling = pair
    drafter = GreedyPathDrafter(sibling, 4, 96, 256)
    rows = drafter.draft(PROMPT, None)  # [4, vocab]
    path = hf_greedy(sibling, PROMPT, 3)
    with torch.inference_mode():
        for d in range(4):
            want = torch.softmax(sibling(torch.tensor([PROMPT + path[:d]])).logits[0, -1].float(), -1)
            torch.testing.assert_close(rows[d], want, atol=1e-5, rtol=1e-4)
    assert drafter.draft(PROMPT + path[:2], None).shape == (4, 96)  # the cached path is reused and extended


def test_min_reach_stops_the_path_early(pair):
    _, sibling = pair
    assert GreedyPathDrafter(sibling, 6, 96, 256, min_reach=1.0).draft(PROMPT, None).shape[0] == 1
    assert GreedyPathDrafter(sibling, 6, 96, 256, min_reach=0.0).draft(PROMPT, None).shape[0] == 6


def test_a_bigger_vocabulary_than_the_targets_is_refused():
    with pytest.raises(ValueError, match="vocabulary"):
        GreedyPathDrafter(tiny_model("llama", vocab=120), 4, 96, 256)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_a_loaded_model_as_drafter_through_the_api(pair, tmp_path):
    target_model, sibling = pair
    spec = taps.load(target_model, drafter=sibling, method="ddtree", budget=6, block_len=4)
    assert spec.generate(PROMPT, max_new_tokens=30).token_ids == hf_greedy(target_model, PROMPT, 30)
    sibling.save_pretrained(tmp_path / "sibling")  # a folder holding a plain causal LM is a sibling too
    folder = load_drafter(str(tmp_path / "sibling"), Target(target_model), block_len=4)
    assert isinstance(folder, GreedyPathDrafter) and folder.block_len == 4
