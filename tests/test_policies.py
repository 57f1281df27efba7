import itertools
import math
import warnings

import pytest
import torch

from marginals import random_marginals
from taps.costmodel import LatencyProfile, ProfileInfo, default_profile
from taps.lookup import ngram_continuations
from taps.methods import Method
from taps.policies import (
    POLICIES,
    CandidatePath,
    CostAwareConfig,
    Proposal,
    TapsConfig,
    build_pool,
    chain,
    cost_aware,
    ddtree,
    default_config,
    taps,
)
from taps.scorer import Source


def path_scores(tree, marginals):
    """log Q of every drafted node's path."""
    logq = torch.log(marginals)
    out = [0.0]
    for i in range(1, tree.n_nodes):
        p = int(tree.parents[i])
        out.append(out[p] + float(logq[int(tree.depths[i]) - 1, int(tree.tokens[i])]))
    return out[1:]


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("budget", [1, 3, 8, 40])
def test_every_policy_gives_a_valid_tree_within_budget(name, budget):
    m = random_marginals(6, 20, seed=budget)
    tree = POLICIES[name].select(Proposal(7, m), budget)  # Tree validates prefix closure itself
    assert 1 <= tree.n_draft <= budget
    assert int(tree.tokens[0]) == 7
    assert int(tree.depths.max()) <= 6
    for kids in tree.children():  # no duplicate siblings: a duplicate would waste a node
        toks = tree.tokens[kids].tolist()
        assert len(toks) == len(set(toks))


def test_chain_is_argmax_path_cut_at_budget():
    m = random_marginals(5, 11, seed=1)
    tree = chain(Proposal(3, m), 4)
    assert tree.tokens.tolist() == [3] + m.argmax(-1)[:4].tolist()
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 2, 5, 12, 30])
def test_ddtree_equals_brute_force_top_b_prefixes(seed, budget):
    depth, vocab = 3, 5
    m = random_marginals(depth, vocab, seed)
    logq = torch.log(m)
    # every prefix of every length, scored by the product of its marginals
    scores = []
    for d in range(1, depth + 1):
        for path in itertools.product(range(vocab), repeat=d):
            scores.append(sum(float(logq[i, t]) for i, t in enumerate(path)))
    best = sorted(scores, reverse=True)[:budget]
    got = sorted(path_scores(ddtree(Proposal(0, m), budget), m), reverse=True)
    assert len(got) == min(budget, len(scores))
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(got, best))


def test_ddtree_with_no_depth_is_root_only():
    assert ddtree(Proposal(4, torch.empty(0, 9)), 8).n_nodes == 1


# ---- cost-aware (CaDDTree) and taps (TAPS) -------------------------------------------------

INFO = ProfileInfo(target="t", dtype="float32", cpu="c", torch="2", threads=1, context_lengths=(8,), repeats=1)
# a hand-made curve under which the best size varies between 4 and 30 nodes in these tests:
# a 0.5 s draft, 1 s to verify the root alone, +0.025 s per node up to 4 nodes, then +0.073 s per node
STEP = LatencyProfile((0, 4, 30), (1.0, 1.1, 3.0), 0.5, INFO)


def paths(tree):
    toks, out = tree.tokens.tolist(), set()
    for i in range(1, tree.n_nodes):
        out.add(tuple(toks[j] for j in tree.path_to(i)[1:]))
    return out


def throughput_argmax(profile, gains):
    rates = [(1 + sum(gains[:n])) / (profile.draft_seconds + profile.t_verify(n)) for n in range(len(gains) + 1)]
    return max(range(len(rates)), key=rates.__getitem__)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sharp", [1.0, 3.0, 6.0])
def test_cost_aware_cuts_ddtree_at_the_throughput_maximising_size(seed, sharp):
    m = random_marginals(6, 20, seed, sharp)
    full = ddtree(Proposal(1, m), 30)
    gains = [math.exp(s) for s in path_scores(full, m)]  # Q of each node, in best-first order
    best = throughput_argmax(STEP, gains)
    tree = cost_aware(Proposal(1, m), 30, config=CostAwareConfig(profile=STEP))
    assert tree.n_draft == best
    assert paths(tree) == paths(ddtree(Proposal(1, m), best))


def test_cost_aware_grows_with_cheaper_verification():
    m = random_marginals(6, 20, 0, sharp=1.0)
    flat = LatencyProfile((0, 100), (1.0, 1.0), 0.0, INFO)  # verification cost independent of size
    steep = LatencyProfile((0, 1), (1.0, 2.0), 0.0, INFO)  # every node doubles the cost
    assert cost_aware(Proposal(1, m), 25, config=CostAwareConfig(profile=flat)).n_draft == 25  # capped at budget
    assert cost_aware(Proposal(1, m), 25, config=CostAwareConfig(profile=steep)).n_draft == 0


