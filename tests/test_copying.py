"""Copy rounds (taps.copying): the planner's estimates and decisions without a model, then the
loop on tiny targets: lossless, copy rounds really happen, and the drafter still receives every
committed token's features once."""

import pytest
import torch

from taps.copying import Continuation, CopyPlanner, Rate
from taps.costmodel import LatencyProfile, ProfileInfo
from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter
from taps.target import Target
from tiny import FeatureRecorder, hf_greedy, tiny_model

INFO = ProfileInfo(target="t", dtype="float32", cpu="c", torch="2", threads=1, context_lengths=(8,), repeats=3)
# verifying costs 1 s plus 0.01 s per node; drafts (observed below) cost 1 s: copying saves half a round
PROFILE = LatencyProfile((0, 64), (1.0, 1.64), draft_seconds=1.0, info=INFO)
REPEATING = [5, 17, 33, 2, 9, 41, 7, 5, 17, 33, 2, 9, 41, 7, 5, 17, 33, 2, 9]  # its tail recurs


def test_rate_starts_at_one_half_and_forgets_the_past():
    r = Rate()
    assert r.p == 0.5
    r.update(True, decay=0.5)
    r.update(False, decay=0.5)
    assert (r.hits, r.trials) == (0.5, 1.5)
    assert r.p == pytest.approx(1.5 / 3.5)


def test_observe_compares_the_continuation_with_what_the_round_committed():
    planner = CopyPlanner(PROFILE, decay=0.5)
    three = planner.rates[3]
    planner.observe(Continuation([1, 2, 3, 4], 3), [1, 2, 9], drafted_size=None)  # right, right, wrong
    assert (three.first.hits, three.first.trials) == (1, 1)
    assert (three.next.hits, three.next.trials) == (0.5, 1.5)  # a hit, then a miss after decaying it by half
    assert planner.drafted_rounds == 0  # a copy round says nothing about drafted rounds
    planner.observe(Continuation([8, 8], 3), [1, 2], drafted_size=6, draft_seconds=0.3)  # a miss at once: no evidence after it
    assert (three.first.hits, three.first.trials) == (0.5, 1.5)
    assert three.next.trials == 1.5
    assert (planner.drafted_rounds, planner.drafted_tokens, planner.drafted_nodes, planner.drafted_seconds) == (1, 2, 6, 0.3)
    planner.observe(Continuation([5], 1), [7], drafted_size=None)  # each match length keeps its own rates
    assert planner.rates[1].first.trials == 1 and three.first.trials == 1.5


def test_the_continuation_is_the_longest_recent_one_of_the_longest_match():
    assert CopyPlanner.continuation([1, 2, 3, 4, 5, 1, 2, 3, 9, 1, 2, 3]) == Continuation([4, 5, 1, 2, 3, 9, 1, 2, 3], 3)
    assert CopyPlanner.continuation([7, 7, 7, 7, 7, 7]).tokens == [7, 7, 7]  # a repeating run: not the 1-token latest
    assert CopyPlanner.continuation([1, 2, 3, 4, 5, 9, 2, 3]) == Continuation([4, 5, 9, 2, 3], 2)  # no 3-token match
    assert CopyPlanner.continuation([1, 2, 3, 7, 8, 3]) == Continuation([7, 8, 3], 1)
    assert CopyPlanner.continuation([1, 2, 3]) == Continuation([])


def test_copy_tree_only_when_modelled_faster_than_a_drafted_round():
    planner = CopyPlanner(PROFILE)
    path = Continuation([4, 5, 6, 7, 8, 9], 3)
    assert planner.copy_tree(3, path, budget=8) is None  # no drafted round yet: nothing to compare
    planner.observe(Continuation([]), [1, 2, 3, 4], drafted_size=4, draft_seconds=1.0)  # 4 tokens in 1 + 1.04 s: ~2 tokens/s
    for _ in range(20):  # continuations that were right
        planner.observe(Continuation([1, 2, 3, 4], 3), [1, 2, 3, 4], drafted_size=None)
    tree = planner.copy_tree(3, path, budget=8)
    assert tree.tokens.tolist() == [3, *path.tokens] and tree.parents.tolist() == list(range(-1, len(path.tokens)))
    assert planner.copy_tree(3, path, budget=2).tokens.tolist() == [3, 4, 5]  # the budget caps it
    assert planner.copy_tree(3, Continuation([]), budget=8) is None
    assert planner.copy_tree(3, Continuation(path.tokens, 1), budget=8) is None  # 1-token matches: no evidence yet
    for _ in range(20):  # continuations whose first token was wrong: a copy round would commit ~1 token in 1.06 s
        planner.observe(Continuation([1, 2], 3), [9, 9], drafted_size=None)
    assert planner.rates[3].first.p < 0.2 and planner.copy_tree(3, path, budget=8) is None


def test_copy_tree_weighs_the_drafting_time_rounds_really_took():
    """The same evidence drafts while drafts are cheap and copies once they are dear (a rollout's
    steps, a long context): the measured drafting time, not the profile's, decides."""
    planner = CopyPlanner(PROFILE, decay=0.5)
    planner.observe(Continuation([]), [1, 2, 3], drafted_size=4, draft_seconds=0.0)  # drafted rounds commit 3 tokens
    for _ in range(3):
        planner.observe(Continuation([1, 2, 3, 4], 3), [1, 2, 9], drafted_size=None)  # continuations right for 2 tokens
    path = Continuation([4, 5, 6, 7], 3)
    assert planner.copy_tree(3, path, budget=8) is None  # 3 tokens per ~1.04 s beat copying
    for _ in range(10):
        planner.observe(Continuation([]), [1, 2, 3], drafted_size=4, draft_seconds=3.0)
    assert planner.copy_tree(3, path, budget=8) is not None  # not per ~4.04 s


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("drafter", ["oracle", "random", "noisy"])
def test_copy_rounds_are_lossless_and_happen(family, drafter):
    model = tiny_model(family)
    target = Target(model, feature_layers=(0, 2))
    d = load_drafter(drafter, target, block_len=6)
    res = generate(target, REPEATING, DecodeConfig("taps+copy", budget=8, max_new_tokens=40, stop_ids=()), d,
                   profile=PROFILE)  # fmt: skip
    assert res.token_ids == hf_greedy(model, REPEATING, 40)
    if drafter == "random":  # drafted rounds commit ~1 token: the repeating text is copied instead
        assert res.stats.copy_rounds > 0
    assert res.stats.copy_rounds < res.stats.rounds


def test_a_copy_round_keeps_the_features_for_the_next_draft():
    model = tiny_model("llama")
    target = Target(model, feature_layers=(0, 2))
    recorder = FeatureRecorder(target)  # uniform marginals: drafted rounds commit about one token, so copying wins
    res = generate(target, REPEATING, DecodeConfig("taps+copy", budget=8, max_new_tokens=40, stop_ids=()), recorder,
                   profile=PROFILE)  # fmt: skip
    # every round drafts or copies, but a last round that may commit one token only does neither
    assert res.stats.copy_rounds > 0 and 0 <= res.stats.rounds - len(recorder.calls) - res.stats.copy_rounds <= 1
    assert recorder.got_each_token_once()
