"""The draft tree (docs/method.md sections 1 and 4): tokens, parents, depths, ancestor mask.

Node 0 is the root (the last committed token, depth 0, parent -1). Every other node is a
drafted token whose parent comes earlier in the arrays, so the flattened order already has
parents before children, which is what one verification forward needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tree:
    tokens: torch.Tensor  # [n_nodes] int64, node 0 = root token
    parents: torch.Tensor  # [n_nodes] int64, parents[0] = -1, parents[i] < i
    depths: torch.Tensor  # [n_nodes] int64, depths[0] = 0, depths[i] = depths[parents[i]] + 1

    def __post_init__(self):
        n = self.tokens.shape[0]
        if n < 1 or self.parents.shape != (n,) or self.depths.shape != (n,):
            raise ValueError("a tree needs tokens, parents and depths of one length >= 1")
        if self.parents[0] != -1 or self.depths[0] != 0:
            raise ValueError("node 0 must be the root (parent -1, depth 0)")
        if n > 1:
            idx = torch.arange(1, n)
            par = self.parents[1:]
            if bool((par < 0).any()) or bool((par >= idx).any()):
                raise ValueError("every node's parent must be an earlier node (prefix-closed, parents first)")
            if not torch.equal(self.depths[1:], self.depths[par] + 1):
                raise ValueError("depths must equal the parent's depth + 1")

    @staticmethod
    def from_lists(tokens: list[int], parents: list[int]) -> Tree:
        """Build from plain lists; depths are derived from parents."""
        depths = [0] * len(tokens)
        for i in range(1, len(tokens)):
            depths[i] = depths[parents[i]] + 1
        return Tree(
            torch.tensor(tokens, dtype=torch.long),
            torch.tensor(parents, dtype=torch.long),
            torch.tensor(depths, dtype=torch.long),
        )

    @staticmethod
    def root_only(root: int) -> Tree:
        """The tree of plain autoregressive decoding: the root and no draft."""
        return Tree.from_lists([root], [-1])

    @property
    def n_nodes(self) -> int:
        """Nodes including the root."""
        return self.tokens.shape[0]

    @property
    def n_draft(self) -> int:
        """Drafted nodes (the budget counts these, not the root)."""
        return self.n_nodes - 1

    def ancestor_mask(self) -> torch.Tensor:
        """[n_nodes, n_nodes] bool: mask[i, j] is True iff j is i or an ancestor of i.

        Built row by row: a node sees what its parent sees, plus itself (parents come first).
        """
        n = self.n_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        parents = self.parents.tolist()
        for i in range(n):
            if parents[i] >= 0:
                mask[i] = mask[parents[i]]
            mask[i, i] = True
        return mask

    def children(self) -> list[list[int]]:
        """children[i] = indices of i's children, in flattened order."""
        out: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for i, p in enumerate(self.parents.tolist()[1:], start=1):
            out[p].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices root..node inclusive."""
        path = []
        parents = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]
