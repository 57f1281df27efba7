import itertools
import math

import pytest
import torch

from taps.policies import POLICIES, chain, ddtree


def random_marginals(depth, vocab, seed, sharp=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(depth, vocab, generator=g), dim=-1)


def path_scores(tree, marginals):
    """log Q of every drafted node's path."""
    logq = torch.log(marginals)
    out = [0.0]
    for i in range(1, tree.n_nodes):
        p = int(tree.parents[i])
        out.append(out[p] + float(logq[int(tree.depths[i]) - 1, int(tree.tokens[i])]))
    return out[1:]


@pytest.mark.parametrize("name", [n for n, p in POLICIES.items() if p.needs_draft])
@pytest.mark.parametrize("budget", [1, 3, 8, 40])
def test_every_policy_gives_a_valid_tree_within_budget(name, budget):
    m = random_marginals(6, 20, seed=budget)
    tree = POLICIES[name].select(m, 7, budget)  # Tree validates prefix closure itself
    assert 1 <= tree.n_draft <= budget
    assert int(tree.tokens[0]) == 7
    assert int(tree.depths.max()) <= 6
    for kids in tree.children():  # no duplicate siblings: a duplicate would waste a node
        toks = tree.tokens[kids].tolist()
        assert len(toks) == len(set(toks))


def test_chain_is_argmax_path_cut_at_budget():
    m = random_marginals(5, 11, seed=1)
    tree = chain(m, 3, 4)
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
    got = sorted(path_scores(ddtree(m, 0, budget), m), reverse=True)
    assert len(got) == min(budget, len(scores))
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(got, best))


def test_ddtree_with_no_depth_is_root_only():
    assert ddtree(torch.empty(0, 9), 4, 8).n_nodes == 1
