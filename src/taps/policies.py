"""Tree selection policies (docs/method.md section 3): a round's proposal -> prefix-closed Tree.

Every policy is a pure function `select(proposal, budget, config) -> Tree` and needs no model.
A `Proposal` (made by a proposer, taps.rounds) carries the drafter's marginals, where
`marginals[d]` is the distribution for the token at depth d + 1, trimmed to the depth the round
may still commit, so policies never see limits; plus candidate paths from other sources and
the round's context length, which only the policies that use them read.

Policies with options (`cost-aware`, `taps`) take their frozen config dataclass;
`POLICIES[name].configure(**options)` validates one and returns a plain
`(proposal, budget) -> Tree` selector. Called with config None they use the defaults, which
name the latency profile they fall back to in a warning (once per process).

Performance: per round only `topk` passes over the vocabulary (and, with a learned scorer,
its entropy feature); everything after works on [depth, k] candidates with O(n log n) heaps.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch

from taps.costmodel import LatencyProfile, default_profile
from taps.scorer import CandidatePool, MarginalScorer, Scorer, Source
from taps.tree import Tree


@dataclass(frozen=True)
class CandidatePath:
    """Extra candidate tokens after the root from another source (e.g. `taps.lookup`)."""

    tokens: tuple[int, ...]  # the continuation, first token at depth 1
    source: Source = Source.LOOKUP  # recorded on the pool nodes this path adds

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))


@dataclass(frozen=True)
class Proposal:
    """What one round offers to select from (docs/method.md sections 1 and 6)."""

    root: int  # the last committed token, node 0 of every tree
    marginals: torch.Tensor  # [depth, vocab] float32, row d = q_{d+1}; depth 0 = nothing to draft
    paths: tuple[CandidatePath, ...] = ()  # candidates from other sources (n-gram lookup); taps pools them
    context: int | None = None  # cached tokens before the root: the latency profile is read at this length
    draft_seconds: float | None = None  # this round's own drafting time when the profile's would mislead (rollout)
    fixed: Tree | None = None  # a tree chosen by the proposer itself (a copy round): no selection


Selector = Callable[[Proposal, int], Tree]  # (proposal, budget) -> Tree, options bound


@dataclass(frozen=True)
class Policy:
    name: str  # the method name that selects with it
    select: Callable[[Proposal, int, Any], Tree]  # (proposal, budget, config or None) -> Tree
    doc: str  # one line for --help and docs
    config_type: type | None = None  # the frozen config dataclass `select` takes; None = no options

    def configure(self, **options) -> Selector:
        """`select` with its config built (and validated) from `options`, e.g.
        `POLICIES["taps"].configure(profile=my_profile, scorer=EdgeScorer.load(folder))`."""
        if self.config_type is None:
            if options:
                raise ValueError(f"method {self.name!r} takes no options, got {sorted(options)}")
            return partial(self.select, config=None)
        return partial(self.select, config=self.config_type(**options))


POLICIES: dict[str, Policy] = {}


def configure_policy(name: str, **available) -> Selector:
    """`name`'s selector configured with whichever of the `available` options (profile,
    scorer, ...) its config takes; options that are None are left at their defaults."""
    policy = get_policy(name)
    if policy.config_type is None:
        return policy.configure()
    fields = {f.name for f in dataclasses.fields(policy.config_type)}
    return policy.configure(**{k: v for k, v in available.items() if k in fields and v is not None})


def register(name: str, doc: str, config_type: type | None = None):
    def wrap(fn):
        POLICIES[name] = Policy(name, fn, doc, config_type)
        return fn

    return wrap


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown tree policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


@cache
def default_config(config_type: type):
    """The config a policy uses when called without one; built once, so its warning shows once."""
    return config_type()


def profile_or_default(policy: str, profile: LatencyProfile | None) -> LatencyProfile:
    """`profile`, else the stated default profile with a warning (once per process and caller)."""
    if profile is not None:
        return profile
    fallback = default_profile()
    warnings.warn(
        f"{policy}: no LatencyProfile given; using taps.costmodel.default_profile() ({fallback.info.note}). "
        "Measure this machine with taps.costmodel.measure_profile and pass profile=...",
        stacklevel=4,
    )
    return fallback


def _top_tokens(marginals: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    """The k most likely tokens per depth: (log q [depth][k], token ids [depth][k]), ranks descending."""
    q, tok = marginals.topk(min(k, marginals.shape[1]), dim=-1)  # [depth, k] each
    return q.float().clamp_min(1e-30).log().tolist(), tok.tolist()


def _best_first(logq: list[list[float]], n_max: int) -> list[tuple[int, int, int, float]]:
    """Best-first enumeration (3.2) of up to n_max prefixes by log Q(path) = sum_d log q_d(x_d).

    Returns one (parent node, depth index, rank, log Q) per admitted node; entry i is node i + 1
    (node 0 is the root). Popping admits the node and pushes its next sibling (same parent,
    rank + 1) and its first child (next depth, rank 0). A child never outscores its parent and a
    sibling never outscores its elder, so each pop is the best prefix not yet admitted: every
    prefix of the order is the exact top of its size and is prefix-closed. O(n log n).
    """
    depth, k = len(logq), len(logq[0])
    order: list[tuple[int, int, int, float]] = []
    heap = [(-logq[0][0], 0, 0, 0)]  # (-log Q, depth index, rank, parent node)
    while heap and len(order) < n_max:
        neg, d, r, parent = heapq.heappop(heap)
        order.append((parent, d, r, -neg))
        node = len(order)
        parent_logq = -neg - logq[d][r]
        if r + 1 < k:
            heapq.heappush(heap, (-(parent_logq + logq[d][r + 1]), d, r + 1, parent))
        if d + 1 < depth:
            heapq.heappush(heap, (neg - logq[d + 1][0], d + 1, 0, node))
    return order


def _order_tree(root: int, tok: list[list[int]], order: Sequence[tuple[int, int, int, float]]) -> Tree:
    return Tree.from_lists([root] + [tok[d][r] for _, d, r, _ in order], [-1] + [p for p, _, _, _ in order])


@register("chain", "DFlash: the argmax token at each depth, one path of up to `budget` nodes")
def chain(proposal: Proposal, budget: int, config: None = None) -> Tree:
    tokens = proposal.marginals[:budget].argmax(dim=-1).tolist()
    n = len(tokens)
    return Tree.from_lists([proposal.root] + tokens, [-1] + list(range(n)))


@register("ddtree", "DDTree: the `budget` most likely paths by product of marginals (best-first heap)")
def ddtree(proposal: Proposal, budget: int, config: None = None) -> Tree:
    """The top-`budget` prefixes by Q(path) = prod_d q_d(x_d) (docs/method.md 3.2), see `_best_first`."""
    marginals, root = proposal.marginals, proposal.root
    if marginals.shape[0] == 0 or budget == 0:
        return Tree.root_only(root)
    logq, tok = _top_tokens(marginals, budget)  # no top-budget prefix uses a rank >= budget
    return _order_tree(root, tok, _best_first(logq, budget))


@dataclass(frozen=True)
class CostAwareConfig:
    profile: LatencyProfile | None = None  # t_draft, t_verify(n) of this machine; None = default_profile(), warned

    def __post_init__(self):
        object.__setattr__(self, "profile", profile_or_default("cost-aware", self.profile))


@register(
    "cost-aware",
    "CaDDTree: DDTree's order cut at the size maximising modelled tokens/s (profiled latency), at most `budget`",
    config_type=CostAwareConfig,
)
def cost_aware(proposal: Proposal, budget: int, config: CostAwareConfig | None = None) -> Tree:
    """docs/method.md 3.3: along DDTree's best-first order, keep the n <= budget first nodes that
    maximise (1 + sum of their Q) / (t_draft + t_verify(n)); every prefix of the order is a
    prefix-closed tree, so any n is valid. The profile is read at the proposal's `context`
    (cached tokens before the root, `LatencyProfile.at_context`; None: the mean curve), with
    t_draft = the proposal's `draft_seconds` when given (rollout rounds), else the profile's."""
    cfg = config or default_config(CostAwareConfig)
    marginals, root = proposal.marginals, proposal.root
    if marginals.shape[0] == 0 or budget == 0:
        return Tree.root_only(root)
    logq, tok = _top_tokens(marginals, budget)
    order = _best_first(logq, budget)
    gains = [math.exp(lq) for *_, lq in order]
    n = cfg.profile.at_context(proposal.context).best_size(gains, proposal.draft_seconds)
    return _order_tree(root, tok, order[:n])


def build_pool(
    marginals: torch.Tensor, root: int, k: int, n_pool: int, extra_paths: Sequence[CandidatePath] = ()
) -> CandidatePool:
    """3.4a: the top-k tokens per depth expanded best-first (by product of marginals) into at
    most n_pool drafter nodes, then each extra path merged in (cut at the marginals' depth):
    its tokens follow existing nodes where they match and add new nodes, tagged with the
    path's source, where they do not. No parent ever gets two children with one token."""
    depth = marginals.shape[0]
    if depth == 0:
        raise ValueError("a candidate pool needs marginals for at least one depth")
    logq, tok = _top_tokens(marginals, k)  # [depth][k] each
    order = _best_first(logq, n_pool)
    tokens = [root] + [tok[d][r] for _, d, r, _ in order]
    parents = [-1] + [p for p, _, _, _ in order]
    depths = [0] + [d + 1 for _, d, _, _ in order]
    node_logq = [0.0] + [logq[d][r] for _, d, r, _ in order]
    sources = [int(Source.DRAFTER)] * len(tokens)
    if extra_paths:
        child_of = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens)) if i > 0}
        added = []  # pool indices whose marginal is looked up below
        for path in extra_paths:
            node = 0
            for t in path.tokens[:depth]:
                if not 0 <= t < marginals.shape[1]:
                    raise ValueError(f"candidate token {t} is outside the drafter's vocabulary of {marginals.shape[1]}")
                if (node, t) not in child_of:
                    child_of[node, t] = len(tokens)
                    added.append(len(tokens))
                    tokens.append(t)
                    parents.append(node)
                    depths.append(depths[node] + 1)
                    sources.append(int(path.source))
                    node_logq.append(0.0)
                node = child_of[node, t]
        if added:
            idx = torch.tensor(added)
            q = marginals[torch.tensor(depths)[idx] - 1, torch.tensor(tokens)[idx]]  # [added]: one gather, no vocab pass
            for i, lq in zip(added, q.float().clamp_min(1e-30).log().tolist()):
                node_logq[i] = lq
    return CandidatePool(
        tokens=torch.tensor(tokens),
        parents=torch.tensor(parents),
        depths=torch.tensor(depths),
        sources=torch.tensor(sources),
        logq=torch.tensor(node_logq, dtype=torch.float32),
    )


