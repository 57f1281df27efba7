"""The DFlash block-diffusion drafter (method.md section 2): model, checkpoint layout, Drafter.

One forward over the block `[root, MASK, ..., MASK]` gives the marginals of the next
`block_size - 1` positions. The drafter has no embedding table or LM head of its own: it reads
the target's frozen ones. Context comes in by "KV injection": target features of
`target_layer_ids` go through `fc` and `hidden_norm` into a context stream whose keys and values
every drafter layer puts in front of the block's; queries come from the block only, which sees
all of the context and itself (bidirectionally).

Checkpoints use the layout of the public DFlash drafters (z-lab/*-DFlash-b16), so those load
unchanged: `config.json` (Qwen3-style fields plus `block_size` and
`dflash_config: {mask_token_id, target_layer_ids}`) and `model.safetensors` with parameter names
`layers.N.self_attn.{q,k,v,o}_proj`, `layers.N.self_attn.{q,k}_norm`, `layers.N.mlp.{gate,up,down}_proj`,
`layers.N.{input,post_attention}_layernorm`, `norm`, `fc`, `hidden_norm`. Ours add a `taps` block
to config.json (the target it was trained for) and, with a draft vocabulary, a `draft_vocab_ids`
tensor.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from taps.linear import use_linear
from taps.target import Target

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ARCHITECTURE = "DFlashDraftModel"  # `architectures` entry of the public checkpoints
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DRAFT_VOCAB_KEY = "draft_vocab_ids"  # the draft vocabulary's tensor in model.safetensors


def default_target_layer_ids(num_target_layers: int, n: int) -> tuple[int, ...]:
    """`n` target layers spread evenly from layer 1 to layer L-3 (method.md section 2), as the
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
                   draft_vocab_ids: Sequence[int] | None = None) -> "DFlashConfig":
        """A drafter shaped like the target (method.md section 2: the target's family style)."""
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
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [d/2]
    angles = positions.float()[..., None] * inv_freq  # [B, P, d/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, P, d]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, P, d] rotated by cos, sin [B, P, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # keep x's dtype: under autocast the projections are bfloat16 while cos, sin may be float32
    return (x * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class ContextCache:
    """Rotated keys and values of every context position so far, per drafter layer.

    Only context enters it: the block's keys and values are rebuilt every draft, so there is
    nothing to drop afterwards (method.md section 2)."""

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
    """The drafter network (method.md section 2). It owns no embedding table and no LM head."""

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


# ---------------------------------------------------------------------------------------------
# The Drafter over a Target
# ---------------------------------------------------------------------------------------------


def check_target(cfg: DFlashConfig, target: Target, source: str = "the drafter") -> None:
    """What any DFlash drafter needs from a target: its widths, layers, mask token, features."""
    tcfg = target.config
    if cfg.hidden_size != tcfg.hidden_size:
        raise ValueError(f"{source} has hidden_size={cfg.hidden_size} but the target has hidden_size={tcfg.hidden_size}")
    if cfg.vocab_size != target.vocab_size:
        raise ValueError(f"{source} has vocab_size={cfg.vocab_size} but the target's LM head has {target.vocab_size} rows")
    outside = [i for i in cfg.target_layer_ids if i >= tcfg.num_hidden_layers]
    if outside:
        raise ValueError(f"{source} reads target layers {outside}, outside the target's {tcfg.num_hidden_layers} layers")
    rows = target.model.get_input_embeddings().weight.shape[0]
    if not 0 <= cfg.mask_token_id < rows:
        raise ValueError(f"{source} has mask_token_id={cfg.mask_token_id}, not a row of the target's {rows}-row embedding table")
    if tuple(target.feature_layers) != cfg.target_layer_ids:
        raise ValueError(
            f"{source} reads target layers {list(cfg.target_layer_ids)} but the Target exposes feature_layers="
            f"{list(target.feature_layers)}; build it as Target(model, tokenizer, feature_layers={cfg.target_layer_ids})"
        )


class DFlashDrafter:
    """The Drafter protocol (taps.drafters) for a DFlash model over a Target whose
    `feature_layers` are the drafter's `target_layer_ids`."""

    def __init__(self, model: DFlashDrafterModel, target: Target, source: str = "the drafter"):
        cfg = model.config
        check_target(cfg, target, source)
        self.model = use_linear(model.to(target.dtype).eval())
        self.embed = target.model.get_input_embeddings()
        head = target.model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        self.vocab = None if cfg.draft_vocab_ids is None else model.draft_vocab_ids  # [V_draft]
        if self.vocab is not None:
            weight, bias = weight[self.vocab], None if bias is None else bias[self.vocab]
        self.head_weight, self.head_bias = weight, bias  # [V_draft, H], [V_draft] or None
        self.block_len = cfg.block_size - 1
        self.vocab_size = target.vocab_size
        self.feature_layers = cfg.target_layer_ids
        self.dtype = target.dtype
        self.cache = ContextCache(cfg.num_hidden_layers)

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.cache = ContextCache(self.model.config.num_hidden_layers)

    @torch.inference_mode()
    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        """Append the new context features' K/V, then one forward over [root, MASK * (block_size - 1)]."""
        cfg = self.model.config
        root_pos = len(ids) - 1  # the context is every committed token before the root
        if features is None:
            features = torch.empty(0, len(cfg.target_layer_ids) * cfg.hidden_size, dtype=self.dtype)
        if self.cache.length + features.shape[0] != root_pos:
            raise ValueError(
                f"the drafter holds {self.cache.length} context positions and got {features.shape[0]} more, "
                f"but the root is at position {root_pos}: call start() for a new sequence and pass the "
                "features of every committed token except the root, once"
            )
        block = torch.full((1, cfg.block_size), cfg.mask_token_id, dtype=torch.long)
        block[0, 0] = ids[-1]
        hidden = self.model(
            self.embed(block),
            root_pos + torch.arange(cfg.block_size)[None],
            features[None].to(self.dtype),
            torch.arange(self.cache.length, root_pos)[None],
            cache=self.cache,
        )  # [1, block, H]
        logits = F.linear(hidden[0, 1:], self.head_weight, self.head_bias).float()  # [L, V_draft]
        probs = torch.softmax(logits, dim=-1)
        if self.vocab is None:
            return probs
        # tokens outside the draft vocabulary get probability 0; lossless, as the target verifies
        full = torch.zeros(self.block_len, self.vocab_size)  # [L, vocab]
        full[:, self.vocab] = probs
        return full


# ---------------------------------------------------------------------------------------------
# Checkpoint layout
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetInfo:
    """The target a drafter was trained for; recorded in config.json's `taps` block, checked on load."""

    name: str  # what the user called it: packaged model name, folder or hub id
    vocab_size: int  # rows of its LM head
    hidden_size: int  # its hidden size
    num_hidden_layers: int  # its decoder layers

    @classmethod
    def of(cls, model: "PreTrainedModel", name: str) -> "TargetInfo":
        return cls(name, model.get_output_embeddings().weight.shape[0], model.config.hidden_size,
                   model.config.num_hidden_layers)


def config_to_json(cfg: DFlashConfig, info: TargetInfo, dtype: torch.dtype) -> dict:
    """The public DFlash config.json fields, plus our `taps` block."""
    dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}
    if cfg.draft_vocab_ids is not None:
        dflash["draft_vocab_size"] = len(cfg.draft_vocab_ids)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": dflash,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "num_target_layers": info.num_hidden_layers,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "dtype": str(dtype).removeprefix("torch."),
        "taps": {
            "target": info.name,
            "vocab_size": info.vocab_size,
            "hidden_size": info.hidden_size,
            "num_hidden_layers": info.num_hidden_layers,
            "target_layer_ids": list(cfg.target_layer_ids),
        },
    }


