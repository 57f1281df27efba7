"""Drafting by a model's own greedy path: a sibling model used as it is, no training
(docs/method.md section 11).

A smaller model that shares the target's tokenizer (Qwen2.5-Coder-0.5B for the 1.5B) already
predicts text well. `GreedyPathDrafter` decodes its greedy continuation of the committed text,
one token per forward with its own KV cache, and returns its next-token distribution at each
step: row d is p(x_{d+1} | context, a_1..a_d), the model's conditional along its own path
a_1, a_2, ... (rows of a block drafter are marginals instead; to the tree policies both are rows
of candidates, and verification stays lossless whatever the rows are). Later rows carry the
alternatives the policies branch on: the top-k tokens at each depth, given the greedy prefix.

The path stops early when its probability prod_d p(a_d) falls under `min_reach`, where further
tokens are unlikely to be accepted and each costs a forward. Cache and path are reused while the
committed text follows them, so a round that commits k tokens costs about k forwards to catch up
(the accepted ones were already decoded) plus the new steps.

The oracle test drafter (taps.drafters.testing) is this drafter run on the target itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from taps.target import Target, common_prefix


class GreedyPathDrafter:
    feature_layers: tuple[int, ...] = ()  # reads no target features: its own cache holds the context

    def __init__(self, model: PreTrainedModel, block_len: int, vocab_size: int, max_positions: int,
                 min_reach: float = 0.0):
        rows = model.get_output_embeddings().weight.shape[0]
        if rows > vocab_size:
            raise ValueError(f"the drafter predicts {rows} tokens but the target's vocabulary has {vocab_size}")
        if block_len < 1 or not 0 <= min_reach <= 1:
            raise ValueError(f"need block_len >= 1 and 0 <= min_reach <= 1, got {block_len}, {min_reach}")
        self.model, self.block_len, self.vocab_size = model.eval(), block_len, vocab_size
        self.max_positions, self.min_reach, self.rows_out = max_positions, min_reach, rows
        self.cache = DynamicCache(config=self.model.config)
        self.path: list[int] = []  # tokens whose K/V are in self.cache: context, then greedy tokens
        self.rows: dict[int, torch.Tensor] = {}  # position i -> [rows] logits for the token after path[i]

    def start(self, prompt_ids: Sequence[int], reused: int = 0) -> None:
        """Nothing to forget: the cached path is reused whenever the new context follows it."""

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> None:
        pos, device = len(self.path), self.model.device
        out = self.model(
            input_ids=torch.tensor([tokens], device=device),
            position_ids=torch.arange(pos, pos + len(tokens), device=device)[None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.path += tokens
        self.rows[len(self.path) - 1] = out.logits[0, -1].float()

    def _sync(self, ids: list[int]) -> None:
        """Make the cached path start with `ids` and hold the root's row."""
        if self.path[: len(ids)] == ids and len(ids) - 1 in self.rows:
            return
        common = common_prefix(self.path, ids[:-1])  # the root is always re-fed: its row is needed
        if common < len(self.path):
            self.cache.crop(common - len(self.path))  # a negative crop drops that many tokens
        self.path = self.path[:common]
        self.rows = {i: r for i, r in self.rows.items() if i < common}
        self._feed(ids[common:])

    def path_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """[<= L, rows] logits after the root and after each greedy token of the path."""
        ids = list(ids)
        n = len(ids)
        depth = min(self.block_len, self.max_positions - n)
        self._sync(ids)
        rows, reach = [self.rows[n - 1]], 1.0
        while len(rows) < depth:
            token = int(rows[-1].argmax())
            if self.min_reach > 0:
                reach *= float(torch.softmax(rows[-1], dim=-1)[token])
                if reach < self.min_reach:
                    break
            nxt = n - 1 + len(rows)
            if nxt >= len(self.path):  # else the path already holds this greedy token (greedy is deterministic)
                self._feed([token])
            rows.append(self.rows[nxt])
        self.rows = {i: r for i, r in self.rows.items() if i >= n - 1}  # older rows are never asked again
        return torch.stack(rows)

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        probs = torch.softmax(self.path_logits(ids), dim=-1)  # [depth, rows]
        if self.rows_out == self.vocab_size:
            return probs
        full = probs.new_zeros(probs.shape[0], self.vocab_size)  # ids past the drafter's head get 0
        full[:, : self.rows_out] = probs
        return full


def is_model_folder(folder: str | Path) -> bool:
    """Whether a folder holds a Hugging Face causal LM (not a drafter taps trained)."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        archs = json.loads(config.read_text()).get("architectures") or []
    except (ValueError, AttributeError):
        return False
    return any(a.endswith("ForCausalLM") for a in archs)


def load_sibling(model: str | PreTrainedModel, target: Target, *, tokenizer=None, block_len: int | None = None,
                 min_reach: float = 0.1, dtype: torch.dtype | None = None) -> GreedyPathDrafter:
    """A sibling model as a drafter: a packaged name, a folder or hub id of a causal LM, or a loaded
    model (with its `tokenizer`), on the target's device, in `dtype` (default the target's). It
    must share the target's tokenizer. `block_len` (default 8): most tokens drafted per round."""
    dtype = dtype or target.dtype
    if isinstance(model, str):
        from taps.assets import load_model

        model, tokenizer = load_model(model, dtype=dtype, device=str(target.device))
    if tokenizer is not None and target.tokenizer is not None and tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ValueError("the sibling drafter's tokenizer differs from the target's: a sibling must share it "
                         "(e.g. Qwen2.5-Coder-0.5B for the 1.5B)")
    return GreedyPathDrafter(model.to(dtype), block_len or 8, target.vocab_size, target.max_positions, min_reach)
