"""Test drafters: they exercise the engine with known acceptance, no training needed.

`oracle` accepts everything, `random` rejects almost everything, `noisy` is partly accepted.
They read no target features and have no weights of their own (nothing to quantize).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from taps.drafters.base import Drafter
from taps.drafters.sibling import GreedyPathDrafter
from taps.target import Target


class OracleDrafter(GreedyPathDrafter):
    """Puts the target's own greedy continuation first: its marginals are the target's own
    next-token distributions along its greedy path (taps.drafters.sibling run on the target).

    It decodes that path itself, one token per forward with its own KV cache (the numerics of
    plain decoding); that cost shows in the `draft` stage time: this drafter is for testing the
    engine, not for speed.
    """

    def __init__(self, target: Target, block_len: int = 15):
        super().__init__(target.model, block_len, target.vocab_size, target.max_positions)


class RandomDrafter:
    """Random marginals, unrelated to the context: almost every draft is rejected."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: Target, block_len: int = 15, seed: int = 0, scale: float = 4.0):
        self.block_len, self.vocab_size, self.scale = block_len, target.vocab_size, scale
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids: Sequence[int], reused: int = 0) -> None:
        self.gen.manual_seed(self.seed)

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        logits = self.scale * torch.randn(self.block_len, self.vocab_size, generator=self.gen)
        return torch.softmax(logits, dim=-1)


class NoisyDrafter(OracleDrafter):
    """The oracle's log-probabilities plus Gaussian noise: the greedy token is often, not always,
    the argmax and usually stays near the top, so trees are partly accepted."""

    def __init__(self, target: Target, block_len: int = 15, seed: int = 0, noise: float = 2.0):
        super().__init__(target, block_len)
        self.seed, self.noise = seed, noise
        self.gen = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids: Sequence[int], reused: int = 0) -> None:
        self.gen.manual_seed(self.seed)

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        logp = torch.log_softmax(self.path_logits(ids), dim=-1)
        noise = torch.randn(logp.shape, generator=self.gen).to(logp.device)  # CPU draws: the same on every device
        return torch.softmax(logp + self.noise * noise, dim=-1)


@dataclass(frozen=True)
class DrafterEntry:
    build: Callable[..., Drafter]  # (target, block_len=..., ...) -> Drafter
    doc: str  # one line for --help


TEST_DRAFTERS: dict[str, DrafterEntry] = {  # by the name --drafter takes
    "oracle": DrafterEntry(OracleDrafter, "test drafter: the target's own greedy continuation (accepts everything)"),
    "random": DrafterEntry(RandomDrafter, "test drafter: random marginals (rejects almost everything)"),
    "noisy": DrafterEntry(NoisyDrafter, "test drafter: the oracle plus noise (partly accepted)"),
}
