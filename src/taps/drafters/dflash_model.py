"""The DFlash block-diffusion drafter's network (docs/method.md section 2) and its config.

One forward over the block `[root, MASK, ..., MASK]` gives the marginals of the next
`block_size - 1` positions. The drafter has no embedding table or LM head of its own: it reads
the target's frozen ones. Context comes in by "KV injection": target features of
`target_layer_ids` go through `fc` and `hidden_norm` into a context stream whose keys and values
every drafter layer puts in front of the block's; queries come from the block only, which sees
all of the context and itself (bidirectionally).

Parameter names follow the public DFlash drafters (z-lab/*-DFlash-b16), so their weights load
unchanged (taps.drafters.dflash reads and writes the folders).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from taps.decoder import apply_rotary

DRAFT_VOCAB_KEY = "draft_vocab_ids"  # the draft vocabulary's buffer: it travels in model.safetensors


def default_target_layer_ids(num_target_layers: int, n: int) -> tuple[int, ...]:
    """`n` target layers spread evenly from layer 1 to layer L-3 (docs/method.md section 2), as the
    published drafters chose them; a single layer is the middle one."""
    if n < 1:
        raise ValueError(f"a drafter reads at least one target layer, got n={n}")
    if n == 1:
        return (num_target_layers // 2,)
    first, last = 1, num_target_layers - 3
    if last - first + 1 < n:
        raise ValueError(
            f"a {num_target_layers}-layer target has fewer than {n} layers between 1 and {last}; "
            "give target_layer_ids explicitly"
        )
    return tuple(round(first + i * (last - first) / (n - 1)) for i in range(n))


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int  # H: the target's hidden size (the drafter reads its embeddings, feeds its LM head)
    num_hidden_layers: int  # drafter transformer layers (published: 5; 1-3 fit a CPU)
    intermediate_size: int  # width of the gated SiLU MLP
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (GQA); divides num_attention_heads
    head_dim: int  # width of one attention head
    vocab_size: int  # rows of the target's LM head: the marginals' width
    target_layer_ids: tuple[int, ...]  # target decoder layers whose outputs, concatenated, form the context
    mask_token_id: int  # fills block slots 1..; a row of the target's embedding table, never defaulted
    block_size: int = 16  # block length: the root plus block_size - 1 drafted positions
    rms_norm_eps: float = 1e-6  # epsilon of every RMSNorm
    rope_theta: float = 1_000_000.0  # rotary base; drafters built here copy the target's
    draft_vocab_ids: tuple[int, ...] | None = field(default=None, repr=False)  # ids the head scores; None = all

    def __post_init__(self):
        for name in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the root plus at least one drafted slot), got {self.block_size}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        ids = tuple(int(i) for i in self.target_layer_ids)
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
            raise ValueError(f"target_layer_ids must be distinct non-negative layer indices, got {list(ids)}")
        object.__setattr__(self, "target_layer_ids", ids)
        if self.mask_token_id is None:
            raise ValueError("mask_token_id is required: the drafter never defaults it to pad or eos")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id!r} is not a token id of a {self.vocab_size}-token vocabulary")
        if self.draft_vocab_ids is not None:
            vocab = tuple(sorted(int(i) for i in self.draft_vocab_ids))
            if not vocab or len(set(vocab)) != len(vocab) or vocab[0] < 0 or vocab[-1] >= self.vocab_size:
                raise ValueError(f"draft_vocab_ids must be distinct token ids below {self.vocab_size}")
            object.__setattr__(self, "draft_vocab_ids", vocab)

    @classmethod
    def for_target(cls, target_config, mask_token_id: int, num_hidden_layers: int = 1,
                   target_layer_ids: Sequence[int] | None = None, block_size: int = 16,
                   draft_vocab_ids: Sequence[int] | None = None) -> DFlashConfig:
        """A drafter shaped like the target (docs/method.md section 2: the target's family style)."""
        c = target_config
        heads = c.num_attention_heads
        rope = getattr(c, "rope_parameters", None) or {}
        if target_layer_ids is None:
            # the published drafters read as many target layers as they have layers
            target_layer_ids = default_target_layer_ids(c.num_hidden_layers, num_hidden_layers)
        return cls(
            hidden_size=c.hidden_size,
            num_hidden_layers=num_hidden_layers,
            intermediate_size=c.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
            vocab_size=c.vocab_size,
            target_layer_ids=tuple(target_layer_ids),
            mask_token_id=mask_token_id,
            block_size=block_size,
            rms_norm_eps=c.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10_000.0))),
            draft_vocab_ids=None if draft_vocab_ids is None else tuple(draft_vocab_ids),
        )