@dataclass(frozen=True)
class TapsConfig:
    k: int = 8  # 3.4a: top-K tokens per depth in the candidate pool
    pool_size: int = 128  # 3.4a: N_pool, most drafter nodes in the pool (raised to the round's budget when smaller)
    scorer: Scorer | None = None  # 3.4b: q_cond per pool edge; None = the plain marginal q_d(x) (no trained scorer)
    lambda1: float = 1.0  # 3.4d: cost of any node in the utility q_reach / (lambda1 + lambda2 * depth)
    lambda2: float = 0.0  # 3.4d: extra cost per level of depth
    threshold: float = 0.0  # 3.4d: stop when the best utility falls under it; 0 = never
    throughput: bool = True  # section 5: cut the greedy order at the size maximising expected tokens/s
    profile: LatencyProfile | None = None  # latency curve for `throughput`; None = default_profile(), with a warning

    def __post_init__(self):
        if self.k < 1 or self.pool_size < 1:
            raise ValueError(f"k and pool_size must be >= 1, got k={self.k}, pool_size={self.pool_size}")
        if not (self.lambda1 > 0 and self.lambda2 >= 0):
            # with these signs and q_cond <= 1, utility never rises from parent to child (see taps())
            raise ValueError(f"need lambda1 > 0 and lambda2 >= 0, got {self.lambda1}, {self.lambda2}")
        if not self.threshold >= 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")
        if self.scorer is not None and not callable(getattr(self.scorer, "q_cond", None)):
            raise ValueError(f"scorer {self.scorer!r} has no q_cond(pool, marginals) method")
        if not self.throughput and self.profile is not None:
            raise ValueError("a profile is only used with throughput=True; drop it or enable throughput")
        if self.throughput:
            object.__setattr__(self, "profile", profile_or_default("taps", self.profile))


