"""One call per decoder layer for a model whose linear layers are all w4a8 on taps.vnni: kernels/layer.cpp
walks a layer (its norms, the rotary embedding, the cache writes, taps.vnni's products, taps.rowwise's
attention, the gated MLP and a grown drafter's mask-row adapters) in C++, where taps.decoder's walk makes ~40
Python-level calls a layer. Both a w4a8 target (bfloat16 or float32 rows) and a w4a8 grown drafter (float32
rows) take it wherever their layers fit (`FusedLayer.fits`); taps.decoder.Decoder.fused holds the layers.

Why: at a few rows the walk's calls cost as much as a layer's arithmetic. The shipped 1.5B drafter (the 0.5B,
24 layers) in w4a8 beside the w4a8 1.5B, 256 tokens of context (2-core AMD EPYC Zen 4, session 54): a draft of
4 new tokens and 5 masks took 33-35 ms through the walk, 15-18 ms of it with every product stubbed out
(adapters' small float32 products ~4 ms, norms ~2, rotary ~1.3, attention 2.4, the rest Python and small ops);
the 1.5B's own forward of one row 41.6 ms, 6.4 ms of it outside the products. End to end, one process, ways
interleaved (results/quantized-targets/zen4/fused-layer.py, 10 HumanEval + 10 MT-Bench prompts, T=0, 128
tokens): the drafter's layers fused (`fused-drafter.jsonl`) cut a round's draft 38.8 -> 33.3 ms (HumanEval)
and 29.2 -> 24.0 (MT-Bench), taps:32 1.074x [1.013-1.131] / 1.053x [0.956-1.106] the tokens/s, the same
tokens; both models' layers fused against neither (`fused-layer.jsonl`, METHODS=ar,taps:32): plain decoding
1.225x [1.116-1.399] / 1.167x [1.071-1.422] the tokens/s (a token 38.8 -> 31.1 and 49.4 -> 39.5 ms), taps:32
1.169x [1.114-1.245] / 1.247x [1.191-1.310] (verification 56.6 -> 50.9 and 62.2 -> 51.9 ms a round), every
method its own plain decoding's tokens in each way. The adapters' loops (kernels/layer.cpp `adapt`) read A and B
once for all mask rows, not once a row (a draft of 1 + 3 / 4 + 5 / 5 + 7 rows 0.90x / 0.89x / 0.87x the time; one
process, interleaved, 40 drafts each, a scratch A/B), and run on every thread with out read and written once, B
kept in blocks of OUT_BLOCK columns (the adapters' share of a 4 + 5-row draft, paired, 55 drafts each, two
processes a way: 5.2 / 7.1 ms -> 2.7 / 3.0 ms; session 55).

Arithmetic: the walk's operations and rounding points (a bfloat16 row is rounded where transformers rounds it:
after the norm's scaling, after its weight, after each product, rotation and residual sum), up to the float order
of a norm's sum of squares, a rotation rounded once (transformers rounds its two products and their sum too) and an
adapter's products summed in another order. Every row is computed alone (the products and the attention were
already: taps.vnni, taps.rowwise), so a target's tree rows are the bits of its path fed as a chain or token by
token (tests/test_target_decoder.py), which lossless verification needs (docs/method.md sections 10 and 12); the
fused target is thus another float order of the same w4a8 model than transformers' forward or the walk, its tokens
at a near-tie may differ from theirs, and every method still equals its own plain decoding. A drafter only proposes
(docs/method.md section 4). tests/test_decoder.py compares a fused drafter's drafts with the walk's.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers.activations import ACT2FN

from taps import kernels, vnni

OUT_BLOCK = 64  # output columns of an adapter's B a block (kernels/layer.cpp's OUT_BLOCK)


@functools.cache
def load() -> str | None:
    """Build (once per machine) and load kernels/layer.cpp: None when it runs here, else why not."""
    if (why := vnni.load()) is not None:
        return why
    return kernels.build("taps_layer", "layer.cpp", ["-mavx512f"])


def _w4a8(base: nn.Module) -> tuple[torch.Tensor, ...] | None:
    """The packed w4a8 weight of a layer on taps.vnni (shared or alone), or None."""
    product = getattr(getattr(base, "shared", None), "product", None) or getattr(base, "product", None)
    if getattr(base, "scheme", None) != "w4a8" or getattr(product, "kernel", None) != "vnni":
        return None
    return product.packed


class FusedLayer:
    """A taps.decoder.Layer's arguments to torch.ops.taps_layer.w4a8_layer, made once."""

    @staticmethod
    def fits(layer, dtype: torch.dtype, attention) -> bool:
        """Whether `layer` (taps.decoder.Layer) can run fused: float32 or bfloat16, the row-wise kernel, every
        product w4a8 on taps.vnni with q, k, v and gate, up each one shared product, o and down alone
        without bias, RMS norms and SiLU."""
        if dtype not in (torch.float32, torch.bfloat16) or attention is None:
            return False
        groups = (layer.qkv, layer.o, layer.gate_up, layer.down)
        if any(_w4a8(base) is None for g in groups for base in g.bases):
            return False
        if layer.qkv.shared is None or layer.gate_up.shared is None or layer.gate_up.shared.bias is not None:
            return False
        alone = (layer.o.bases[0], layer.down.bases[0])
        if any(getattr(base, "bias", None) is not None or base.shared is not None for base in alone):
            return False
        norms = (layer.input_norm, layer.post_norm)
        if not all(hasattr(n, "variance_epsilon") and n.weight.dtype == dtype for n in norms):
            return False
        # built last: a model that cannot fuse never waits for the build
        return isinstance(layer.act, (nn.SiLU, type(ACT2FN["silu"]))) and load() is None

    def __init__(self, layer, attention):
        self.eps = float(layer.input_norm.variance_epsilon)
        self.norms = (layer.input_norm.weight.detach(), layer.post_norm.weight.detach())
        bias = layer.qkv.shared.bias
        self.qkv_bias = torch.empty(0) if bias is None else bias
        self.products = [list(_w4a8(g.bases[0])) for g in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        self.group = layer.qkv.bases[0].group_size
        self.adapters = [t for g in (layer.qkv, layer.o, layer.gate_up, layer.down) for t in self._adapter(g)]
        self.scaling = float(layer.scaling)
        self.attention = attention._qualified_op_name

    @staticmethod
    def _adapter(group) -> tuple[torch.Tensor, ...]:
        """A group's adapters as kernels/layer.cpp's `adapt` reads them: A [in, r], spans [members, 5] and
        the members' B [r_m, out_m] one after another, flat, each in blocks of OUT_BLOCK columns
        ([out_m / OUT_BLOCK, r_m, OUT_BLOCK], the last block padded with zeros: a block's rows are one
        contiguous read); three empty tensors for none."""
        if group.a is None:
            return torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0)
        out = group.shared.sizes if group.shared is not None else [group.bases[0].out_features]
        spans, flat, offset = [], [], 0
        for i, cols, b in group.b:
            spans.append([cols.start, cols.stop - cols.start, sum(out[:i]), out[i], offset])
            rank, width = b.shape
            padded = torch.nn.functional.pad(b, (0, -width % OUT_BLOCK))  # [r, blocks * OUT_BLOCK]
            flat.append(padded.reshape(rank, -1, OUT_BLOCK).transpose(0, 1).reshape(-1))
            offset += padded.numel()
        return group.a.contiguous(), torch.tensor(spans), torch.cat(flat)

    def __call__(self, x: torch.Tensor, n_adapted: int, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, start: int, heads: int, lists: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """This layer's output [T, H] for x [T, H]; its rows' keys and values written into keys, values
        [kv_heads, capacity, d] from slot `start`, each row attending the keys `lists` name."""
        qkv, o, gate_up, down = self.products
        return torch.ops.taps_layer.w4a8_layer(
            x, *self.norms, self.eps, qkv, self.qkv_bias, o, gate_up, down, self.group, self.adapters, n_adapted,
            cos, sin, keys, values, start, heads, self.scaling, *lists, self.attention)
