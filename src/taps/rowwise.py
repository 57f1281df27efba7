"""Row-wise attention: each query row attends alone, over exactly the keys its mask allows, so a
row's result does not depend on the other rows of its forward (attn_implementation "taps_rowwise").

Why: a tree's rows must be computed as plain decoding computes them (docs/method.md section 10).
SDPA over many query rows and a masked key set sums in another order than over one query and its
own keys, which moves the last bits; a float model shrugs that off, but a w8a8 target
(taps.weightonly) rounds every activation to int8, so a last-bit difference can flip a rounding,
and then a near-tie token (SmolLM2-135M in float32: chain's answer differed from the model's own
greedy one within 48 tokens). With every linear of a quantized target computing each row alone
(tested bit for bit) and this attention, the rest of a decoder layer (norms, rotary embedding,
activations, residuals) works row by row anyway, so a verified tree's rows, its committed K/V
included, are the bits plain decoding would have made, in float32 and bfloat16 alike.

Row i calls `scaled_dot_product_attention(q_i, K[allowed_i], V[allowed_i])` without a mask: in
plain decoding the allowed keys are all of them, the same call. A causal prefill without a
mask (a fresh prompt, the same in plain and speculative decoding) runs as one causal SDPA call.
Cost: one call per row and layer; a 32-node tree of the 1.5B makes 28 x 33 of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "taps_rowwise"


def rowwise_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query [B, H, Q, D], key/value [B, Hkv, K, D],
    attention_mask [B, 1, Q, K] (bool: True = attend) or None; returns ([B, Q, H, D], None)."""
    gqa = query.shape[1] != key.shape[1]
    batch, _, rows, _ = query.shape
    if attention_mask is None and rows > 1:  # a fresh causal prefill
        out = F.scaled_dot_product_attention(query, key[:, :, :rows], value[:, :, :rows], is_causal=True,
                                             scale=scaling, enable_gqa=gqa)  # [B, H, Q, D]
        return out.transpose(1, 2).contiguous(), None
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask == 0  # an additive mask: 0 where attended
    out = torch.empty_like(query)  # [B, H, Q, D]
    for b in range(batch):
        for i in range(rows):
            if attention_mask is None:  # one query row over every key: plain decoding
                k, v = key[b : b + 1], value[b : b + 1]
            else:
                allowed = attention_mask[b if attention_mask.shape[0] > 1 else 0, 0, i].nonzero()[:, 0]  # [n_allowed]
                k, v = key[b : b + 1, :, allowed], value[b : b + 1, :, allowed]  # [1, Hkv, n_allowed, D]
            out[b : b + 1, :, i : i + 1] = F.scaled_dot_product_attention(
                query[b : b + 1, :, i : i + 1], k, v, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make NAME an attention implementation transformers models can switch to (idempotent); its
    masks are prepared as SDPA's are (4D masks, such as a tree's, pass through untouched)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
