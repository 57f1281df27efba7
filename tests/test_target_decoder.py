"""A quantized target (taps.weightonly switches it to row-wise attention) walks its layers through
taps.decoder (taps.target): prefill, tree forwards, the features a drafter reads and the
cache after commits must be transformers' own forward's, bit for bit, so that switching the path
changes the time and never a token."""

import copy

import pytest
import torch

from taps.target import Target
from taps.tree import Tree
from taps.weightonly import quantize_weights
from test_weightonly import RUNNABLE
from tiny import tiny_model

PROMPT = list(range(3, 20))
FEATURES = (0, 2)  # the tiny models' first and last layers


def branching(root: int, n: int, seed: int) -> Tree:
    """A tree of n nodes whose every node hangs under a random earlier one (siblings and depths mixed)."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return Tree.from_lists([root] + torch.randint(3, 90, (n - 1,), generator=g).tolist(), parents)


def pair(scheme: str, family: str) -> tuple[Target, Target]:
    model = quantize_weights(copy.deepcopy(tiny_model(family)), scheme)
    fast, slow = Target(model, feature_layers=FEATURES), Target(model, feature_layers=FEATURES)
    if fast.decoder is None:
        pytest.skip("taps' row-wise attention kernel does not build here: quantized targets keep transformers' forward")
    slow.decoder = None
    return fast, slow


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("scheme", RUNNABLE)
def test_a_quantized_targets_own_walk_gives_transformers_bits(scheme, family):
    fast, slow = pair(scheme, family)
    assert torch.equal(fast.prefill(PROMPT), slow.prefill(PROMPT))
    root = PROMPT[-1]
    for seed, keep in ((0, [0, 2, 5]), (1, [0, 1]), (2, [0])):  # a path off the first branch, a chain's, the root's
        tree = branching(root, 8, seed)
        got, want = fast.forward_tree(tree), slow.forward_tree(tree)
        assert torch.equal(got.logits, want.logits) and torch.equal(got.features, want.features)
        for target in (fast, slow):
            target.commit(keep, tree.n_nodes)
        root = int(tree.tokens[keep[-1]])
    assert fast.n_cached == slow.n_cached and fast.cached_ids == slow.cached_ids
    for i, layer in enumerate(slow.cache.layers):
        assert torch.equal(fast.cache.keys[i, :, : fast.n_cached], layer.keys[0])
        assert torch.equal(fast.cache.values[i, :, : fast.n_cached], layer.values[0])


def test_the_walk_reads_each_nodes_own_position_and_ancestors():
    """Negative controls: the same tree fed at the rows' slots (a chain's positions) or causally (every
    earlier node an ancestor) gives other logits, so the test above sees positions and masks."""
    fast, _ = pair("int8", "llama")
    fast.prefill(PROMPT)
    tree = branching(PROMPT[-1], 8, 0)
    want = fast.forward_tree(tree).logits
    for kwargs in ({"mask": fast.tree_mask(tree)}, {"positions": fast.n_cached + tree.depths}):
        fast.cache.length = fast.n_cached
        x, _ = fast.decoder.walk(tree.tokens, fast.cache, **kwargs)
        assert not torch.equal(fast.decoder.logits(x).float(), want)
