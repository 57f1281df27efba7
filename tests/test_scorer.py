"""The TAPS edge scorer: shapes, the sibling + none law, training, save/load, and the
reduction to DDTree with marginal scores and no depth cost."""

import pytest
import torch

from marginals import random_marginals
from taps.drafters import shipped_scorer
from taps.policies import Proposal, TapsConfig, build_pool, ddtree, taps
from taps.scorer import (
    CandidatePool,
    EdgeFeatures,
    EdgeScorer,
    MarginalScorer,
    ScorerConfig,
    ScorerExample,
    ScorerLabels,
    depth_entropy,
    log_reach,
    scorer_loss,
    train_step,
)


def pool_and_features(seed, depth=4, vocab=30, k=4, n_pool=24):
    m = random_marginals(depth, vocab, seed)
    pool = build_pool(m, root=seed % vocab, k=k, n_pool=n_pool)
    return m, pool, EdgeFeatures.from_pool(pool, depth_entropy(m))


def perturbed_scorer(seed=0):
    """An EdgeScorer whose output layers are no longer zero (an untrained one equals the marginals)."""
    torch.manual_seed(seed)
    s = EdgeScorer(ScorerConfig(buckets=64, hidden=16))
    with torch.no_grad():
        for mlp in (s.edge_mlp, s.none_mlp):
            mlp[-1].weight.normal_(0, 0.5)
            mlp[-1].bias.normal_(0, 0.5)
    return s


def paths(tree):
    """The set of token paths of a tree's drafted nodes: trees equal up to node order."""
    toks, out = tree.tokens.tolist(), set()
    for i in range(1, tree.n_nodes):
        out.add(tuple(toks[j] for j in tree.path_to(i)[1:]))
    return out


def test_shapes_and_sibling_probabilities_with_none_sum_to_one():
    m, pool, f = pool_and_features(0)
    with torch.no_grad():
        log_q, log_none = perturbed_scorer()(f)
    assert log_q.shape == log_none.shape == (pool.n,)
    assert float(log_q[0]) == 0.0
    total = log_none.exp().index_add(0, pool.parents[1:], log_q[1:].exp())  # [n]: none + children, per parent
    assert total.tolist() == pytest.approx([1.0] * pool.n, abs=1e-5)
    q = perturbed_scorer().q_cond(pool, m)
    assert q.shape == (pool.n,) and bool(((q > 0) & (q <= 1)).all())


def test_untrained_scorer_is_the_marginal_scorer():
    m, pool, _ = pool_and_features(1)
    assert EdgeScorer().q_cond(pool, m).tolist() == pytest.approx(MarginalScorer().q_cond(pool, m).tolist(), abs=1e-6)


def test_hashed_token_embeddings_are_small():
    s = EdgeScorer(ScorerConfig(buckets=512))
    assert s.token_emb.weight.shape == (512, 16)
    f = pool_and_features(2, vocab=151_936)[2]  # ids far beyond the table still embed
    assert s(f)[0].shape == f.tokens.shape


def test_features_of_a_forest_match_each_pool():
    s = perturbed_scorer()
    parts = [pool_and_features(seed)[2] for seed in (3, 4)]
    joint = s(EdgeFeatures.concat(parts))[0]
    alone = torch.cat([s(f)[0] for f in parts])
    assert torch.allclose(joint, alone, atol=1e-6)


def test_log_reach_is_the_path_sum():
    _, pool, _ = pool_and_features(5)
    lq = torch.rand(pool.n).log().index_fill(0, torch.tensor([0]), 0.0)
    reach = log_reach(lq, pool.parents, pool.depths)
    parents = pool.parents.tolist()
    for v in range(1, pool.n):
        assert float(reach[v]) == pytest.approx(float(reach[parents[v]] + lq[v]), abs=1e-5)


