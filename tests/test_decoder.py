"""taps.decoder: a grown drafter's forward walked without transformers' machinery gives
transformers' probabilities, round after round over its own cache; models it cannot walk keep
transformers' forward."""

import pytest
import torch

import taps.rowwise
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

from taps.decoder import KVCache, fits
from taps.drafters.grown import GrownConfig, GrownDrafter, add_adapters, on_mask_rows
from taps.target import Target
from tiny import tiny_model

MASK = 95
BLOCK = 4  # the root's row and 2 masks'


def full_forward(model, ids: list[int], n_masks: int) -> torch.Tensor:
    """transformers' forward over the whole text and the masks, no cache: [L, vocab] probabilities."""
    if hasattr(model, "mask_rows"):
        model.mask_rows.n = n_masks
    with torch.no_grad():
        logits = model(torch.tensor([ids + [MASK] * n_masks])).logits[0, -(n_masks + 1):]
    return torch.softmax(logits.float(), -1)


def adapted(family: str):
    """A tiny base whose every linear layer carries a random activated adapter (MaskRowAdapter)."""
    peft_model = add_adapters(tiny_model(family, seed=1), GrownConfig("base", MASK, block_size=BLOCK))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    return on_mask_rows(peft_model)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("with_adapters", [False, True])
@pytest.mark.parametrize("attention", ["kernel", "sdpa"])  # taps.rowwise's kernel where it runs, else SDPA
def test_drafts_equal_transformers_forward_round_after_round(family, with_adapters, attention, monkeypatch):
    if attention == "sdpa":
        monkeypatch.setattr(taps.rowwise, "kernel", lambda: None)
    elif taps.rowwise.kernel() is None:
        pytest.skip("taps' row-wise kernel does not run on this CPU")
    model = adapted(family) if with_adapters else tiny_model(family, seed=1)
    drafter = GrownDrafter(model, GrownConfig("base", MASK, block_size=BLOCK), Target(tiny_model(family)))
    assert drafter.decoder is not None and (drafter.decoder.rowwise is None) == (attention == "sdpa")
    drafter.cache = KVCache(3, 2, 16, torch.float32, torch.device("cpu"), capacity=2)  # grows twice below
    ids = [5, 17, 33, 2, 40, 8, 61, 12, 7, 70, 3]
    for end in (3, 4, 8, 11):  # 3, 1 and 4 new tokens a round
        got = drafter.draft(ids[:end], None)
        torch.testing.assert_close(got, full_forward(model, ids[:end], BLOCK - 2), atol=2e-5, rtol=1e-4)
        assert drafter.cache.length == end  # the masks left it again
    # the control: the last round over a cache missing one token is not transformers' (the comparison can fail)
    drafter.cache.crop(-2)
    short = torch.softmax(drafter.decoder(torch.tensor([ids[-1], MASK, MASK]), drafter.cache, 2, 3).float(), -1)
    assert not torch.allclose(short, full_forward(model, ids, BLOCK - 2), atol=1e-3)


def test_rollout_rows_through_the_decoder_are_the_bases_conditionals():
    base = tiny_model("qwen2", seed=1)
    drafter = GrownDrafter(base, GrownConfig("base", MASK, block_size=BLOCK), Target(tiny_model("qwen2")))
    ids = [5, 17, 33, 2, 40]
    deep = drafter.rollout(drafter.draft(ids, None), steps=4, min_reach=0.0)  # [5, vocab]
    path = list(ids)
    for row in deep:
        want = full_forward(base, path, 0)[0]
        torch.testing.assert_close(row, want, atol=2e-5, rtol=1e-4)
        path.append(int(want.argmax()))
    assert drafter.cache.length == len(ids)


def test_a_kv_cache_keeps_what_it_holds_when_it_grows():
    cache = KVCache(2, 1, 4, torch.float32, torch.device("cpu"), capacity=3)
    cache.keys[:, :, :3] = torch.arange(24.0).view(2, 1, 3, 4)
    cache.length = 3
    held = cache.keys[:, :, :3].clone()
    cache.reserve(5)
    assert cache.keys.shape[2] == 6 and torch.equal(cache.keys[:, :, :3], held)
    cache.crop(-2)
    assert cache.get_seq_length() == 1
    cache.crop(5)
    assert cache.length == 1


