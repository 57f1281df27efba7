"""Temperature > 0: speculative output must follow the target's own distribution exactly."""


import pytest
import torch

import taps.methods
from stats import chi_square_pvalue
from taps.costmodel import LatencyProfile, ProfileInfo
from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter
from taps.drafters.grown import GrownConfig, GrownDrafter
from taps.drafters.sibling import load_sibling
from taps.gate import Gate
from taps.target import Target
from taps.tree import Tree
from taps.verify import SamplingConfig
from tiny import tiny_model

VOCAB = 8
PROMPT = [1, 4, 2]
N_RUNS = 1000


@pytest.fixture(scope="module")
def model():
    # a small vocabulary, so the joint law of the first two tokens (64 outcomes) can be enumerated
    return tiny_model("llama", vocab=VOCAB, seed=3)


def exact_two_token_law(model, sampling):
    with torch.inference_mode():
        first = sampling.probs(model(torch.tensor([PROMPT], device=model.device)).logits[0, -1:])[0]
        law = {}
        for a in range(VOCAB):
            second = sampling.probs(model(torch.tensor([PROMPT + [a]], device=model.device)).logits[0, -1:])[0]
            for b in range(VOCAB):
                law[(a, b)] = float(first[a] * second[b])
    return law


@pytest.mark.parametrize(
    "sampling,drafter,method",
    [
        (SamplingConfig(1.0), "noisy", "ddtree"),  # partly accepted trees
        (SamplingConfig(1.0), "oracle", "chain"),  # the greedy path, often rejected when sampling
        (SamplingConfig(0.8, top_k=5, top_p=0.9), "noisy", "chain"),
        (SamplingConfig(1.0), "noisy", "taps"),
        (SamplingConfig(1.0), "grown", "taps+rollout"),  # rolls out the target's own greedy path
        (SamplingConfig(0.8, top_k=5, top_p=0.9), "grown", "chain+rollout"),
        (SamplingConfig(1.0), "sibling", "taps"),  # another model's greedy path, used as it is
    ],
)
@pytest.mark.slow  # 1,000 generations per case
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_first_tokens_follow_the_target_distribution(model, sampling, drafter, method):
    target = Target(model)
    if drafter == "grown":  # a grown drafter whose base is the target itself, mask token 7
        d = GrownDrafter(model, GrownConfig("target", VOCAB - 1, block_size=3), target)
    elif drafter == "sibling":  # a sibling: another model of the same vocabulary, no training
        d = load_sibling(tiny_model("llama", vocab=VOCAB, seed=4), target, block_len=3, min_reach=0.0)
    else:
        d = load_drafter(drafter, target, block_len=3)
    law = exact_two_token_law(model, sampling)
    samples, accepted = [], 0
    for seed in range(N_RUNS):
        cfg = DecodeConfig(method, budget=4, max_new_tokens=2, sampling=sampling, stop_ids=(), seed=seed)
        res = generate(target, PROMPT, cfg, d)
        samples.append(tuple(res.token_ids))
        accepted += res.stats.accepted_per_round[0]
    assert accepted > N_RUNS * 0.1  # the drafts were really used, not all rejected
    assert chi_square_pvalue(samples, law) > 1e-3


def second_and_third_token_law(model, prompt, sampling):
    """The law of generated tokens 2 and 3 after `prompt`, marginal over the first."""
    with torch.inference_mode():
        law: dict = {}
        p1 = sampling.probs(model(torch.tensor([prompt])).logits[0, -1:])[0]
        for a in range(VOCAB):
            p2 = sampling.probs(model(torch.tensor([prompt + [a]])).logits[0, -1:])[0]
            for b in range(VOCAB):
                p3 = sampling.probs(model(torch.tensor([prompt + [a, b]])).logits[0, -1:])[0]
                for c in range(VOCAB):
                    law[(b, c)] = law.get((b, c), 0.0) + float(p1[a] * p2[b] * p3[c])
    return law


def sample_second_and_third(target, prompt, method, drafter, sampling, **kw):
    """N_RUNS seeded generations of 3 tokens: their 2nd and 3rd tokens, and each run's stats."""
    samples, stats = [], []
    for seed in range(N_RUNS):
        cfg = DecodeConfig(method, budget=4, max_new_tokens=3, sampling=sampling, stop_ids=(), seed=seed)
        res = generate(target, prompt, cfg, drafter, **kw)
        samples.append(tuple(res.token_ids[1:]))
        stats.append(res.stats)
    return samples, stats


