"""Drafters: anything that turns the committed context into marginals [L, vocab].

A drafter is called once per round with every committed token (the root last) and the target
features of the committed tokens it has not seen yet (the root's features arrive next round,
since they come out of this round's verification). It returns L distributions for the tokens
after the root: row d is the marginal q_{d+1} (method.md section 1).

The test drafters below exercise the engine with known acceptance: `oracle` accepts everything,
`random` rejects almost everything, `noisy` is partly accepted.
"""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from transformers import DynamicCache

from taps.dflash import CONFIG_FILE
from taps.grown import GROWN_FILE
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


DRAFTERS: dict[str, DrafterEntry] = {
    "oracle": DrafterEntry(OracleDrafter, "test drafter: the target's own greedy continuation (accepts everything)"),
    "random": DrafterEntry(RandomDrafter, "test drafter: random marginals (rejects almost everything)"),
    "noisy": DrafterEntry(NoisyDrafter, "test drafter: the oracle plus noise (partly accepted)"),
}


SHIPPED = Path(__file__).parent / "shipped"  # trained drafters that ship with taps, one folder per packaged target


def default_drafter(target: str) -> str | None:
    """The shipped drafter of a packaged target (its folder), or None when taps ships none."""
    folder = SHIPPED / target
    return str(folder) if any((folder / f).is_file() for f in (CONFIG_FILE, GROWN_FILE)) else None


SCORER_DIR = "scorer"  # a drafter folder's trained TAPS edge scorer (taps train-scorer), used by default


def default_scorer(drafter: str | None) -> str | None:
    """The edge scorer trained for a drafter folder (its `scorer/`), or None: taps then scores
    edges by the plain marginals."""
    if drafter is None or drafter in DRAFTERS:
        return None
    folder = Path(drafter) / SCORER_DIR
    return str(folder) if (folder / CONFIG_FILE).is_file() else None


def drafter_feature_layers(name: str) -> tuple[int, ...]:
    """The target layers a drafter reads, known before the target adapter is built (a trained
    drafter's folder says which; the test drafters read none)."""
    if name in DRAFTERS:
        return ()
    from taps.dflash import drafter_feature_layers as folder_layers
    from taps.grown import is_grown_folder

    _check_name(name)
    return () if is_grown_folder(name) else tuple(folder_layers(name))


def _check_name(name: str) -> None:
    if not os.path.isdir(name):
        raise ValueError(f"unknown drafter {name!r}: give a drafter folder or one of {', '.join(DRAFTERS)}")


def make_drafter(name: str, target: Target, block_len: int | None = None, quantize: str = "none") -> Drafter:
    """A test drafter by name, or a trained drafter from its folder: DFlash (config.json +
    model.safetensors) or grown (grown.json + adapters, taps.grown). `block_len` sets a test
    drafter's L; a trained drafter has its own. `quantize` (taps.quantize.SCHEMES) runs a
    trained drafter's linear layers in int8: faster drafts, the output unchanged."""
    from taps.quantize import check_scheme, load_dtype, quantize_linears

    if name in DRAFTERS:
        if check_scheme(quantize) != "none":
            raise ValueError(f"the test drafter {name!r} has no weights to quantize; --drafter-quant is for trained drafters")
        return DRAFTERS[name].build(target, **({} if block_len is None else {"block_len": block_len}))
    _check_name(name)
    from taps.dflash import load_drafter
    from taps.grown import is_grown_folder, load_grown

    if is_grown_folder(name):  # reads token ids only: an int8 one loads in float32 beside any target
        drafter = load_grown(name, target, load_dtype(quantize, target.dtype))
    else:  # shares the target's embeddings and reads its features: the target's dtype
        drafter = load_drafter(name, target)
    if block_len is not None and block_len != drafter.block_len:
        raise ValueError(f"the drafter in {name} proposes {drafter.block_len} positions, not {block_len}")
    drafter.model = quantize_linears(drafter.model, quantize)
    return drafter