def _check_supported(raw: dict, source: str) -> None:
    """Refuse hub variants this drafter does not implement, rather than load them wrongly."""
    archs = raw.get("architectures") or [ARCHITECTURE]
    if ARCHITECTURE not in archs:
        raise ValueError(f"{source}: architecture {archs} is not {ARCHITECTURE!r}, the only one taps implements")
    layer_types = set(raw.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(f"{source}: layer types {sorted(layer_types)} are not supported (full attention only)")
    if raw.get("attention_bias"):
        raise ValueError(f"{source}: attention biases are not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act={raw['hidden_act']!r} is not supported (silu only)")
    rope = raw.get("rope_parameters") or {}
    if raw.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        raise ValueError(f"{source}: rope scaling is not supported (default rotary positions only)")


def config_from_json(raw: dict, draft_vocab_ids: Sequence[int] | None, source: str) -> DFlashConfig:
    """Read our config.json or a public one (block_size at the top level or in dflash_config,
    rope_theta at the top level or in rope_parameters)."""
    _check_supported(raw, source)
    dflash = raw.get("dflash_config") or {}
    if dflash.get("mask_token_id") is None:
        raise ValueError(f"{source}: dflash_config.mask_token_id is missing; the mask token must be explicit")
    if not dflash.get("target_layer_ids"):
        raise ValueError(f"{source}: dflash_config.target_layer_ids is missing")
    rope_theta = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
    if rope_theta is None:
        raise ValueError(f"{source}: config.json has no rope_theta (at the top level or in rope_parameters)")
    try:
        heads = raw["num_attention_heads"]
        return DFlashConfig(
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            intermediate_size=raw["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"],
            target_layer_ids=tuple(dflash["target_layer_ids"]),
            mask_token_id=dflash["mask_token_id"],
            block_size=int(dflash.get("block_size", raw.get("block_size", 16))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            draft_vocab_ids=draft_vocab_ids,
        )
    except KeyError as missing:
        raise ValueError(f"{source}: config.json lacks the field {missing}") from None
    except ValueError as bad:
        raise ValueError(f"{source}: {bad}") from None


def save_drafter(model: DFlashDrafterModel, folder: str | os.PathLike, target_info: TargetInfo) -> Path:
    """Write config.json + model.safetensors in the DFlash layout.

    The files go into a temporary sibling folder that then replaces `folder`, so a crash never
    leaves a half-written drafter behind."""
    cfg = model.config
    if (target_info.hidden_size, target_info.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
        raise ValueError(f"target_info {target_info} does not match the drafter's hidden and vocabulary sizes")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
        save_file(state, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        raw = config_to_json(cfg, target_info, next(model.parameters()).dtype)
        (tmp / CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n")
        old = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def read_drafter(folder: str | os.PathLike) -> tuple[DFlashDrafterModel, dict]:
    """The model in float32 from a DFlash folder (ours or the hub's), and its raw config.json."""
    folder = Path(folder)
    source = str(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise ValueError(f"{source} is not a DFlash drafter folder: it needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = json.loads((folder / CONFIG_FILE).read_text())
    state = load_file(folder / WEIGHTS_FILE)
    vocab = state.get(DRAFT_VOCAB_KEY)
    expected = (raw.get("dflash_config") or {}).get("draft_vocab_size")
    if (vocab is None) != (expected is None) or (vocab is not None and vocab.numel() != expected):
        raise ValueError(f"{source}: dflash_config.draft_vocab_size={expected} disagrees with the {DRAFT_VOCAB_KEY} tensor")
    cfg = config_from_json(raw, None if vocab is None else vocab.tolist(), source)
    model = DFlashDrafterModel(cfg)
    state = {name: t.float() if t.is_floating_point() else t for name, t in state.items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(f"{source}: {WEIGHTS_FILE} does not fit the DFlash layout of its config.json: {error}") from None
    return model.eval(), raw


def drafter_feature_layers(folder: str | os.PathLike) -> tuple[int, ...]:
    """The target layers a drafter folder reads: build the Target with these as `feature_layers`."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{folder} is not a DFlash drafter folder: it has no {CONFIG_FILE}")
    layers = (json.loads(path.read_text()).get("dflash_config") or {}).get("target_layer_ids")
    if not layers:
        raise ValueError(f"{folder}: dflash_config.target_layer_ids is missing")
    return tuple(layers)


def _check_trained_for(info: dict, target: Target, source: str) -> None:
    have = {
        "vocab_size": target.vocab_size,
        "hidden_size": target.config.hidden_size,
        "num_hidden_layers": target.config.num_hidden_layers,
        "target_layer_ids": list(target.feature_layers),
    }
    for name, got in have.items():
        if info.get(name) != got:
            raise ValueError(
                f"{source} was trained for target {info.get('target')!r} with {name}={info.get(name)}, "
                f"but this target has {name}={got}"
            )


def load_drafter(folder: str | os.PathLike, target: Target) -> DFlashDrafter:
    """A drafter from a DFlash folder, checked against `target` and cast to its dtype.

    Ours carry a `taps` block naming the target they were trained for, and any difference is an
    error; a hub folder has none, so only what it determines is checked (hidden size, vocabulary
    size, number of target layers when given, layer ids within range, mask token)."""
    model, raw = read_drafter(folder)
    n_layers = target.config.num_hidden_layers
    if "taps" in raw:
        _check_trained_for(raw["taps"], target, str(folder))
    elif raw.get("num_target_layers", n_layers) != n_layers:
        raise ValueError(
            f"{folder} was made for a target with num_target_layers={raw['num_target_layers']}, "
            f"but this target has {n_layers} layers"
        )
    return DFlashDrafter(model, target, str(folder))
