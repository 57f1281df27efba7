"""Proposers: what a round offers the tree policy (docs/method.md sections 1 and 6).

A proposer is called once per round with the committed ids (the root last), the most tokens the
round may still draft (`depth`: the max_new_tokens and context limits, exactly; 0 when only the
bonus token fits) and the budget, and returns a `Proposal` (taps.policies), or None: the tree is
the root alone (plain decoding, or depth 0). After verification it is told the tree verified,
what the round committed and the target features of the kept nodes. Each proposer owns what the budget means
to it: a rollout never steps past what a tree of `budget` nodes could verify whole, a copy round
verifies at most `budget` copied tokens.

- `DraftProposer`: the drafter's block pass, optionally deepened by a greedy rollout (grown
  drafters) and joined by n-gram lookup candidates.
- `CopyProposer`: an n-gram continuation verified alone when modelled faster than drafting
  (taps.copying), else its fallback's proposal.
- `PausingProposer`: its inner proposer's proposal, or the root alone while plain rounds are
  measured faster (taps.gate).

A proposer's per-round state lives from `propose` to `observe`: a wrapper that skips its inner
proposer's `propose` still calls its `observe` (the drafter's features must follow every round),
which then sees a round that was not its own.

The drafter's feature bookkeeping lives here: features of committed tokens accumulate until the
next draft consumes them, so a copy round (no draft) loses none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from taps.copying import Continuation, CopyPlanner
from taps.drafters import Drafter
from taps.gate import Gate
from taps.lookup import ngram_continuations
from taps.policies import CandidatePath, Proposal
from taps.tree import Tree


class Proposer(Protocol):
    def start(self, ids: Sequence[int], features: torch.Tensor | None, reused: int = 0) -> None:
        """A sequence begins: `ids` is the prompt, `features` [len(ids) - 1, F] those of the prefilled tokens,
        of which the target kept the first `reused` from its previous call (taps.drafters.Drafter.start)."""

    def propose(self, ids: Sequence[int], depth: int, budget: int) -> Proposal | None:
        """This round's proposal for at most `depth` drafted tokens, or None: the root alone."""

    def observe(self, tree: Tree, committed: Sequence[int], features: torch.Tensor | None) -> None:
        """After verification: the tree verified, the tokens committed and the target features [k, F]
        of the kept nodes (None when the target gives none)."""


class NoProposer:
    """Plain autoregressive decoding: no drafter is called, every tree is the root alone."""

    def start(self, ids: Sequence[int], features: torch.Tensor | None, reused: int = 0) -> None:
        pass

    def propose(self, ids: Sequence[int], depth: int, budget: int) -> Proposal | None:
        return None

    def observe(self, tree: Tree, committed: Sequence[int], features: torch.Tensor | None) -> None:
        pass


@dataclass(frozen=True)
class Rollout:
    """Deepen each block draft along the drafter's greedy path (grown drafters, taps.drafters.grown)."""

    steps: int = 64  # most greedy drafter steps after the block pass
    reach: float = 0.2  # stop when the path's drafter probability falls under this

    def __post_init__(self):
        if self.steps < 0 or not 0 <= self.reach <= 1:
            raise ValueError(f"need rollout steps >= 0 and 0 <= reach <= 1, got {self.steps}, {self.reach}")


DEPTH_HEADROOM = 1  # positions a prefix drafter's next draft goes past the last drafted tree's depth (DraftProposer)