def tiny(config_class, **overrides):
    cfg = config_class(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **overrides)
    return AutoModelForCausalLM.from_config(cfg)


def test_models_it_cannot_walk_keep_transformers_forward():
    from peft import LoraConfig, get_peft_model

    assert fits(tiny_model("qwen2")) and fits(tiny_model("llama"))
    assert not fits(tiny(Qwen3Config, head_dim=16))  # q/k norms
    assert not fits(tiny(Qwen2Config, use_sliding_window=True, sliding_window=8, max_window_layers=0))
    lora = get_peft_model(tiny_model("qwen2"), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert not fits(lora.get_base_model())  # peft's own LoRA layers
    drafter = GrownDrafter(tiny(Qwen3Config, head_dim=16), GrownConfig("base", MASK, block_size=BLOCK),
                           Target(tiny_model("qwen2")))
    assert drafter.decoder is None
    ids = [5, 17, 33]
    torch.testing.assert_close(drafter.draft(ids, None), full_forward(drafter.model, ids, BLOCK - 2), atol=2e-5,
                               rtol=1e-4)


def test_a_decoder_walks_the_layers_present_when_a_sequence_starts():
    """A drafter is quantized after it is built (taps.drafters.loading): each sequence's decoder
    walks the layers the model has then."""
    from taps.quantize import quantize_linears

    model = tiny_model("qwen2", seed=1)
    drafter = GrownDrafter(model, GrownConfig("base", MASK, block_size=BLOCK), Target(tiny_model("qwen2")))
    first = drafter.decoder
    drafter.model = quantize_linears(drafter.model, "int8")
    drafter.start(())
    assert drafter.decoder is not first
    assert drafter.decoder.layers[0].qkv.bases[0] is drafter.model.model.layers[0].self_attn.q_proj


def test_a_w4a8_drafters_fused_layers_give_the_walks_drafts():
    """taps.layer's one call a layer (a grown drafter in w4a8 on taps.vnni) drafts what the Python walk drafts,
    adapters, q/k/v biases (qwen2) and a cache that grows included, up to float32 sums in another order (which
    a row's int8 rounding can turn into one code's step); the control: one token missing from the cache is
    far off. Both ways sample-free: probabilities compared."""
    from taps import layer
    from taps.decoder import Decoder
    from taps.weightonly import quantize_weights, w4a8_kernel

    if taps.rowwise.kernel() is None or w4a8_kernel() != "vnni" or layer.load() is not None:
        pytest.skip("taps.layer needs taps.vnni's w4a8 kernel and the row-wise kernel")
    # hidden 192: the keys' and values' B of 96 columns end in a partial block, x A of 192 inputs in two chunks
    for family, hidden in (("llama", 128), ("qwen2", 192)):
        peft_model = add_adapters(tiny_model(family, seed=1, hidden=hidden),
                                  GrownConfig("base", MASK, block_size=BLOCK))
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
        model = quantize_weights(on_mask_rows(peft_model), "w4a8", rowwise=False, option="--drafter-quant",
                                 fine_head=False)
        drafter = GrownDrafter(model, GrownConfig("base", MASK, block_size=BLOCK), Target(tiny_model(family)))
        assert drafter.decoder.fused is not None
        walk = Decoder(model)
        walk.fused = None  # the Python walk
        cache = walk.new_cache()
        ids = [5, 17, 33, 2, 40, 8, 61, 12, 7, 70, 3]
        for end in (3, 4, 8, 11):  # 3, 1 and 4 new tokens a round
            got = drafter.draft(ids[:end], None)  # [3, vocab]
            new = torch.tensor(ids[cache.length:end] + [MASK] * (BLOCK - 2))
            want = torch.softmax(walk(new, cache, BLOCK - 2, BLOCK - 1).float(), -1)
            cache.crop(-(BLOCK - 2))
            torch.testing.assert_close(got, want, atol=5e-3, rtol=0)
        drafter.cache.crop(-2)
        short = torch.softmax(drafter.decoder(torch.tensor([ids[-1], MASK, MASK]), drafter.cache, 2, 3).float(), -1)
        assert (short - want).abs().max() > 0.02
