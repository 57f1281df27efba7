import pytest
import torch

from taps.tree import Tree
from taps.verify import SamplingConfig, verify


def one_hot_logits(tokens, vocab=10):
    logits = torch.full((len(tokens), vocab), -10.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits


def test_greedy_walk_follows_matching_children_and_returns_bonus():
    #   0(root) -> 1:'a'(3) -> 3:'c'(5)
    #           -> 2:'b'(4) -> 4:'d'(6)
    tree = Tree.from_lists([0, 3, 4, 5, 6], [-1, 0, 0, 1, 2])
    # the target says 4 after the root, 6 after 'b', 7 after 'd'
    logits = one_hot_logits([4, 0, 6, 0, 7])
    v = verify(tree, logits, SamplingConfig())
    assert v.accepted == [2, 4] and v.bonus == 7


def test_greedy_walk_rejects_at_root():
    tree = Tree.from_lists([0, 3], [-1, 0])
    v = verify(tree, one_hot_logits([8, 1]), SamplingConfig())
    assert v.accepted == [] and v.bonus == 8


def test_root_only_tree_is_plain_decoding():
    v = verify(Tree.root_only(1), one_hot_logits([5]), SamplingConfig())
    assert v.accepted == [] and v.bonus == 5


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0), dict(top_p=1.5)])
def test_sampling_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


def test_top_k_and_top_p_restrict_the_distribution():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert (SamplingConfig(1.0, top_k=2).probs(logits)[0, 2:] == 0).all()
    p = SamplingConfig(1.0, top_p=0.5).probs(logits)[0]
    assert p[0] == 1.0  # the top token alone already holds > 50%
    assert torch.allclose(SamplingConfig(2.0).probs(logits), torch.softmax(logits / 2, -1))