def synthetic_example(seed, target_bias):
    """Labels from a made-up target that prefers tokens with an even id (a learnable pattern)."""
    m, pool, f = pool_and_features(seed)
    g = torch.Generator().manual_seed(100 + seed)
    logits = torch.randn(pool.n, generator=g) + target_bias * (pool.tokens % 2 == 0)
    target_prob = torch.sigmoid(logits - 2)  # the target's mass on each drafted child
    labelled = torch.rand(pool.n, generator=g) < 0.7
    accepted = (torch.rand(pool.n, generator=g) < target_prob).float()
    labels = ScorerLabels(target_prob, labelled, accepted, torch.ones(pool.n, dtype=torch.bool))
    return ScorerExample(f, labels)


def test_a_few_training_steps_reduce_the_loss():
    torch.manual_seed(0)
    scorer = EdgeScorer(ScorerConfig(buckets=64, hidden=16))
    batch = [synthetic_example(seed, 3.0) for seed in range(4)]
    opt = torch.optim.Adam(scorer.parameters(), lr=3e-2)
    first = train_step(scorer, opt, batch)
    for _ in range(30):
        last = train_step(scorer, opt, batch)
    assert set(first) == {"loss", "kl", "bce"}
    assert last["loss"] < 0.8 * first["loss"]


def test_loss_ignores_unknown_labels_and_is_zero_at_the_target():
    _, pool, f = pool_and_features(6)
    n = pool.n
    # a scorer that is exactly right: q_cond = target prob, none = rest
    target_prob = torch.full((n,), 0.1)
    counts = torch.zeros(n).index_add(0, pool.parents[1:], torch.ones(n - 1))
    log_q = torch.full((n,), 0.1).log().index_fill(0, torch.tensor([0]), 0.0)
    log_none = (1 - 0.1 * counts).log()
    labels = ScorerLabels(target_prob, torch.ones(n, dtype=torch.bool), torch.zeros(n), torch.zeros(n, dtype=torch.bool))
    loss = scorer_loss(log_q, log_none, f, labels)
    assert float(loss.kl) == pytest.approx(0.0, abs=1e-6) and float(loss.bce) == 0.0
    nan_labels = ScorerLabels(torch.full((n,), float("nan")), torch.zeros(n, dtype=torch.bool),
                              torch.full((n,), float("nan")), torch.zeros(n, dtype=torch.bool))
    log_q.requires_grad_(True)
    loss = scorer_loss(log_q, log_none, f, nan_labels)
    loss.total.backward()
    assert loss.total.item() == 0.0 and bool(torch.isfinite(log_q.grad).all())


def test_save_load_round_trip(tmp_path):
    m, pool, f = pool_and_features(7)
    s = perturbed_scorer()
    s.save(tmp_path / "scorer")
    assert sorted(p.name for p in (tmp_path / "scorer").iterdir()) == ["model.safetensors", "scorer.json"]
    loaded = EdgeScorer.load(tmp_path / "scorer")
    assert loaded.config == s.config
    assert torch.equal(loaded.q_cond(pool, m), s.q_cond(pool, m))


def test_a_drafter_folder_brings_its_scorer(tmp_path):
    """`taps` uses the scorer saved in the drafter's folder unless told otherwise."""
    assert shipped_scorer(str(tmp_path)) is None and shipped_scorer("noisy") is None and shipped_scorer(None) is None
    perturbed_scorer().save(tmp_path / "scorer")
    assert shipped_scorer(str(tmp_path)) == str(tmp_path / "scorer")


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 4, 9, 20])
@pytest.mark.parametrize("scorer", [MarginalScorer(), EdgeScorer()], ids=["marginal", "untrained"])
def test_taps_with_marginal_scores_and_no_depth_cost_is_ddtree(seed, budget, scorer):
    """The issue's required check: scores = marginals, lambda2 = 0, no throughput cut ->
    the same node set as DDTree with the same budget (K and N_pool large enough to hold it)."""
    m = random_marginals(5, 12, seed)
    cfg = TapsConfig(k=12, pool_size=60, scorer=scorer, lambda2=0.0, throughput=False)
    assert paths(taps(Proposal(3, m), budget, config=cfg)) == paths(ddtree(Proposal(3, m), budget))


def test_candidate_pool_validates_lengths():
    with pytest.raises(ValueError):
        CandidatePool(torch.tensor([1, 2]), torch.tensor([-1]), torch.tensor([0, 1]), torch.tensor([0, 0]), torch.zeros(2))