@pytest.mark.parametrize("policy", ["cost-aware", "taps"])
def test_the_profile_is_read_at_the_rounds_context(policy):
    """Short contexts verify big trees almost for free, long ones pay per node: the same marginals
    give a full tree after a short context and a smaller one after a long one."""
    m = random_marginals(6, 20, 0, sharp=1.0)
    rows = ((1.0, 1.0), (1.0, 3.0))  # [context 100, 1000][size 0, 25]
    info = ProfileInfo(target="t", dtype="float32", cpu="c", torch="2", threads=1, context_lengths=(100, 1000),
                       repeats=1, verify_by_context=rows)  # fmt: skip
    select = POLICIES[policy].configure(profile=LatencyProfile((0, 25), (1.0, 2.0), 0.0, info))
    short, long = select(Proposal(1, m, context=100), 25), select(Proposal(1, m, context=1000), 25)
    assert short.n_draft == 25 and long.n_draft < 25
    at_long = POLICIES[policy].configure(profile=LatencyProfile((0, 25), rows[1], 0.0, INFO))  # measured there alone
    assert paths(long) == paths(at_long(Proposal(1, m, context=1000), 25))


class RandomScorer:
    """q_cond in [0, 1], unrelated to the marginals; some edges certain (q_cond = 1)."""

    def __init__(self, seed):
        self.seed = seed

    def q_cond(self, pool, marginals):
        g = torch.Generator().manual_seed(self.seed)
        q = torch.rand(pool.n, generator=g)
        q[torch.rand(pool.n, generator=g) < 0.2] = 1.0
        q[0] = 1.0
        return q


def pool_paths_and_reach(pool, q):
    """Per pool node: its token path and q_reach = prod of q_cond along it."""
    tokens, parents = pool.tokens.tolist(), pool.parents.tolist()
    path, reach = [()], [1.0]
    for v in range(1, pool.n):
        path.append(path[parents[v]] + (tokens[v],))
        reach.append(reach[parents[v]] * float(q[v]))
    return path, reach


def literal_greedy(pool, q, budget, lambda1, lambda2, threshold):
    """docs/method.md 3.4d word for word: take the best-utility node of the whole pool with its
    missing ancestors, until N_max or the best utility falls under the threshold."""
    parents, depths = pool.parents.tolist(), pool.depths.tolist()
    path, reach = pool_paths_and_reach(pool, q)
    utility = [reach[v] / (lambda1 + lambda2 * depths[v]) for v in range(pool.n)]
    admitted = {0}
    while len(admitted) - 1 < budget:
        rest = [v for v in range(1, pool.n) if v not in admitted]
        if not rest:
            break
        best = max(rest, key=lambda v: (utility[v], -v))
        if utility[best] < threshold:
            break
        chain = []
        while best not in admitted:
            chain.append(best)
            best = parents[best]
        if len(admitted) - 1 + len(chain) > budget:
            break
        admitted.update(chain)
    return {path[v] for v in admitted - {0}}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("lambdas", [(1.0, 0.0), (1.0, 0.5), (0.2, 2.0)])
@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.3])
def test_taps_greedy_keeps_ancestors_and_equals_the_literal_rule(seed, lambdas, threshold):
    m = random_marginals(5, 15, seed)
    cfg = TapsConfig(k=5, pool_size=40, scorer=RandomScorer(seed), lambda1=lambdas[0], lambda2=lambdas[1],
                     threshold=threshold, throughput=False)
    budget = 12
    tree = taps(Proposal(2, m), budget, config=cfg)  # Tree itself refuses a node whose parent is missing
    pool = build_pool(m, 2, 5, 40)
    assert paths(tree) == literal_greedy(pool, RandomScorer(seed).q_cond(pool, m), budget, *lambdas, threshold)
    assert tree.n_draft <= budget


