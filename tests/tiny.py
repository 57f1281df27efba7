"""Tiny randomly initialised Llama and Qwen2 targets for fast logic tests."""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from taps.gqa import register
from taps.linear import use_linear

DEVICE = os.environ.get("TAPS_TEST_DEVICE", "cpu")

FAMILIES = {
    "llama": LlamaConfig,
    "qwen2": Qwen2Config,
}


def tiny_model(family: str = "llama", vocab: int = 96, seed: int = 0, max_positions: int = 256, hidden: int = 64,
               **overrides):
    torch.manual_seed(seed)
    cfg = FAMILIES[family](
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
        attn_implementation=register(),  # what taps.assets.load_model gives users
        **overrides,
    )
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # random init is nearly uniform; sharper logits make greedy paths and acceptance meaningful
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    # TAPS_TEST_DEVICE (scripts/check_device.sh): the same tests on an accelerator; CPU by default
    return use_linear(model.eval()).to(DEVICE)  # the backend users get from taps.assets.load_model


def hf_greedy(model, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """transformers' own greedy generate: `n` tokens after `prompt`, on the model's device. The
    reference every method's T=0 output must equal."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def greedy_sequences(model, n: int = 10, new_tokens: int = 36) -> list[list[int]]:
    """Self-distillation data as DFlash uses: the model's own greedy continuations of random prompts."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        prompt = torch.randint(0, 90, (1, 4), generator=gen)
        seq = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new_tokens,
                             pad_token_id=0)
        out.append(seq[0].tolist())
    return out


class FeatureRecorder:
    """A drafter with uniform marginals (its drafted rounds commit about one token) that records,
    per draft, the ids it was given and the target feature rows [k, F] that came with them."""

    block_len, feature_layers = 4, (0, 2)

    def __init__(self, target):
        self.vocab_size = target.vocab_size
        self.calls: list[tuple[int, int]] = []  # (len(ids), feature rows) per draft
        self.widths: set[int] = set()  # feature widths F seen

    def start(self, prompt_ids, reused=0):
        pass

    def draft(self, ids, features):
        self.calls.append((len(ids), 0 if features is None else features.shape[0]))
        if features is not None:
            self.widths.add(features.shape[1])
        return torch.full((self.block_len, self.vocab_size), 1.0 / self.vocab_size)

    def got_each_token_once(self) -> bool:
        """At every draft, one feature row per token before the root (the prompt's and every
        committed one), each delivered once."""
        delivered = 0
        for n_ids, rows in self.calls:
            delivered += rows
            if delivered != n_ids - 1:
                return False
        return bool(self.calls)
