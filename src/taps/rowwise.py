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

Row i computes `scaled_dot_product_attention(q_i, K[allowed_i], V[allowed_i])` without a mask,
in float32: in plain decoding the allowed keys are all of them, the same computation. One call
per row, never one over several rows: SDPA's batch entries are not each the bits of their call
alone (float32, 300 keys: 7e-8 apart). float32 because PyTorch's CPU SDPA over one bfloat16 query
costs 379 us against 45 in float32 (12 heads, 257 keys, 2 threads), and a 32-node tree of a
28-layer model makes 924 calls. A prompt's prefill goes row by row too (a causal call without a
mask: row i over its prefix), so its K/V are the same bits however the prompt is cut into forwards:
taps feeds a prompt without its last token, which the first round verifies, where transformers'
`generate` feeds it whole; one causal SDPA call over the rows made them differ, and on a 2-core
Intel Xeon with AMX SmolLM2's w8a8 greedy answer by taps left `generate`'s at its 26th token
(tests/test_weightonly.py). It costs a call per prompt token and layer (~40 us each). The rows'
key lists are made once per mask, which every layer of a forward shares; K and V go to float32
once per call, and a row whose keys are a prefix reads them in place. That halved a chain's
attention: 8 rows after 256 keys, bfloat16, 12 heads over 2, 28 layers, 2-core AMD EPYC, ms a
forward: chain 25.5 -> 12.1, a branching tree 26.7 -> 21.3 (gather and convert per row before).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "taps_rowwise"


def rowwise_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query [B, H, Q, D], key/value [B, Hkv, K, D],
    attention_mask [B, 1, Q, K] (bool: True = attend; or additive, 0 = attend) or None; returns
    ([B, Q, H, D], None)."""
    gqa = query.shape[1] != key.shape[1]
    batch, _, rows, _ = query.shape
    out = torch.empty_like(query)  # [B, H, Q, D]
    for b in range(batch):
        if attention_mask is None:  # causal: the rows are the cache's last `rows` positions, each over its prefix
            keys = range(key.shape[2] - rows + 1, key.shape[2] + 1)
        else:
            keys = _allowed(attention_mask, b)  # per row: see _allowed
        key_b, value_b = key[b].float(), value[b].float()  # [Hkv, K, D], converted once for all rows
        for i, allowed in enumerate(keys):
            if isinstance(allowed, int):  # the first `allowed` keys: a view, no copy
                k, v = key_b[:, :allowed], value_b[:, :allowed]  # [Hkv, L, D]
            else:
                k, v = key_b[:, allowed], value_b[:, allowed]  # [Hkv, L, D]
            row = F.scaled_dot_product_attention(query[b, None, :, i : i + 1].float(), k[None], v[None],
                                                 scale=scaling, enable_gqa=gqa)  # [1, H, 1, D]
            out[b, :, i] = row[0, :, 0]
    return out.transpose(1, 2).contiguous(), None


_last: tuple[torch.Tensor, int, list] | None = None  # (mask, batch row, its rows' keys): every layer gets one mask


def _allowed(mask: torch.Tensor, b: int) -> list[torch.Tensor | int]:
    """Per query row of batch row b, the keys it attends to: an int m for the first m (all of them
    for plain decoding's row; a row whose ancestors are all the tree's nodes before it: a chain's
    rows, a tree's first ones), read in place with no gathered copy (72 of the 117 us a float32
    row call took for 257 keys), else their indices."""
    global _last
    cached = _last  # read once: another thread's forward may replace it meanwhile
    if cached is None or cached[0] is not mask or cached[1] != b:
        allowed = mask[b if mask.shape[0] > 1 else 0, 0]  # [Q, K]
        if allowed.dtype != torch.bool:
            allowed = allowed == 0  # an additive mask: 0 where attended
        cached = _last = (mask, b, [_keys(row) for row in allowed])
    return cached[2]


def _keys(row: torch.Tensor) -> torch.Tensor | int:
    """One row of a boolean mask [K] as `_allowed` gives it: m (the first m keys) or indices."""
    m = int(row.sum())
    return m if bool(row[:m].all()) else row.nonzero()[:, 0]


def register() -> str:
    """Make NAME an attention implementation transformers models can switch to (idempotent); its
    masks are prepared as SDPA's are (4D masks, such as a tree's, pass through untouched)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
