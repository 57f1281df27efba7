"""Predraw-and-follow acceptance (docs/method.md section 4), lossless at every temperature.

The target draws its own token at a node from its (temperature-processed) distribution,
argmax at temperature 0. Walking from the root, while the target's token at the current node
equals one of that node's drafted children, the walk moves to that child. The target's token
at the last node reached is the bonus. Every emitted token is therefore a target sample given
exactly its prefix, whatever the tree. Draws are made lazily, only at the nodes the walk
visits: the draws at unvisited nodes never influence the output, so skipping them leaves the
distribution unchanged and saves a softmax per node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from taps.tree import Tree


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy (argmax); > 0 = sample from softmax(logits / temperature)
    top_k: int = 0  # keep only the k most likely tokens before sampling; 0 = off
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p; 1 = off

    def __post_init__(self):
        if not (self.temperature == 0 or 1e-3 <= self.temperature <= 100):  # NaN and inf fail too
            raise ValueError(f"temperature must be 0 (greedy) or between 0.001 and 100, got {self.temperature}: "
                             "below, logits / T overflow; above, samples are uniform noise")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def warpers(self) -> LogitsProcessorList:
        """transformers' own warpers, so sampling means exactly what it means in `generate`."""
        out = LogitsProcessorList()
        if self.greedy:
            return out
        if self.temperature != 1.0:
            out.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k > 0:
            out.append(TopKLogitsWarper(self.top_k))
        if self.top_p < 1.0:
            out.append(TopPLogitsWarper(self.top_p))
        return out

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] logits -> the target's sampling distribution [rows, vocab] (float32)."""
        scores = logits.float()
        scores = self.warpers()(None, scores)
        return torch.softmax(scores, dim=-1)


def target_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """The target's own token at one node: argmax at temperature 0, else one sample."""
    if cfg.greedy:
        return int(logits.argmax())
    probs = cfg.probs(logits[None])[0]  # [vocab]
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # tree node indices on the accepted path, root excluded, in depth order
    bonus: int  # the target's token at the last accepted node (the next root)


def verify(tree: Tree, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None) -> Verdict:
    """Walk the tree with the target's own draws. logits: [n_nodes, vocab], row i = after node i."""
    by_token = [dict() for _ in range(tree.n_nodes)]  # node -> {child token: child index}
    for child, (parent, tok) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
        if parent >= 0:
            by_token[parent].setdefault(tok, child)
    node, accepted = 0, []
    while True:
        tok = target_token(logits[node], cfg, generator)
        child = by_token[node].get(tok)
        if child is None:
            return Verdict(accepted, tok)
        accepted.append(child)
        node = child
