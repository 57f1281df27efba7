"""Tree selection policies (method.md section 3): marginals -> prefix-closed Tree.

Every policy is a pure function `(marginals [depth, vocab], root, budget) -> Tree` and needs no
model. `marginals[d]` is the drafter's distribution for the token at depth d + 1. The decoding
loop trims marginals to the depth the round may still commit, so policies never see limits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import torch

from taps.tree import Tree

PolicyFn = Callable[[torch.Tensor, int, int], Tree]


@dataclass(frozen=True)
class Policy:
    name: str  # the --method name
    select: PolicyFn  # (marginals [depth, vocab], root token, budget) -> Tree
    needs_draft: bool  # False only for plain autoregressive decoding (no drafter is called)
    doc: str  # one line for --help and `taps methods`


POLICIES: dict[str, Policy] = {}


def register(name: str, doc: str, needs_draft: bool = True):
    def wrap(fn: PolicyFn) -> PolicyFn:
        POLICIES[name] = Policy(name, fn, needs_draft, doc)
        return fn

    return wrap


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


@register("ar", "plain autoregressive decoding: the root alone, no draft", needs_draft=False)
def autoregressive(marginals: torch.Tensor, root: int, budget: int) -> Tree:
    return Tree.root_only(root)


@register("chain", "DFlash: the argmax token at each depth, one path of up to `budget` nodes")
def chain(marginals: torch.Tensor, root: int, budget: int) -> Tree:
    tokens = marginals[:budget].argmax(dim=-1).tolist()
    n = len(tokens)
    return Tree.from_lists([root] + tokens, [-1] + list(range(n)))


@register("ddtree", "DDTree: the `budget` most likely paths by product of marginals (best-first heap)")
def ddtree(marginals: torch.Tensor, root: int, budget: int) -> Tree:
    """Best-first enumeration of the top-`budget` prefixes by Q(path) = prod_d q_d(x_d).

    Heap items are (-log Q, depth index, rank, parent node). Popping admits the node and pushes
    its next sibling (same parent, rank + 1) and its first child (next depth, rank 0). A child
    never outscores its parent and a sibling never outscores its elder, so each pop is the best
    prefix not yet admitted: the admitted set is the exact top-`budget` and is prefix-closed.
    """
    depth = marginals.shape[0]
    if depth == 0 or budget == 0:
        return Tree.root_only(root)
    k = min(budget, marginals.shape[1])
    logq, tok = torch.log(marginals.float().clamp_min(1e-30)).topk(k, dim=-1)  # [depth, k] each
    logq, tok = logq.tolist(), tok.tolist()
    tokens, parents = [root], [-1]
    heap = [(-logq[0][0], 0, 0, 0)]
    while heap and len(tokens) <= budget:
        neg, d, r, parent = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(tok[d][r])
        parents.append(parent)
        parent_logq = -neg - logq[d][r]
        if r + 1 < k:
            heapq.heappush(heap, (-(parent_logq + logq[d][r + 1]), d, r + 1, parent))
        if d + 1 < depth:
            heapq.heappush(heap, (neg - logq[d + 1][0], d + 1, 0, node))
    return Tree.from_lists(tokens, parents)
