"""taps.gqa: grouped K/V heads shared under a mask give transformers' own SDPA bits, without copies."""

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from taps.gqa import NAME, gqa_attention
from tiny import tiny_model


def _inputs(dtype, heads=6, kv_heads=2, rows=9, cached=40, dim=16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, rows, dim, generator=gen).to(dtype)
    k, v = (torch.randn(1, kv_heads, cached + rows, dim, generator=gen).to(dtype) for _ in range(2))
    mask = torch.ones(rows, cached + rows, dtype=torch.bool)
    mask[:, cached:] = torch.rand(rows, rows, generator=gen).lt(0.5).tril() | torch.eye(rows, dtype=torch.bool)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    return module, q, k, v, mask[None, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_calls_give_transformers_own_sdpa_bits(dtype):
    module, q, k, v, mask = _inputs(dtype)
    with torch.inference_mode():
        ours, _ = gqa_attention(module, q, k, v, mask, scaling=0.25)
        theirs, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)  # copies K/V per query head
        additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        assert torch.equal(gqa_attention(module, q, k, v, additive, scaling=0.25)[0],
                           sdpa_attention_forward(module, q, k, v, additive, scaling=0.25)[0])
    assert ours.shape == (1, 9, 6, 16) and torch.equal(ours, theirs)


def test_other_calls_are_transformers_own():
    module, q, k, v, mask = _inputs(torch.float32)
    q.requires_grad_(True)
    out, _ = gqa_attention(module, q, k, v, mask)  # training: transformers' function, with a backward
    out.sum().backward()
    assert q.grad is not None
    with torch.inference_mode():  # no mask: transformers already passes enable_gqa itself
        assert torch.equal(gqa_attention(module, q, k, v, None)[0], sdpa_attention_forward(module, q, k, v, None)[0])


def test_a_model_computes_the_same_logits_with_either_attention():
    model = tiny_model("qwen2")
    assert model.config._attn_implementation == NAME
    ids = torch.randint(0, 96, (1, 30))
    mask = torch.ones(30, 30, dtype=torch.bool).tril()
    mask[20:, 15:20] = False  # a tree's branches: rows that skip some earlier keys
    with torch.inference_mode():
        ours = model(ids, attention_mask=mask[None, None]).logits
        model.set_attn_implementation("sdpa")
        theirs = model(ids, attention_mask=mask[None, None]).logits
    assert torch.equal(ours, theirs)
