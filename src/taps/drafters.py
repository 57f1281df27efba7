"""Drafters: anything that turns the committed context into marginals [L, vocab].

A drafter is called once per round with every committed token (the root last) and the target
features of the committed tokens it has not seen yet (the root's features arrive next round,
since they come out of this round's verification). It returns L distributions for the tokens
after the root: row d is the marginal q_{d+1} (method.md section 1).

The test drafters below exercise the engine with known acceptance: `oracle` accepts everything,
`random` rejects almost everything, `noisy` is partly accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from taps.target import Target


class Drafter(Protocol):
    block_len: int  # L: positions proposed per draft (block_size - 1)
    vocab_size: int  # must equal the target's output vocabulary
    feature_layers: tuple[int, ...]  # target layers whose hidden states the drafter reads

    def start(self, prompt_ids: Sequence[int]) -> None:
        """A new sequence begins; forget the previous one."""

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        """Committed ids (root last) + new features [k, F] -> marginals [L, vocab] (float32, rows sum to 1)."""


class OracleDrafter:
    """Puts the target's own greedy continuation first: its marginals are the target's own
    next-token distributions along its greedy path, computed with transformers' `generate`.

    It keeps that reference continuation and only regenerates when the committed text leaves
    it (always at temperature 0 in float32; at temperature > 0 after a sampled divergence).
    The cost of generating shows in the `draft` stage time: this drafter is for testing the
    engine, not for speed.
    """

    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: Target, block_len: int = 15, horizon: int = 64):
        self.model = target.model
        self.block_len = block_len
        self.vocab_size = target.vocab_size
        self.horizon = max(horizon, block_len)
        self.max_positions = target.max_positions
        self.ref: list[int] = []  # context + greedy continuation
        self.ref_logits: torch.Tensor = torch.empty(0)  # [len(ref) - start, vocab]: logits for ref[start + i]
        self.ref_start = 0

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Nothing to forget: the reference is reused whenever the new context is a prefix of it."""

    @torch.inference_mode()
    def _regenerate(self, ids: list[int]) -> None:
        n_new = min(self.horizon, self.max_positions - len(ids))
        out = self.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n_new,
            min_new_tokens=n_new,  # keep going past EOS: the draft only needs plausible rows
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        self.ref = out.sequences[0].tolist()
        self.ref_start = len(ids)
        self.ref_logits = torch.cat(out.logits, dim=0).float()  # [n_new, vocab]

    def oracle_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """[<= L, vocab] target logits along the greedy continuation of ids."""
        ids = list(ids)
        n = len(ids)
        fits = self.ref_start <= n and self.ref[:n] == ids and len(self.ref) >= min(n + self.block_len, self.max_positions)
        if not fits:
            self._regenerate(ids)
        offset = n - self.ref_start
        return self.ref_logits[offset : offset + self.block_len]

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


DRAFTERS: dict[str, DrafterEntry] = {
    "oracle": DrafterEntry(OracleDrafter, "test drafter: the target's own greedy continuation (accepts everything)"),
    "random": DrafterEntry(RandomDrafter, "test drafter: random marginals (rejects almost everything)"),
    "noisy": DrafterEntry(NoisyDrafter, "test drafter: the oracle plus noise (partly accepted)"),
}


def make_drafter(name: str, target: Target, **kwargs) -> Drafter:
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    return DRAFTERS[name].build(target, **kwargs)
