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
    """The quantized model through the Python walk (its layers unfused) and through transformers' forward."""
    model = quantize_weights(copy.deepcopy(tiny_model(family)), scheme)
    fast, slow = Target(model, feature_layers=FEATURES), Target(model, feature_layers=FEATURES)
    if fast.decoder is None:
        pytest.skip("taps' row-wise attention kernel does not build here: quantized targets keep transformers' forward")
    fast.decoder.fused = None
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


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_w4a8_targets_fused_layers_give_a_tree_row_its_paths_own_bits(family, dtype):
    """taps.layer (a w4a8 target's layers in one C++ call each) computes every row alone: a tree's rows, its
    features and the cache it commits are the bits of its kept path fed as a chain, and each row of that chain
    the bits of its token fed alone, round after round (what lossless verification needs, docs/method.md
    section 10); and the logits stay near the Python walk's (another float order of the same model)."""
    from taps import layer
    from taps.weightonly import w4a8_kernel

    if w4a8_kernel() != "vnni" or layer.load() is not None:
        pytest.skip("taps.layer needs taps.vnni's w4a8 kernel")
    model = quantize_weights(copy.deepcopy(tiny_model(family)).to(dtype), "w4a8")
    tree_way, chain_way, alone_way, walk = (Target(model, feature_layers=FEATURES) for _ in range(4))
    if tree_way.decoder is None or tree_way.decoder.fused is None:
        pytest.skip("taps' row-wise attention kernel does not build here")
    walk.decoder.fused = None
    if "w8a8" in RUNNABLE:  # only w4a8 on taps.vnni fuses: a w8a8 target walks
        assert Target(quantize_weights(copy.deepcopy(tiny_model(family)), "w8a8")).decoder.fused is None
    for target in (tree_way, chain_way, alone_way, walk):
        target.prefill(PROMPT)
    root = PROMPT[-1]
    for seed, last in ((0, 5), (1, 6), (2, 0)):  # a path to a node deep in the tree, another, the root alone
        tree = branching(root, 8, seed)
        keep = [last]
        while keep[0]:
            keep.insert(0, int(tree.parents[keep[0]]))
        got = tree_way.forward_tree(tree)
        near = walk.forward_tree(tree).logits
        assert (got.logits - near).abs().max() < 0.05 * near.abs().max()
        tokens = [int(tree.tokens[i]) for i in keep]
        chain = chain_way.forward_tree(Tree.from_lists(tokens, list(range(-1, len(keep) - 1))))
        assert torch.equal(got.logits[keep], chain.logits) and torch.equal(got.features[keep], chain.features)
        for j, token in enumerate(tokens):
            alone = alone_way.forward_tree(Tree.from_lists([token], [-1]))
            assert torch.equal(alone.logits[0], chain.logits[j])
            alone_way.commit([0], 1)
        for target, n in ((tree_way, tree.n_nodes), (walk, tree.n_nodes), (chain_way, len(keep))):
            target.commit(keep if target is not chain_way else list(range(len(keep))), n)
        root = int(tree.tokens[keep[-1]])
    length = tree_way.n_cached
    assert chain_way.n_cached == alone_way.n_cached == length
    for other in (chain_way, alone_way):
        assert torch.equal(tree_way.cache.keys[:, :, :length], other.cache.keys[:, :, :length])
        assert torch.equal(tree_way.cache.values[:, :, :length], other.cache.values[:, :, :length])
