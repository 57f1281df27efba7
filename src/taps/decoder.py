"""A Llama-family forward without transformers' per-call machinery: the hot path of grown drafters'
drafts and of quantized targets' rounds.

A grown drafter (taps.drafters.grown) is a whole base model run once a round over the new
committed tokens and L - 1 masks. On a CPU that forward is a few hundred small operations whose
dispatch costs as much as their arithmetic, so the layers are walked here directly: the same
modules (norms, linear layers in whatever kernel `--drafter-quant` gave them, the model's own
rotary embedding and activation), a key/value cache written in place instead of concatenated,
attended in place by taps' row-wise kernel where it runs (taps.rowwise: each row over its prefix)
or else through SDPA with one causal mask per forward, and per group of linear layers that read
one input (q, k, v; gate, up) one w8a8 product where they share one (taps.weightonly.SharedInput)
and one float32 rank-r product for their adapters' A matrices together. The arithmetic is
transformers' up to the order of a few float additions and the adapters' precision
(tests/test_decoder.py compares the two), and a drafter only proposes: the target
verifies every token, so this path can cost acceptance, never correctness (docs/method.md
section 4).

Measured (one draft after 256 tokens of context, 24 drafts each way interleaved, median ms, 2-core
Intel Xeon with AMX; two runs): the 1.5B's shipped drafter in w8a8, one new token and 6 masks,
72.9 / 77.1 through transformers' forward against 66.3 / 70.9 here, five new tokens 82.4 / 82.6
against 76.0 / 76.9; unquantized (float32) 197.6 against 186.2, probabilities within 2.4e-6.
SmolLM2-135M as its own grown drafter, w8a8: 45.3 against 38.2. (A scratch walk through the same
modules with a static cache but each adapter alone saved 6%: the grouped products are the rest.)
The row-wise kernel and float32 adapters (session 48, one process, this decoder as before and as
now interleaved, 30 drafts after 256-1,184 tokens, 2-core AMD EPYC Zen 5): the shipped drafter
unquantized beside the bfloat16 1.5B 64.2 -> 57.5 ms, in w4a8 (float32 activations: the kernel
alone) 25.4 -> 24.7.

A quantized target (taps.weightonly: its attention switched to taps.rowwise) walks its layers here too
(taps.target), its tree's rows at their own positions (`walk`'s positions) over the keys the tree mask
allows them (the kernel's key lists, taps.rowwise.index). Without adapters and on the row-wise kernel
this is transformers' arithmetic exactly, prefill, tree rows, features and cache alike
(tests/test_target_decoder.py), so the path changes a target's time, never its tokens. Measured
(results/quantized-targets/xeon-amx/decoder-ab.py: the w4a8 1.5B beside its shipped drafter, one
process, each run on both paths in turn, 5 HumanEval + 5 MT-Bench, T=0, 128 tokens, 2-core Intel Xeon
with AMX): plain decoding 1.068x [1.037-1.070] (code) and 1.070x [1.058-1.080] (chat) the tokens/s
through transformers, a token 57.4 -> 53.4 ms; taps:32 1.022x [0.992-1.100] and 1.042x [1.017-1.047],
a tree's verification 73.8 -> 69.4 and 72.0 -> 67.8 ms; the same tokens every run.

A model whose every layer is w4a8 on taps.vnni (the default drafter and `--target-quant w4a8` on CPUs with AVX-512
VNNI) goes further: each layer is one C++ call (taps.layer, whose docstring has the arithmetic and the
measurements), where the walk below makes ~40 Python-level calls a layer; `fused` holds those layers (None: the
walk), and only the walk gives transformers' bits.

Applies to Llama-family decoders (model types in FAMILIES: pre-norm layers of q/k/v/o attention
with full-context rotary attention and a gated MLP); `fits` says whether a model is one, and a
model that is not keeps transformers' forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from taps import rowwise
from taps.layer import FusedLayer


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, P, d] rotated by cos, sin [B, P, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # keep x's dtype: under autocast the projections are bfloat16 while cos, sin may be float32
    return (x * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


FAMILIES = ("llama", "qwen2")  # config.model_type values whose decoder layers this walks


def fits(model: nn.Module) -> bool:
    """Whether `model` is a causal LM whose decoder layers Decoder can walk."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if getattr(config, "model_type", None) not in FAMILIES or not hasattr(inner, "rotary_emb"):
        return False
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if getattr(attn, "sliding_window", None) is not None or hasattr(attn, "q_norm"):
            return False
        if not (hasattr(attn, "scaling") and hasattr(attn, "head_dim")):  # e.g. a remote-code variant of the family
            return False
        if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return False
        linears = [getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
        # a wrapped layer must be an activated adapter (its A and B are Group's to apply); any
        # other wrapper (peft's own LoRA layers) keeps transformers' forward
        if any(hasattr(m, "base_layer") and not hasattr(m, "a_t") for m in linears):
            return False
    return True


class KVCache:
    """Keys and values of the first `length` positions, every layer, written in place into
    buffers [layers, kv_heads, capacity, head_dim] that double when full. `crop` follows
    transformers' DynamicCache.crop, so the drafter trims either cache alike."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = 256):
        self.keys = torch.empty(layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def reserve(self, end: int) -> None:
        """Room for positions up to `end` (exclusive); what is held stays."""
        capacity = self.keys.shape[2]
        if end > capacity:
            grown = max(end, 2 * capacity)
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_empty(old.shape[0], old.shape[1], grown, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions; a negative `max_length` drops that many."""
        self.length = self.length + max_length if max_length < 0 else min(self.length, max_length)

    def get_seq_length(self) -> int:
        return self.length


class Group:
    """Linear layers that read one input (q, k, v; gate, up; or one alone), each perhaps wrapped by
    an activated adapter (taps.drafters.grown.MaskRowAdapter) that adds x A^T B^T on the last n rows."""

    def __init__(self, modules: list[nn.Module]):
        self.bases = [getattr(m, "base_layer", m) for m in modules]
        shared = getattr(self.bases[0], "shared", None)
        members = [(getattr(b, "shared", None), getattr(b, "index", None)) for b in self.bases]
        # one w8a8 product for the group when its members are exactly one SharedInput's, in order
        whole = shared is not None and members == [(shared, i) for i in range(len(shared.sizes))]
        self.shared = shared if whole else None
        adapted = [(i, m) for i, m in enumerate(modules) if hasattr(m, "a_t")]
        # in float32 whatever the model's dtype: CPU products of a few rows and rank r cost per call, and
        # bfloat16's cost more (6 rows, 2-core Zen 5 EPYC, us: x A 896 -> 48 15.0 against 9.5, B 16 -> 4,864
        # 23.6 against 13.8, 16 -> 128 16.3 against 3.0)
        self.a = torch.cat([m.a_t for _, m in adapted], 1).float() if adapted else None  # [in, sum r]
        self.b = []  # (member, its columns of x A, B^T [r, out] in float32)
        start = 0
        for i, m in adapted:
            self.b.append((i, slice(start, start + m.a_t.shape[1]), m.b_t.float()))
            start += m.a_t.shape[1]

    def __call__(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Each member's output for x [T, in]: [T, out_i]; the adapters act on the last n rows."""
        if self.shared is not None:
            outs = list(self.shared.products(x, self.bases[0].scales.dtype))
        else:
            outs = [base(x) for base in self.bases]
        if n and self.a is not None:
            xa = x[-n:].float().mm(self.a)  # [n, sum r]
            for i, cols, b in self.b:
                rows = outs[i][-n:]  # [n, out_i], in place (views of one product too)
                if rows.dtype == b.dtype:
                    rows.addmm_(xa[:, cols], b)
                else:
                    rows.add_(xa[:, cols].mm(b))
        return outs


class Layer:
    """One decoder layer's modules, grouped by input."""

    def __init__(self, layer: nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv = Group([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o = Group([attn.o_proj])
        self.gate_up = Group([mlp.gate_proj, mlp.up_proj])
        self.down = Group([mlp.down_proj])
        self.act = mlp.act_fn
        self.scaling = attn.scaling


class Decoder:
    """The forward of a model `fits` accepts, over tokens after a KVCache's held positions."""

    def __init__(self, model: nn.Module):
        inner, config = model.model, model.config
        self.embed, self.norm, self.head, self.rotary = inner.embed_tokens, inner.norm, model.lm_head, inner.rotary_emb
        self.layers = [Layer(layer) for layer in inner.layers]
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = inner.layers[0].self_attn.head_dim
        # read once: a grown drafter's embedding is peft's wrapper (its trained mask row), whose `.weight`
        # builds the whole merged table on every read (130 ms for the 0.5B's, 2-core Zen 5 EPYC: it was
        # paid at the start of every answer), while its forward looks rows up directly
        weight = self.embed.weight
        self.dtype, self.device = weight.dtype, weight.device
        # taps' row-wise attention kernel where it runs (taps.rowwise: AVX-512 or AVX2, <= 8 query heads a
        # key/value head): it reads the cache's slices in place, where SDPA with a mask cost more (the
        # 0.5B's 14 heads over 2, 7 rows, bfloat16, 2-core Zen 5 EPYC, us a layer: 256 keys 81 against
        # 112, 1,024 keys 285 against 364, both with the slices copied)
        self.rowwise = rowwise.kernel_for(self.device, self.dtype, self.heads // self.kv_heads)
        # each layer in one C++ call where every layer fits (taps.layer: w4a8 on taps.vnni)
        fused = all(FusedLayer.fits(layer, self.dtype, self.rowwise) for layer in self.layers)
        self.fused = [FusedLayer(layer, self.rowwise) for layer in self.layers] if fused else None

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, cache: KVCache, n_adapted: int, keep: int) -> torch.Tensor:
        """Logits [keep, rows] of the last `keep` of `tokens` [T], fed at the positions after the
        cache's; their keys and values join the cache (trim what is not context after). The
        adapters act on the last `n_adapted` rows (the masks)."""
        x, _ = self.walk(tokens, cache, n_adapted)
        return self.logits(x[-keep:])

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The head's logits [T, rows] of the last layer's outputs x [T, H]."""
        return self.head(self.norm(x))

    @torch.inference_mode()
    def walk(self, tokens: torch.Tensor, cache: KVCache, n_adapted: int = 0, positions: torch.Tensor | None = None,
             mask: torch.Tensor | None = None, features: Sequence[int] = (),
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last layer's output [T, H] for `tokens` [T] written into the cache's next T slots, and the
        outputs of decoder layers `features` side by side [T, len(features) * H] (None without them), each
        as transformers' hidden states give it. positions [T]: the rows' (default: their slots); mask
        [1, 1, T, slots + T] bool: the keys each row attends (default causal: each row the cache and the
        rows up to itself), as taps.target's tree mask. Adapters act on the last `n_adapted` rows."""
        T, start = tokens.shape[0], cache.length
        end = start + T
        cache.reserve(end)
        x = self.embed(tokens)  # [T, H]
        if positions is None:
            positions = torch.arange(start, end, device=x.device)
        rope = self.rotary(x[None], positions[None])  # cos, sin [1, T, d]
        # which keys each row sees, as the kernel's key lists or a mask (one row alone: everything)
        if self.rowwise is not None:
            lists = rowwise.causal(end, T) if mask is None else rowwise.index(mask, 0)
        elif mask is None:
            mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(start) if T > 1 else None  # [T, end]
        taken = {}  # feature layer -> its output [T, H]
        if self.fused is not None:
            cos, sin = (r[0].contiguous() for r in rope)  # [T, d]
        for i, layer in enumerate(self.layers):
            if self.fused is not None:
                x = self.fused[i](x, n_adapted, cos, sin, cache.keys[i], cache.values[i], start, self.heads, lists)
            else:
                q, k, v = layer.qkv(layer.input_norm(x), n_adapted)  # [T, heads * d], [T, kv_heads * d] x 2
                q = apply_rotary(q.view(1, T, self.heads, self.head_dim).transpose(1, 2), *rope)
                k = apply_rotary(k.view(1, T, self.kv_heads, self.head_dim).transpose(1, 2), *rope)
                # q [1, heads, T, d], k [1, kv_heads, T, d]
                cache.keys[i, :, start:end] = k[0]
                cache.values[i, :, start:end] = v.view(T, self.kv_heads, self.head_dim).transpose(0, 1)
                keys, values = cache.keys[i, :, :end], cache.values[i, :, :end]  # [kv_heads, end, d]
                if self.rowwise is not None:  # in place, every row over its keys
                    out = self.rowwise(q[0], layer.scaling, keys, values, *lists)  # [T, heads, d]
                else:
                    out = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask,
                                                         scale=layer.scaling, enable_gqa=True)[0].transpose(0, 1)
                    # out [T, heads, d]
                x = x + layer.o(out.reshape(T, -1), n_adapted)[0]
                gate, up = layer.gate_up(layer.post_norm(x), n_adapted)  # [T, I] each
                x.add_(layer.down(layer.act(gate).mul_(up), n_adapted)[0])  # x: this layer's own sum
            if i in features:  # as transformers' hidden_states[i + 1]: the last layer's after the final norm
                # (no later step writes x: the next layer sums into a new tensor)
                taken[i] = self.norm(x) if i == len(self.layers) - 1 else x
        cache.length = end
        return x, torch.cat([taken[i] for i in features], -1) if features else None