# ---------------------------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in float32, as the Llama/Qwen norms the public checkpoints were trained with
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h.to(dtype)).to(dtype)


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, P, head_dim] for positions [B, P] (the Llama/Qwen half-split convention).

    The inverse frequencies are computed here in float32 rather than kept as a buffer, so casting
    the model to bfloat16 cannot round them."""
    half = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)  # [d/2]
    inv_freq = 1.0 / theta ** (half / head_dim)  # [d/2]
    angles = positions.float()[..., None] * inv_freq  # [B, P, d/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, P, d]
    return angles.cos().to(dtype), angles.sin().to(dtype)


class ContextCache:
    """Rotated keys and values of every context position so far, per drafter layer.

    Only context enters it: the block's keys and values are rebuilt every draft, so there is
    nothing to drop afterwards (docs/method.md section 2)."""

    def __init__(self, n_layers: int):
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers  # [B, kv_heads, n, d] each
        self.length = 0  # context positions held


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        self.head_dim, self.n_heads, self.n_kv_heads = d, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(H, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(H, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(H, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, H, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _keys_values(self, h: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        B, n, _ = h.shape
        shape = (B, n, self.n_kv_heads, self.head_dim)  # explicit: n may be 0 (no new context)
        k = self.k_norm(self.k_proj(h).view(shape)).transpose(1, 2)  # [B, kv_heads, n, d]
        v = self.v_proj(h).view(shape).transpose(1, 2)  # [B, kv_heads, n, d]
        return apply_rotary(k, *rope), v

    def forward(self, x, context, block_rope, context_rope, past, mask):
        """x [B, Q, H] block stream; context [B, C, H] new context positions; past: cached context
        K/V or None; mask [Q, P + C + Q] or None (everything visible).
        Returns the output [B, Q, H] and the K/V of the whole context (past + new)."""
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.n_heads, self.head_dim)).transpose(1, 2)  # [B, heads, Q, d]
        q = apply_rotary(q, *block_rope)
        k_blk, v_blk = self._keys_values(x, block_rope)  # [B, kv_heads, Q, d]
        k_ctx, v_ctx = self._keys_values(context, context_rope)  # [B, kv_heads, C, d]
        if past is not None:
            k_ctx, v_ctx = torch.cat([past[0], k_ctx], dim=2), torch.cat([past[1], v_ctx], dim=2)
        k = torch.cat([k_ctx, k_blk], dim=2)  # [B, kv_heads, P + C + Q, d]
        v = torch.cat([v_ctx, v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # [B, heads, Q, d]
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1)), (k_ctx, v_ctx)


class GatedMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = GatedMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, context, block_rope, context_rope, past, mask):
        # the context stream is the same for every layer: only the block passes through the layers
        attn, kv = self.self_attn(self.input_layernorm(x), context, block_rope, context_rope, past, mask)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class DFlashDrafterModel(nn.Module):
    """The drafter network (docs/method.md section 2). It owns no embedding table and no LM head."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.draft_vocab_ids is not None:
            # a buffer, so that the vocabulary travels in model.safetensors with the weights
            self.register_buffer(DRAFT_VOCAB_KEY, torch.tensor(cfg.draft_vocab_ids, dtype=torch.long))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)  # the Qwen3/Llama initializer_range

    def forward(self, block: torch.Tensor, block_positions: torch.Tensor, features: torch.Tensor,
                feature_positions: torch.Tensor, cache: ContextCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """block [B, Q, H]: embeddings of the block tokens, at block_positions [B, Q].
        features [B, C, n_layers * H]: target features of context positions not in `cache` yet,
        at feature_positions [B, C]; they are appended to `cache` when one is given.
        mask [Q, P + C + Q] bool (True = attend) over [cached context; new context; block];
        None lets every query see every key, which is the inference case.
        Returns the block's final hidden states [B, Q, H] (after `norm`)."""
        cfg = self.config
        context = self.hidden_norm(self.fc(features))  # [B, C, H]
        dtype = block.dtype
        block_rope = rotary(block_positions, cfg.head_dim, cfg.rope_theta, dtype)
        context_rope = rotary(feature_positions, cfg.head_dim, cfg.rope_theta, dtype)
        h = block
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, context, block_rope, context_rope, None if cache is None else cache.layers[i], mask)
            if cache is not None:
                cache.layers[i] = kv
        if cache is not None:
            cache.length += features.shape[1]
        return self.norm(h)
