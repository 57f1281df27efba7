"""One call per decoder layer for a grown drafter in w4a8: kernels/layer.cpp walks a layer (its norms, the
rotary embedding, the cache writes, taps.vnni's products, taps.rowwise's attention, the gated MLP and the
mask rows' adapters) in C++, where taps.decoder's walk makes ~40 Python-level calls a layer.

Why: a draft's products are a small part of its time. The shipped 1.5B drafter (the 0.5B, 24 layers) in
w4a8 beside the w4a8 1.5B, 256 tokens of context, one process (2-core AMD EPYC Zen 4, session 54): a draft
of 4 new tokens and 5 masks took 33-35 ms through the walk, 15-18 ms of it with every product stubbed out
(adapters' small float32 products ~4 ms, norms ~2, rotary ~1.3, attention 2.4, the rest Python and small
ops). The fused layer's numbers are in `FusedLayer`'s docstring.

Arithmetic: the same operations as the walk's up to the order of float32 sums (the norms' mean, an adapter's
B applied as one block matrix for q, k, v and one for gate, up); a drafter only proposes, the target
verifies every token (docs/method.md section 4), so this can cost acceptance, never correctness.
tests/test_decoder.py compares the two on a tiny model. Only drafters take it (a target's walk keeps
transformers' bits), only in float32 with every linear layer on taps.vnni's w4a8 product.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers.activations import ACT2FN

from taps import kernels, vnni


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
        """Whether `layer` (taps.decoder.Layer) can run fused: float32, the row-wise kernel, every
        product w4a8 on taps.vnni with q, k, v and gate, up each one shared product, o and down alone
        without bias, RMS norms and SiLU."""
        if dtype != torch.float32 or attention is None or load() is not None:
            return False
        groups = (layer.qkv, layer.o, layer.gate_up, layer.down)
        if any(_w4a8(base) is None for g in groups for base in g.bases):
            return False
        if layer.qkv.shared is None or layer.gate_up.shared is None or layer.gate_up.shared.bias is not None:
            return False
        if any(getattr(g.bases[0], "bias", None) is not None or g.bases[0].shared is not None for g in (layer.o, layer.down)):
            return False
        norms = (layer.input_norm, layer.post_norm)
        return (all(hasattr(n, "variance_epsilon") and n.weight.dtype == torch.float32 for n in norms)
                and isinstance(layer.act, (nn.SiLU, type(ACT2FN["silu"]))))

    def __init__(self, layer, attention):
        self.eps = float(layer.input_norm.variance_epsilon)
        self.norms = (layer.input_norm.weight.detach(), layer.post_norm.weight.detach())
        bias = layer.qkv.shared.bias
        self.qkv_bias = torch.empty(0) if bias is None else bias.float()
        self.products = [list(_w4a8(g.bases[0])) for g in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        self.group = layer.qkv.bases[0].group_size
        self.adapters = [t for g in (layer.qkv, layer.o, layer.gate_up, layer.down) for t in self._adapter(g)]
        self.scaling = float(layer.scaling)
        self.attention = attention._qualified_op_name

    @staticmethod
    def _adapter(group) -> tuple[torch.Tensor, ...]:
        """A group's adapters as kernels/layer.cpp's `adapt` reads them: A [in, r], spans [members, 5] and
        the members' B [r_m, out_m] one after another, flat; three empty tensors for none."""
        if group.a is None:
            return torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0)
        out = group.shared.sizes if group.shared is not None else [group.bases[0].out_features]
        spans, flat, offset = [], [], 0
        for i, cols, b in group.b:
            spans.append([cols.start, cols.stop - cols.start, sum(out[:i]), out[i], offset])
            flat.append(b.reshape(-1))
            offset += b.numel()
        return group.a.contiguous(), torch.tensor(spans), torch.cat(flat)

    def __call__(self, x: torch.Tensor, n_adapted: int, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, start: int, heads: int, lists: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """This layer's output [T, H] for x [T, H]; its rows' keys and values written into keys, values
        [kv_heads, capacity, d] from slot `start`, each row attending the keys `lists` name."""
        qkv, o, gate_up, down = self.products
        return torch.ops.taps_layer.w4a8_layer(
            x, *self.norms, self.eps, qkv, self.qkv_bias, o, gate_up, down, self.group, self.adapters, n_adapted,
            cos, sin, keys, values, start, heads, self.scaling, *lists, self.attention)
