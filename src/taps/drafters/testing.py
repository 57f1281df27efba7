"""Test drafters: they exercise the engine with known acceptance, no training needed.

`oracle` accepts everything, `random` rejects almost everything, `noisy` is partly accepted.
They read no target features and have no weights of their own (nothing to quantize).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers import DynamicCache

from taps.drafters.base import Drafter
from taps.target import Target


class OracleDrafter:
    """Puts the target's own greedy continuation first: its marginals are the target's own
    next-token distributions along its greedy path.

    It decodes that path itself, one token per forward with its own KV cache (the numerics of
    plain decoding), and reuses both the cache and the path while the committed text follows
    them; a round that commits k tokens then costs about k one-token forwards. That cost shows
    in the `draft` stage time: this drafter is for testing the engine, not for speed.
    """

    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: Target, block_len: int = 15):
        self.model = target.model
        self.block_len = block_len
        self.vocab_size = target.vocab_size
        self.max_positions = target.max_positions
        self.cache = DynamicCache(config=self.model.config)
        self.path: list[int] = []  # tokens whose K/V are in self.cache: context, then greedy tokens
        self.rows: dict[int, torch.Tensor] = {}  # position i -> [vocab] logits for the token after path[i]

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Nothing to forget: the cached path is reused whenever the new context follows it."""

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> None:
        pos = len(self.path)
        out = self.model(
            input_ids=torch.tensor([tokens]),
            position_ids=torch.arange(pos, pos + len(tokens))[None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.path += tokens
        self.rows[len(self.path) - 1] = out.logits[0, -1].float()

    def oracle_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """[<= L, vocab] target logits along the greedy continuation of ids."""
        ids = list(ids)
        n = len(ids)
        depth = min(self.block_len, self.max_positions - n)
        wanted = range(n - 1, n - 1 + depth)  # logits after the root and after each greedy token
        if self.path[:n] != ids or any(i not in self.rows for i in wanted):
            common = 0
            for a, b in zip(self.path, ids[:-1]):  # the root is always re-fed: its row is needed
                if a != b:
                    break
                common += 1
            if common < len(self.path):
                self.cache.crop(common - len(self.path))  # a negative crop drops that many tokens
            self.path = self.path[:common]
            self.rows = {i: r for i, r in self.rows.items() if i < common}
            self._feed(ids[common:])
            while len(self.path) < n - 1 + depth:
                self._feed([int(self.rows[len(self.path) - 1].argmax())])
        self.rows = {i: r for i, r in self.rows.items() if i >= n - 1}  # older rows are never asked again
        return torch.stack([self.rows[i] for i in wanted])

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        return torch.softmax(self.oracle_logits(ids), dim=-1)


class RandomDrafter:
    """Random marginals, unrelated to the context: almost every draft is rejected."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: Target, block_len: int = 15, seed: int = 0, scale: float = 4.0):
        self.block_len, self.vocab_size, self.scale = block_len, target.vocab_size, scale
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids: Sequence[int]) -> None:
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

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.gen.manual_seed(self.seed)

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        logp = torch.log_softmax(self.oracle_logits(ids), dim=-1)
        return torch.softmax(logp + self.noise * torch.randn(logp.shape, generator=self.gen), dim=-1)


@dataclass(frozen=True)
class DrafterEntry:
    build: Callable[..., Drafter]  # (target, block_len=..., ...) -> Drafter
    doc: str  # one line for --help


TEST_DRAFTERS: dict[str, DrafterEntry] = {  # by the name --drafter takes
    "oracle": DrafterEntry(OracleDrafter, "test drafter: the target's own greedy continuation (accepts everything)"),
    "random": DrafterEntry(RandomDrafter, "test drafter: random marginals (rejects almost everything)"),
    "noisy": DrafterEntry(NoisyDrafter, "test drafter: the oracle plus noise (partly accepted)"),
}