class DraftProposer:
    """The drafter's marginals, deepened by `rollout` when given, with n-gram lookup paths when `lookup`.

    A drafter with `prefix_drafts` (taps.drafters.Drafter: a grown one) drafts only as deep as the last
    tree it proposed went, plus one: a tree of depth d used d of the draft's positions, and every position
    costs a row of the drafter's forward. The first round of a sequence drafts all L; a tree that uses
    every position drafted makes the next draft one deeper, so depth comes back within rounds where the
    text turns predictable. The positions drafted are the same distributions (causal masks), so this
    changes what a round costs and, when a deeper tree would have been chosen, its tokens per round,
    never which tokens are committed. Measured (results/quantized-targets/zen4/draft-depth.py: the w4a8 1.5B
    beside its shipped w4a8 drafter, taps:32, T=0, 128 tokens, first 10 HumanEval and 10 MT-Bench prompts,
    each way in turn in one process; 2-core AMD EPYC Zen 4): a round's draft on chat 37.6 -> 29.6 ms, tau
    2.29 -> 2.23, tokens/s 1.062x [1.032-1.132] (another run 1.098x [1.058-1.177]); on code 53.7 -> 42.5 ms,
    tau 4.06 -> 3.63, 1.057x [0.943-1.108] (0.987x [0.965-1.063]); the same tokens every run. Two positions
    past the last depth instead of one: 1.02x on both (DEPTH_HEADROOM)."""

    def __init__(self, drafter: Drafter, lookup: bool = False, rollout: Rollout | None = None):
        if rollout is not None and not callable(getattr(drafter, "rollout", None)):
            raise ValueError("rollout deepens drafts with the drafter's own greedy steps, which only a grown drafter "
                             "can take; use a grown drafter, or a method without +rollout")
        self.drafter, self.lookup, self.rollout = drafter, lookup, rollout
        self.pending: torch.Tensor | None = None  # features of committed tokens the drafter has not been given
        self.draft_seconds = 0.0  # the last draft's time (block pass and rollout), for copy planning
        self.prefix = getattr(drafter, "prefix_drafts", False)
        self.slots = drafter.block_len  # positions the next draft asks a prefix drafter for
        self.drafted = False  # whether this round's proposal is this proposer's

    def start(self, ids: Sequence[int], features: torch.Tensor | None, reused: int = 0) -> None:
        self.pending = features
        self.slots = self.drafter.block_len
        self.drafter.start(ids, reused)

    def propose(self, ids: Sequence[int], depth: int, budget: int) -> Proposal | None:
        if depth == 0:
            return None
        t = time.perf_counter()
        if self.prefix:
            marginals = self.drafter.draft(ids, self.pending, min(self.slots, depth))  # [slots, vocab]
        else:
            marginals = self.drafter.draft(ids, self.pending)  # [L, vocab]
        self.pending = None
        self.drafted = True
        if self.rollout is not None:
            # a path longer than budget - 1 tokens could not be verified whole: no step past it
            steps = min(self.rollout.steps, depth - 1, budget - 1)
            marginals = self.drafter.rollout(marginals, steps, self.rollout.reach)  # [L + steps', vocab]
        self.draft_seconds = time.perf_counter() - t
        paths = tuple(CandidatePath(p) for p in ngram_continuations(ids)) if self.lookup else ()
        return Proposal(
            root=ids[-1],
            marginals=marginals[:depth],  # [depth, vocab]
            paths=paths,
            context=len(ids) - 1,
            draft_seconds=self.draft_seconds if self.rollout is not None else None,
        )

    def observe(self, tree: Tree, committed: Sequence[int], features: torch.Tensor | None) -> None:
        if self.drafted:  # a copy or paused round's tree says nothing about the draft's depth
            self.slots = min(self.drafter.block_len, int(tree.depths.max()) + DEPTH_HEADROOM)
            self.drafted = False
        if features is not None:
            self.pending = features if self.pending is None else torch.cat([self.pending, features])


class CopyProposer:
    """Copy rounds (taps.copying): verify an n-gram continuation alone when the planner models it
    faster than a drafted round; otherwise `fallback` drafts. The planner learns from every round."""

    def __init__(self, fallback: DraftProposer, planner: CopyPlanner):
        self.fallback, self.planner = fallback, planner
        self.path = Continuation([])  # this round's continuation (tokens empty: none found)
        self.drafted = False  # whether this round's proposal came from the drafter

    def start(self, ids: Sequence[int], features: torch.Tensor | None, reused: int = 0) -> None:
        self.fallback.start(ids, features, reused)

    def propose(self, ids: Sequence[int], depth: int, budget: int) -> Proposal | None:
        self.path = self.planner.continuation(ids)
        tree = self.planner.copy_tree(ids[-1], self.path, min(budget, depth), len(ids) - 1)
        if tree is not None:
            self.drafted = False
            return Proposal(root=ids[-1], marginals=torch.empty(0, 0), context=len(ids) - 1, fixed=tree)
        proposal = self.fallback.propose(ids, depth, budget)
        self.drafted = proposal is not None
        return proposal

    def observe(self, tree: Tree, committed: Sequence[int], features: torch.Tensor | None) -> None:
        self.planner.observe(self.path, committed, tree.n_draft if self.drafted else None,
                             self.fallback.draft_seconds if self.drafted else 0.0)
        self.fallback.observe(tree, committed, features)
        self.path, self.drafted = Continuation([]), False  # a round this proposer did not propose teaches nothing


class PausingProposer:
    """`inner`'s proposals while they pay, plain rounds while `gate` measures plain rounds faster
    (taps.gate). A round's seconds run from `propose` to `observe`."""

    def __init__(self, inner: Proposer, gate: Gate):
        self.inner, self.gate = inner, gate
        self.t_start = 0.0
        self.drafted = False  # whether this round's proposal came from `inner`

    def start(self, ids: Sequence[int], features: torch.Tensor | None, reused: int = 0) -> None:
        self.inner.start(ids, features, reused)

    def propose(self, ids: Sequence[int], depth: int, budget: int) -> Proposal | None:
        self.t_start = time.perf_counter()
        proposal = self.inner.propose(ids, depth, budget) if self.gate.drafts() else None
        self.drafted = proposal is not None
        return proposal

    def observe(self, tree: Tree, committed: Sequence[int], features: torch.Tensor | None) -> None:
        self.gate.observe(self.drafted, len(committed), time.perf_counter() - self.t_start)
        self.inner.observe(tree, committed, features)
