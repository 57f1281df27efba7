"""Pausing speculation (`+pause`, taps.gate): the gate's decisions on synthetic round times, then
the loop on tiny targets: rounds skipped in any pattern stay lossless, the drafter still gets every
committed token's features once, and a copy planner learns nothing from rounds it did not propose."""

import pytest

import taps.methods
from taps.decode import DecodeConfig, generate
from taps.drafters import TEST_DRAFTERS, load_drafter
from taps.drafters.grown import GrownConfig, GrownDrafter
from taps.gate import Gate
from taps.rounds import Rollout
from taps.target import Target
from tiny import FeatureRecorder, hf_greedy, tiny_model

PROMPT = [5, 17, 33, 2, 9, 41]
PLAIN = (1, 0.10)  # a plain round: 1 token in 0.1 s


def drive(gate: Gate, drafted_round, rounds: int) -> list[bool]:
    """Run `rounds` rounds: drafted_round(i) gives round i's (tokens, seconds) when it drafts."""
    kinds = []
    for i in range(rounds):
        drafted = gate.drafts()
        gate.observe(drafted, *(drafted_round(i) if drafted else PLAIN))
        kinds.append(drafted)
    return kinds


def test_where_drafting_wins_one_plain_round_is_all_it_costs():
    kinds = drive(Gate(), lambda i: (3, 0.2), 200)  # 15 tokens/s against 10
    assert kinds[:4] == [True, True, True, False]  # warm-up, then the one measured plain round
    assert kinds.count(False) == 1


def test_where_drafting_loses_it_pauses_and_probes_ever_more_rarely():
    kinds = drive(Gate(), lambda i: (1.5, 0.2), 200)  # 7.5 tokens/s against 10
    probes = [i for i, k in enumerate(kinds) if k and i > 3]  # round 3 was the measured plain round
    gaps = [b - a - 1 for a, b in zip([3] + probes, probes)]
    assert gaps[:4] == [4, 8, 16, 32] and set(gaps[4:]) == {32}
    assert kinds.count(True) <= 3 + 8


def test_it_resumes_when_the_text_turns_predictable():
    gate = Gate()
    drive(gate, lambda i: (1.2, 0.2), 100)
    assert gate.paused
    kinds = drive(gate, lambda i: (5, 0.2), 100)  # 25 tokens/s: the next probe resumes
    first = kinds.index(True)
    assert first <= gate.max_wait and all(kinds[first:])


def test_near_equal_rates_do_not_flip_it_back_and_forth():
    kinds = drive(Gate(), lambda i: (1.95 if i % 2 else 2.0, 0.2), 200)  # 9.75-10 tokens/s against 10
    assert kinds.count(False) == 1  # slower, but within the margin: drafting goes on
    kinds = drive(Gate(margin=0.0), lambda i: (1.95 if i % 2 else 2.0, 0.2), 200)
    assert kinds.count(False) > 100  # the control: without a margin it pauses


@pytest.mark.parametrize("bad", [dict(decay=1.0), dict(margin=-0.1), dict(warmup=0), dict(first_wait=40)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="need 0 <= decay"):
        Gate(**bad)


class Scripted(Gate):
    """Drafts on a fixed pattern: round i drafts when pattern[i % len(pattern)]."""

    pattern = (True, False, False, True, True, False)

    def __post_init__(self):
        super().__post_init__()
        self.i = -1

    def drafts(self) -> bool:
        self.i += 1
        return self.pattern[self.i % len(self.pattern)]


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(taps.methods, "Gate", Scripted)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("drafter", list(TEST_DRAFTERS))
@pytest.mark.parametrize("method", ["chain+pause", "ddtree+pause", "taps+pause", "taps+copy+pause"])
def test_skipped_rounds_stay_lossless(scripted, drafter, method):
    model = tiny_model("llama")
    target = Target(model, feature_layers=(0, 2))
    cfg = DecodeConfig(method=method, budget=8, max_new_tokens=40, stop_ids=())
    res = generate(target, PROMPT, cfg, load_drafter(drafter, target, block_len=6))
    assert res.token_ids == hf_greedy(model, PROMPT, 40)
    assert res.stats.tree_sizes.count(0) >= res.stats.rounds // 3  # the pattern's plain rounds happened


def test_a_grown_drafter_catches_up_after_skipped_rounds(scripted):
    model = tiny_model("qwen2", seed=0)
    tgt = Target(model)
    drafter = GrownDrafter(model, GrownConfig("base", 95, block_size=4), tgt)  # the target as its own base
    for method in ("chain+pause", "chain+pause+rollout"):
        cfg = DecodeConfig(method, budget=12, max_new_tokens=40, stop_ids=(), rollout=Rollout(reach=0.0))
        res = generate(tgt, [5, 17, 33, 2], cfg, drafter)
        assert res.token_ids == hf_greedy(model, [5, 17, 33, 2], 40), method
        assert 0 in res.stats.tree_sizes, method  # rounds were skipped
        if "rollout" in method:  # the rollout walks the target's own greedy path from the whole context, caught up
            drafted = [a for a, n in zip(res.stats.accepted_per_round, res.stats.tree_sizes) if n > 0]
            assert drafted[:-1] == [12] * (len(drafted) - 1), method


def test_a_paused_round_keeps_the_features_for_the_next_draft(scripted):
    model = tiny_model("llama")
    target = Target(model, feature_layers=(0, 2))
    recorder = FeatureRecorder(target)
    res = generate(target, PROMPT, DecodeConfig("chain+pause", budget=8, max_new_tokens=30, stop_ids=()), recorder)
    assert 0 < len(recorder.calls) < res.stats.rounds
    assert recorder.got_each_token_once()


def test_pausing_applies_to_every_tree_policy():
    assert taps.methods.Method.parse("taps+copy+pause").options == {"copy", "pause"}
    assert str(taps.methods.Method.parse("ddtree+pause+copy")) == "ddtree+copy+pause"
    with pytest.raises(ValueError, match="does not apply to ar"):
        taps.methods.Method.parse("ar+pause")