def test_taps_respects_n_max_and_the_utility_threshold():
    m = random_marginals(6, 20, 3, sharp=2.0)
    assert taps(Proposal(0, m), 5, config=TapsConfig(throughput=False)).n_draft == 5
    assert taps(Proposal(0, m), 40, config=TapsConfig(throughput=False)).n_draft == 40
    sizes = []
    for threshold in (0.01, 0.03, 0.1):
        tree = taps(Proposal(0, m), 40, config=TapsConfig(k=20, throughput=False, threshold=threshold))
        q = [math.exp(s) for s in path_scores(tree, m)]  # marginal scorer: q_reach = Q, utility = Q
        assert min(q) >= threshold
        # the best node left out (DDTree's next one) is under the threshold, unless N_max stopped first
        bigger = ddtree(Proposal(0, m), tree.n_draft + 1)
        assert paths(tree) < paths(bigger)
        assert tree.n_draft == 40 or max(path_scores(bigger, m)[-1:]) < math.log(threshold)
        sizes.append(tree.n_draft)
    assert sizes[0] >= sizes[1] >= sizes[2] and sizes[2] < 40
    assert taps(Proposal(0, m), 40, config=TapsConfig(throughput=False, threshold=1.1)).n_nodes == 1


def test_depth_cost_makes_trees_shallower():
    m = random_marginals(8, 20, 4, sharp=4.0)
    flat = taps(Proposal(0, m), 24, config=TapsConfig(throughput=False))
    costly = taps(Proposal(0, m), 24, config=TapsConfig(throughput=False, lambda2=5.0))
    assert float(costly.depths.float().mean()) < float(flat.depths.float().mean())


@pytest.mark.parametrize("seed", range(6))
def test_taps_throughput_cut_maximises_modelled_tokens_per_second(seed):
    m = random_marginals(6, 20, seed, sharp=2.0)
    scorer = RandomScorer(seed)
    order = taps(Proposal(1, m), 30, config=TapsConfig(scorer=scorer, throughput=False))
    pool = build_pool(m, 1, 8, 128)
    reach = dict(zip(*pool_paths_and_reach(pool, scorer.q_cond(pool, m))))  # path -> q_reach
    gains = [reach[tuple(order.tokens[order.path_to(i)[1:]].tolist())] for i in range(1, order.n_nodes)]
    tree = taps(Proposal(1, m), 30, config=TapsConfig(scorer=scorer, profile=STEP))
    best = throughput_argmax(STEP, gains)
    assert tree.n_draft == best
    assert tree.tokens.tolist() == order.tokens[: best + 1].tolist()  # a prefix of the greedy order


@pytest.mark.parametrize("seed", range(4))
def test_taps_with_marginal_scores_is_cost_aware(seed):
    m = random_marginals(6, 20, seed, sharp=2.0)
    got = taps(Proposal(1, m), 20, config=TapsConfig(k=20, profile=STEP))
    assert paths(got) == paths(cost_aware(Proposal(1, m), 20, config=CostAwareConfig(profile=STEP)))


