"""taps' drafters as a vLLM speculative proposer, chain mode (issue 24, docs/vllm.md).

vLLM 0.32's `custom_class` method (speculative_config {"method": "custom_class", "model":
"taps.vllm_proposer.TapsProposer", "num_speculative_tokens": k}) imports the class named by
`model`, builds it with the VllmConfig, calls `load_model(target_module)` once after loading the
target, and after every engine step calls

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]

with one entry per row of its persistent batch: the tokens the step sampled for that request
([] when it sampled none: a prefill chunk not yet finished, or a request being discarded), how
many tokens the request holds without drafts, and the batch's token table [max_num_seqs,
max_model_len] whose row i starts with request i's prompt and output so far. The answer gives
each row its draft, k tokens at most; [] proposes nothing (vLLM then verifies no draft for that
request) and shorter lists are fine: the rows may be ragged. vLLM verifies every draft against
its own greedy or sampled token, so what is proposed changes speed, never the output.

The drafter is taps' grown drafter (taps.drafters.grown): it reads token history only, which is
all `custom_class` passes (no hidden states, so the DFlash-layout drafters go through vLLM's own
`dflash` method instead). The chain is its greedy one: the argmax of each row of one block pass,
exactly taps' `chain` method. Each batch row has its own fork of the drafter (shared weights, its
own KV cache of that row's text), so interleaved requests never rebuild each other's cache; a row
that vLLM hands to another request rebuilds its cache from the new text (GrownDrafter.draft sees
the context change). This module imports nothing from vLLM: `import taps` never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from taps.drafters.base import Drafter
from taps.target import Target

if TYPE_CHECKING:
    from vllm.config import VllmConfig

DRAFTER_ENV = "TAPS_VLLM_DRAFTER"  # the drafter folder; vLLM's config has no field for it
PROPOSER = f"{__name__}.TapsProposer"  # what speculative_config's "model" names


class ChainProposer:
    """The vLLM-facing logic, free of vLLM: greedy chains of at most `k` tokens, one drafter fork
    per batch row. Invariant: rows[i] holds the KV cache of the last text drafted for row i."""

    def __init__(self, drafter: Drafter, k: int, max_model_len: int):
        if not (hasattr(drafter, "fork") and getattr(drafter, "prefix_drafts", False)):
            raise ValueError(f"a {type(drafter).__name__} cannot draft for several requests at once; "
                             "serve a grown drafter (taps.drafters.grown) through vLLM")
        if not 1 <= k <= drafter.block_len:
            raise ValueError(f"num_speculative_tokens={k}, but the drafter proposes 1 to {drafter.block_len} "
                             f"tokens: pass num_speculative_tokens <= {drafter.block_len}")
        self.drafter, self.k, self.max_model_len = drafter, k, max_model_len
        self.rows: dict[int, Drafter] = {}

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings=None,  # vLLM's KV slots of the target: a token-history drafter has no use for them
    ) -> list[list[int]]:
        """One draft per batch row, [] where the row sampled nothing this step."""
        for row in [row for row in self.rows if row >= len(sampled_token_ids)]:
            del self.rows[row]  # the batch shrank: those requests are gone
        return [
            self.propose_row(row, token_ids_cpu[row, : num_tokens_no_spec[row]]) if sampled else []
            for row, sampled in enumerate(sampled_token_ids)
        ]

    def propose_row(self, row: int, context: Sequence[int]) -> list[int]:
        """The greedy chain after `context` (root last), cut where it would pass max_model_len."""
        room = min(self.k, self.max_model_len - len(context))
        if room <= 0:
            return []
        if row not in self.rows:
            self.rows[row] = self.drafter.fork()
        # a grown drafter's first `room` positions alone: the same ones, fewer mask rows (taps.drafters.Drafter)
        marginals = self.rows[row].draft([int(t) for t in context], None, room)  # [room, vocab]
        return marginals.argmax(dim=-1).tolist()

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands over its target module here; a token-history drafter never reads it."""


class TapsProposer(ChainProposer):
    """The class vLLM's custom_class method builds: the drafter named by $TAPS_VLLM_DRAFTER (a
    drafter folder), else the one taps ships for the packaged target vLLM serves."""

    def __init__(self, vllm_config: VllmConfig):
        from taps.drafters import load_drafter

        model_config = vllm_config.model_config
        folder = drafter_folder(model_config.model)
        target = shape_only_target(model_config.model, model_config.dtype)
        drafter = load_drafter(folder, target)
        if drafter.feature_layers:
            raise ValueError(f"the drafter in {folder} reads the target's hidden states, which vLLM's custom_class "
                             "proposers never get; serve it with vLLM's dflash method "
                             "(taps vllm-serve --speculation dflash)")
        super().__init__(drafter, vllm_config.speculative_config.num_speculative_tokens, model_config.max_model_len)


def drafter_folder(served: str) -> str:
    """$TAPS_VLLM_DRAFTER, else the drafter shipped for the packaged target whose folder vLLM serves."""
    from taps.assets import packaged_name
    from taps.drafters import shipped_drafter

    chosen = os.environ.get(DRAFTER_ENV)
    if chosen:
        return chosen
    name = packaged_name(served)
    shipped = shipped_drafter(name) if name else None
    if shipped is None:
        raise ValueError(f"taps ships no drafter for {served}: set {DRAFTER_ENV} to a grown drafter folder "
                         "(taps vllm-serve --drafter FOLDER)")
    return shipped


def shape_only_target(path: str, dtype: torch.dtype) -> Target:
    """A Target with the served model's config and no weights (meta tensors): loading a drafter
    checks it against the target's vocabulary and takes its dtype; vLLM holds the real weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return Target(model)
