import pytest
import torch

from taps.tree import Tree


def test_ancestor_mask_matches_paths():
    #        0
    #      1   2
    #     3 4   5
    #     6
    tree = Tree.from_lists([9, 1, 2, 3, 4, 5, 6], [-1, 0, 0, 1, 1, 2, 3])
    mask = tree.ancestor_mask()
    for i in range(tree.n_nodes):
        expected = torch.zeros(tree.n_nodes, dtype=torch.bool)
        expected[tree.path_to(i)] = True
        assert torch.equal(mask[i], expected)
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.children() == [[1, 2], [3, 4], [5], [6], [], [], []]
    assert tree.n_draft == 6


@pytest.mark.parametrize(
    "parents",
    [[0, 0], [-1, 1], [-1, 0, 3, 1]],
)
def test_rejects_trees_that_are_not_prefix_closed(parents):
    with pytest.raises(ValueError):
        Tree.from_lists(list(range(len(parents))), parents)


def test_rejects_inconsistent_depths():
    with pytest.raises(ValueError, match="depth"):
        Tree(torch.tensor([1, 2]), torch.tensor([-1, 0]), torch.tensor([0, 2]))