def test_missing_profile_is_announced_once_and_a_given_one_is_silent():
    with pytest.warns(UserWarning, match=r"cost-aware: no LatencyProfile given; using taps\.costmodel\.default_profile\(\)"):
        assert CostAwareConfig().profile == default_profile()
    with pytest.warns(UserWarning, match=r"taps: no LatencyProfile given; using taps\.costmodel\.default_profile\(\)"):
        TapsConfig()
    default_config.cache_clear()
    m = random_marginals(4, 10, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            POLICIES["taps"].select(Proposal(0, m), 8)
            POLICIES["cost-aware"].select(Proposal(0, m), 8)
    assert sorted(str(w.message).split(":")[0] for w in caught) == ["cost-aware", "taps"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        POLICIES["taps"].configure(profile=STEP)(Proposal(0, m), 8)
        POLICIES["cost-aware"].configure(profile=STEP)(Proposal(0, m), 8)
        POLICIES["taps"].configure(throughput=False)(Proposal(0, m), 8)


def test_configure_binds_validated_options():
    m = random_marginals(6, 20, 5)
    select = POLICIES["taps"].configure(throughput=False, lambda2=5.0)
    assert paths(select(Proposal(0, m), 10)) == paths(taps(Proposal(0, m), 10, config=TapsConfig(throughput=False, lambda2=5.0)))
    assert paths(POLICIES["ddtree"].configure()(Proposal(0, m), 10)) == paths(ddtree(Proposal(0, m), 10))
    with pytest.raises(ValueError, match="takes no options"):
        POLICIES["ddtree"].configure(profile=STEP)
    with pytest.raises(TypeError):
        POLICIES["taps"].configure(lamda2=1.0)
    for bad in (dict(k=0), dict(pool_size=0), dict(lambda1=0.0), dict(lambda2=-1.0), dict(threshold=-0.1),
                dict(scorer=object()), dict(profile=STEP)):  # a profile is unused without throughput
        with pytest.raises(ValueError):
            TapsConfig(throughput=False, **bad)


class TrustLookup:
    def q_cond(self, pool, marginals):
        return torch.where(pool.sources == Source.LOOKUP, 1.0, pool.logq.exp())


def test_extra_candidate_paths_join_the_pool_with_their_source():
    m = random_marginals(4, 10, 6)
    top = m.argmax(-1).tolist()
    lookup = [CandidatePath((top[0], 9 if top[1] != 9 else 8, 3, 3, 3, 3)), CandidatePath((top[0], top[1]))]
    pool = build_pool(m, 5, 2, 6, lookup)
    plain = build_pool(m, 5, 2, 6)
    assert pool.n == plain.n + 3  # top[0] is shared; the path is cut at depth 4; the 2nd path exists already
    assert torch.equal(pool.tokens[: plain.n], plain.tokens)
    assert pool.sources[: plain.n].tolist() == [Source.DRAFTER] * plain.n
    assert pool.sources[plain.n :].tolist() == [Source.LOOKUP] * 3
    new = torch.arange(plain.n, pool.n)
    assert torch.allclose(pool.logq[new], m[pool.depths[new] - 1, pool.tokens[new]].log())
    pairs = list(zip(pool.parents.tolist(), pool.tokens.tolist()))
    assert len(pairs) == len(set(pairs))  # no parent has two children with one token
    trust_lookup = TrustLookup()  # the source is visible to scorers
    tree = taps(Proposal(5, m, paths=tuple(lookup)), 4, config=TapsConfig(k=2, pool_size=6, scorer=trust_lookup, throughput=False))
    assert paths(tree) == {lookup[0].tokens[:d] for d in range(1, 5)}
    with pytest.raises(ValueError, match="outside"):
        build_pool(m, 5, 2, 6, [CandidatePath((10,))])


def test_ngram_lookup_finds_earlier_continuations():
    ctx = [1, 2, 3, 7, 8, 9, 4, 2, 3, 5, 6, 0, 1, 2, 3]
    assert ngram_continuations(ctx, n=2, max_len=3) == [[5, 6, 0], [7, 8, 9]]  # most recent first
    assert ngram_continuations(ctx, n=2, max_len=3, max_paths=1) == [[5, 6, 0]]
    assert ngram_continuations(ctx, n=3, max_len=2) == [[7, 8]]
    assert ngram_continuations([4, 4, 4, 4, 4], n=2, max_len=2) == [[4], [4, 4]]  # overlaps, deduplicated
    assert ngram_continuations([1, 2, 3], n=3) == []
    assert ngram_continuations(ctx, n=4) == []


@pytest.mark.parametrize("name", ["ddtree", "cost-aware", "taps"])
def test_full_size_vocabulary(name):
    """Qwen2.5's 151,936-token vocabulary: only topk touches it."""
    m = random_marginals(15, 151_936, 0, sharp=8.0)
    tree = POLICIES[name].configure(**({} if name == "ddtree" else {"profile": default_profile()}))(Proposal(0, m), 32)
    assert 1 <= tree.n_draft <= 32


def test_method_options_configure_the_policy():
    m = random_marginals(6, 20, 7)

    class Flat:  # a scorer that would change the tree if the option did not drop it
        def q_cond(self, pool, marginals):
            return torch.full((pool.n,), 0.5)

    def selector(spec, scorer=None):
        return Method.parse(spec).build(NOISE_FREE, STEP, scorer)[1]

    plain = POLICIES["taps"].configure(profile=STEP)
    assert paths(selector("taps+no-scorer", Flat())(Proposal(0, m), 12)) == paths(plain(Proposal(0, m), 12))
    assert paths(selector("taps", Flat())(Proposal(0, m), 12)) != paths(plain(Proposal(0, m), 12))
    assert selector("taps+fixed")(Proposal(0, m), 12).n_draft == 12  # no throughput cut: the budget is filled
    assert Method.parse("taps+no-lookup").build(NOISE_FREE, STEP)[0].lookup is False
    assert Method.parse("taps").build(NOISE_FREE, STEP)[0].lookup is True
    assert str(Method.parse("taps+copy+rollout")) == "taps+copy+rollout" == str(Method.parse("taps+rollout+copy"))
    for bad, message in [("nope", "unknown method"), ("taps+bogus", "unknown method option"),
                         ("ddtree+fixed", "does not apply"), ("taps+copy+copy", "repeated")]:
        with pytest.raises(ValueError, match=message):
            Method.parse(bad)


class _Drafter:  # the parts of a drafter Method.build looks at
    block_len, vocab_size, feature_layers = 6, 20, ()


NOISE_FREE = _Drafter()