@pytest.mark.slow  # 1,000 generations
def test_copy_rounds_follow_the_target_distribution(model):
    """taps+copy at T=1: after a drafted round that commits one token, the second round verifies
    the n-gram continuation of a repeating prompt alone. The law of the tokens that round decides
    (the 2nd and 3rd, marginal over the 1st) must be the target's."""
    # "6 4 a" occurred before for every token a, so whatever the first round commits after the
    # prompt's "6 4", the context's last 3-gram recurs and has a continuation
    prompt = [t for a in range(VOCAB) for t in (6, 4, a, (3 * a + 1) % VOCAB)] + [6, 4]
    sampling = SamplingConfig(1.0)
    info = ProfileInfo(target="t", dtype="float32", cpu="c", torch="2", threads=1, context_lengths=(8,), repeats=3)
    profile = LatencyProfile((0, 64), (1.0, 1.64), draft_seconds=1.0, info=info)  # drafting doubles a round
    law = second_and_third_token_law(model, prompt, sampling)
    target = Target(model)
    d = load_drafter("random", target, block_len=3)
    samples, stats = sample_second_and_third(target, prompt, "taps+copy", d, sampling, profile=profile)
    assert sum(s.copy_rounds for s in stats) > N_RUNS * 0.3  # copy rounds really decided those tokens often
    assert chi_square_pvalue(samples, law) > 1e-3


@pytest.mark.slow  # 1,000 generations
def test_a_draft_after_a_paused_round_follows_the_target_distribution(model, monkeypatch):
    """taps+pause at T=1 with the gate forced to pause the first round: the second round drafts
    after a plain one (the drafter catching up on its features). The law of the tokens it decides
    (the 2nd and 3rd, marginal over the 1st) must be the target's."""
    class PauseFirst(Gate):
        def drafts(self) -> bool:
            return self.rounds > 0

    monkeypatch.setattr(taps.methods, "Gate", PauseFirst)
    sampling = SamplingConfig(1.0)
    law = second_and_third_token_law(model, PROMPT, sampling)
    target = Target(model)
    d = load_drafter("noisy", target, block_len=3)
    samples, stats = sample_second_and_third(target, PROMPT, "taps+pause", d, sampling)
    assert all(s.tree_sizes[0] == 0 for s in stats)  # the first round was paused
    assert sum(s.accepted_per_round[1] for s in stats) > N_RUNS * 0.1  # the second round's draft was really used
    assert chi_square_pvalue(samples, law) > 1e-3


def biased_token_level_accept(q_child: float, p: torch.Tensor, child: int, gen) -> int:
    """The rule docs/method.md forbids for deterministically chosen children: accept the drafted child
    with min(1, p/q) where q is its marginal, else resample from the target."""
    if torch.rand((), generator=gen) < min(1.0, float(p[child]) / q_child):
        return child
    return int(torch.multinomial(p, 1, generator=gen))


def test_the_statistical_test_catches_a_biased_verifier(model):
    """The same check, applied to the biased rule on the same target distribution, must fail:
    otherwise passing it would prove nothing."""
    sampling = SamplingConfig(1.0)
    p = sampling.probs(model(torch.tensor([PROMPT])).logits[0, -1:])[0].detach()  # [vocab]
    child = int(p.argmax())  # a deterministic draft: the most likely token, marginal 0.6
    gen = torch.Generator().manual_seed(0)
    biased = [biased_token_level_accept(0.6, p, child, gen) for _ in range(N_RUNS)]
    law = {a: float(p[a]) for a in range(VOCAB)}
    assert chi_square_pvalue(biased, law) < 1e-3
    # and predraw-and-follow on that same one-node tree passes
    from taps.verify import verify

    tree = Tree.from_lists([PROMPT[-1], child], [-1, 0])
    logits = model(torch.tensor([PROMPT + [child]])).logits[0, -2:].detach()
    fair = [
        (lambda v: tree.tokens[v.accepted[0]].item() if v.accepted else v.bonus)(verify(tree, logits, sampling, gen))
        for _ in range(N_RUNS)
    ]
    assert chi_square_pvalue(fair, law) > 1e-3