_MARGINAL = MarginalScorer()


@register(
    "taps",
    "TAPS: top-K candidate pool, edge scorer q_cond, greedy by q_reach / depth cost, "
    "cut at the size maximising modelled tokens/s (profiled latency), at most `budget`",
    config_type=TapsConfig,
)
def taps(proposal: Proposal, budget: int, config: TapsConfig | None = None) -> Tree:
    """docs/method.md 3.4 (a-d) with section 5's size rule.

    a. `build_pool`: top-K per depth, best-first into N_pool nodes, plus the proposal's `paths`.
    b. q_cond for every pool edge from the scorer.
    c. q_reach(v) = prod of q_cond along root..v.
    d. Greedy: admit the node of best utility q_reach / (lambda1 + lambda2 * depth) with its
       missing ancestors, until `budget` (N_max) nodes or the best utility < threshold.
       Since q_cond <= 1, lambda1 > 0 and lambda2 >= 0, a node's utility never exceeds its
       parent's, so the best node's ancestors are always already admitted: a max-heap over the
       frontier (admitted nodes' children) is exactly this greedy, O(B log B) plus the children.
    Then, with `throughput`, keep the first n admitted nodes maximising
    (1 + sum q_reach) / (t_draft + t_verify(n)) (every prefix of the order is prefix-closed),
    the profile read at the proposal's `context` (`LatencyProfile.at_context`), with
    t_draft = its `draft_seconds` when given (a rollout round's own drafting time).
    """
    cfg = config or default_config(TapsConfig)
    marginals, root = proposal.marginals, proposal.root
    if marginals.shape[0] == 0 or budget == 0:
        return Tree.root_only(root)
    pool = build_pool(marginals, root, cfg.k, max(cfg.pool_size, budget), proposal.paths)  # a
    q_cond = (_MARGINAL if cfg.scorer is None else cfg.scorer).q_cond(pool, marginals)  # b: [n_pool]
    if q_cond.shape != (pool.n,) or not bool(((q_cond >= 0) & (q_cond <= 1)).all()):
        raise ValueError(f"the scorer must give {pool.n} probabilities in [0, 1], one per pool node")
    q_cond = q_cond.tolist()
    parents, depths = pool.parents.tolist(), pool.depths.tolist()
    children: list[list[int]] = [[] for _ in range(pool.n)]
    for v in range(1, pool.n):
        children[parents[v]].append(v)
    reach = [1.0] * pool.n  # c: q_reach, filled when a node joins the frontier
    frontier: list[tuple[float, int]] = []  # (-utility, pool node); ties go to the earlier pool node

    def push(v: int) -> None:
        reach[v] = reach[parents[v]] * q_cond[v]
        heapq.heappush(frontier, (-reach[v] / (cfg.lambda1 + cfg.lambda2 * depths[v]), v))

    for v in children[0]:
        push(v)
    admitted: list[int] = []  # d: pool nodes in admission order
    while frontier and len(admitted) < budget and -frontier[0][0] >= cfg.threshold:
        _, v = heapq.heappop(frontier)
        admitted.append(v)
        for c in children[v]:
            push(c)
    if cfg.throughput:  # section 5: the size with the most expected tokens per second
        profile = cfg.profile.at_context(proposal.context)
        admitted = admitted[: profile.best_size([reach[v] for v in admitted], proposal.draft_seconds)]
    index = {v: i + 1 for i, v in enumerate(admitted)}  # pool node -> tree node
    index[0] = 0
    tokens = pool.tokens.tolist()
    return Tree.from_lists([root] + [tokens[v] for v in admitted], [-1] + [index[parents[v]] for v in admitted])
