"""Copy rounds: verify an n-gram continuation alone, without calling the drafter.

An extension beyond docs/method.md. Prompt lookup decoding drafts for free: summaries, code edits,
retrieval answers and second turns repeat their context, and a continuation found earlier in
the text (`taps.lookup`) costs nothing to propose. `taps` already puts such continuations in
its candidate pool, but every round still pays for the drafter's forward, which on a CPU is a
third of the round or more. A copy round skips it: the tree is the root and a recent
continuation (`CopyPlanner.continuation`), verified like any other tree, so decoding stays
lossless whatever is chosen.

Whether a round copies is docs/method.md 3.3's rule, expected tokens per second, applied to the two
kinds of round with the latency profile: a copy round of n nodes commits 1 + sum of their reach
probabilities in t_verify(n); a drafted round commits what drafted rounds have committed on
average, in the drafting time they really took (measured: the block pass, and for rollout
methods the rollout's steps, which no profile knows in advance) + t_verify(their mean size).
A continuation is found by the
context's last 3 tokens, else its last 2, else its last token (as prompt lookup decoding falls
back from 2 to 1): summaries quote their source in short runs that a 3-token match misses. Its
reach probabilities come from two acceptance rates per match length, estimated online from
every round that had a continuation (copied or not) by comparing it with the tokens the round
committed, which are the target's own choices: P(its first token is right) and P(a token is
right after a right one). A 1-token match is weaker evidence than a 3-token one, and its own
rates say how much weaker on this text. The counts decay exponentially, so the estimates
follow the text as copying starts and stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from taps.costmodel import LatencyProfile
from taps.lookup import ngram_continuations
from taps.tree import Tree

COPY_MAX_LEN = 16  # the longest continuation a copy round verifies (prompt lookup decoding uses 10)
MATCH_LENGTHS = (3, 2, 1)  # context tokens a continuation is found by, tried in this order


@dataclass
class Rate:
    """An acceptance rate from exponentially decayed counts, with a uniform prior (0.5 unseen)."""

    hits: float = 0.0
    trials: float = 0.0

    def update(self, hit: bool, decay: float) -> None:
        self.hits = self.hits * decay + float(hit)
        self.trials = self.trials * decay + 1.0

    @property
    def p(self) -> float:
        return (self.hits + 1.0) / (self.trials + 2.0)


@dataclass
class MatchRates:
    """How the continuations found by one match length fare."""

    first: Rate = field(default_factory=Rate)  # P(a continuation's first token is committed)
    next: Rate = field(default_factory=Rate)  # P(its next token is committed | this one was)


@dataclass(frozen=True)
class Continuation:
    tokens: list[int]  # what followed an earlier occurrence of the context's last `match` tokens (empty: none)
    match: int = 0  # that match length, one of MATCH_LENGTHS (0: none found)


@dataclass
class CopyPlanner:
    """Per generation: decides each round whether to copy, and learns from what rounds commit."""

    profile: LatencyProfile  # t_verify(n) of this machine
    decay: float = 0.9  # weight of the past per observation (rates) or per drafted round (tokens)
    rates: dict[int, MatchRates] = field(default_factory=lambda: {n: MatchRates() for n in MATCH_LENGTHS})
    drafted_rounds: float = 0.0  # decayed counts of drafted rounds, their committed tokens, tree nodes
    drafted_tokens: float = 0.0  # and drafting seconds (measured)
    drafted_nodes: float = 0.0
    drafted_seconds: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    @staticmethod
    def continuation(ids: Sequence[int]) -> Continuation:
        """For the longest match length in MATCH_LENGTHS that has one: the longest of the 4 most
        recent continuations of the context's last tokens, the most recent on ties. Longest,
        because in a repeating run the most recent occurrence is cut short by the end of the text."""
        for n in MATCH_LENGTHS:
            paths = ngram_continuations(ids, n=n, max_len=COPY_MAX_LEN, max_paths=4)
            if paths:
                return Continuation(max(paths, key=len), n)
        return Continuation([])

    def copy_tree(self, root: int, path: Continuation, budget: int, context: int | None = None) -> Tree | None:
        """The copy round's tree (root + a prefix of `path`) when it is modelled faster than a
        drafted round, else None. Before any drafted round there is nothing to compare: None.
        `context` (cached tokens before the root) reads the profile at that length."""
        if not path.tokens or self.drafted_rounds == 0.0:
            return None
        profile = self.profile.at_context(context)
        rates = self.rates[path.match]
        reach = [rates.first.p * rates.next.p**i for i in range(min(len(path.tokens), budget))]  # [n] q_reach of each node
        n = profile.best_size(reach, draft_seconds=0.0)
        if n == 0:
            return None
        copy_rate = (1.0 + sum(reach[:n])) / profile.t_verify(n)
        mean_size = round(self.drafted_nodes / self.drafted_rounds)
        draft_seconds = self.drafted_seconds / self.drafted_rounds
        draft_rate = (self.drafted_tokens / self.drafted_rounds) / (draft_seconds + profile.t_verify(mean_size))
        if copy_rate <= draft_rate:
            return None
        return Tree.from_lists([root, *path.tokens[:n]], list(range(-1, n)))

    def observe(
        self, path: Continuation, committed: Sequence[int], drafted_size: int | None, draft_seconds: float = 0.0
    ) -> None:
        """After a round: `path` is the continuation the round had (its tokens empty: none),
        `committed` the tokens it committed (accepted + bonus), `drafted_size` its tree's size if
        it drafted and `draft_seconds` how long its drafting took."""
        tokens = path.tokens
        for i in range(min(len(tokens), len(committed))):
            hit = tokens[i] == committed[i]
            rates = self.rates[path.match]
            (rates.first if i == 0 else rates.next).update(hit, self.decay)
            if not hit:
                break  # past the first miss the continuation was not reachable: no evidence
        if drafted_size is not None:
            self.drafted_rounds = self.drafted_rounds * self.decay + 1.0
            self.drafted_tokens = self.drafted_tokens * self.decay + len(committed)
            self.drafted_nodes = self.drafted_nodes * self.decay + drafted_size
            self.drafted_seconds = self.drafted_seconds * self.decay + draft_seconds
