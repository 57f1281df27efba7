"""The DFlash drafter on tiny random targets: layout, loading checks, KV cache, lossless decoding."""

import json

import pytest
import torch
from safetensors.torch import save_file

from taps.decode import DecodeConfig, generate
from taps.drafters import DrafterKind, TargetInfo, drafter_kind, load_drafter
from taps.drafters.dflash import DFlashDrafter, read_dflash, save_dflash
from taps.drafters.dflash_model import (
    DFlashConfig,
    DFlashDrafterModel,
    RMSNorm,
    apply_rotary,
    default_target_layer_ids,
    rotary,
)
from taps.target import Target
from tiny import hf_greedy, tiny_model

LAYERS = (0, 2)  # tiny targets have 3 layers: too few for the default spread from 1 to L-3
MASK = 95
PROMPT = [5, 17, 33, 2, 9, 41]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return tiny_model(request.param)


def random_drafter(model, seed=1, **kw) -> DFlashDrafterModel:
    """A random drafter whose norms are not all ones, so that loading them is checked too."""
    kw = {"mask_token_id": MASK, "num_hidden_layers": 2, "target_layer_ids": LAYERS, "block_size": 8, **kw}
    torch.manual_seed(seed)
    drafter = DFlashDrafterModel(DFlashConfig.for_target(model.config, **kw))
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return drafter


def marginals(drafter: DFlashDrafter, target: Target, ids) -> torch.Tensor:
    features = target.prefill(ids[:-1])
    drafter.start(ids)
    return drafter.draft(ids, features)


def hub_config(model, **changes) -> dict:
    """A config.json as the public z-lab/*-DFlash-b16 folders write it, no `taps` block."""
    c = model.config
    raw = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 8,
        "bos_token_id": 1,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": list(LAYERS)},
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "head_dim": c.hidden_size // c.num_attention_heads,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 40960,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": 2,
        "num_key_value_heads": c.num_key_value_heads,
        "num_target_layers": c.num_hidden_layers,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": c.vocab_size,
    }
    raw.update(changes)
    return raw


def write_hub_folder(folder, model, raw=None, drafter=None):
    folder.mkdir(parents=True, exist_ok=True)
    drafter = drafter or random_drafter(model)
    save_file({k: v.to(torch.bfloat16) for k, v in drafter.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(raw or hub_config(model)))
    return drafter


def test_parameter_names_follow_the_public_layout(model):
    names = set(random_drafter(model).state_dict())
    per_layer = [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm",
    ]
    expected = {f"layers.{i}.{p}.weight" for i in range(2) for p in per_layer}
    expected |= {"norm.weight", "fc.weight", "hidden_norm.weight"}
    assert names == expected


def test_layout_round_trip(model, tmp_path):
    target = Target(model, feature_layers=LAYERS)
    drafter = random_drafter(model)
    before = marginals(DFlashDrafter(drafter, target), target, PROMPT)
    save_dflash(drafter, tmp_path / "d", TargetInfo.of(model, "tiny"))
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 8
    assert raw["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": list(LAYERS)}
    assert raw["taps"] == {"target": "tiny", "vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 3,
                           "target_layer_ids": list(LAYERS)}
    assert isinstance(drafter_kind(tmp_path / "d"), DrafterKind) and drafter_kind(tmp_path / "d").name == "dflash"
    loaded, _ = read_dflash(tmp_path / "d")
    assert loaded.config == drafter.config
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    fresh = Target(model)  # no feature layers: loading the drafter tells the target which to read
    after = marginals(load_drafter(str(tmp_path / "d"), fresh), fresh, PROMPT)
    assert fresh.feature_layers == LAYERS and torch.equal(before, after)
    assert after.shape == (7, 96) and torch.allclose(after.sum(-1), torch.ones(7))
    # saving again replaces the folder as a whole and leaves no temporary folder behind
    save_dflash(random_drafter(model, seed=2), tmp_path / "d", TargetInfo.of(model, "tiny"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_crash_while_saving_keeps_the_previous_folder(model, tmp_path, monkeypatch):
    drafter = random_drafter(model)
    save_dflash(drafter, tmp_path / "d", TargetInfo.of(model, "tiny"))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("taps.drafters.dflash.save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        save_dflash(random_drafter(model, seed=2), tmp_path / "d", TargetInfo.of(model, "tiny"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert torch.equal(read_dflash(tmp_path / "d")[0].fc.weight, drafter.fc.weight)


def test_draft_vocabulary_is_stored_and_zero_elsewhere(model, tmp_path):
    target = Target(model, feature_layers=LAYERS)
    vocab = [3, 50, 7, 11, 95, 60, 61]
    drafter = random_drafter(model, draft_vocab_ids=vocab)
    save_dflash(drafter, tmp_path / "d", TargetInfo.of(model, "tiny"))
    assert json.loads((tmp_path / "d" / "config.json").read_text())["dflash_config"]["draft_vocab_size"] == 7
    loaded = load_drafter(str(tmp_path / "d"), target)
    assert loaded.model.config.draft_vocab_ids == tuple(sorted(vocab))
    q = marginals(loaded, target, PROMPT)
    outside = torch.ones(96, dtype=torch.bool)
    outside[vocab] = False
    assert q.shape == (7, 96) and torch.all(q[:, outside] == 0)
    assert torch.allclose(q.sum(-1), torch.ones(7))
    # the head over the subset equals the full head restricted to it and renormalised
    full = marginals(DFlashDrafter(random_drafter(model), target), target, PROMPT)
    sub = full[:, sorted(vocab)]
    torch.testing.assert_close(q[:, sorted(vocab)], sub / sub.sum(-1, keepdim=True))


@pytest.mark.parametrize("style", ["b16", "transformers5"])
def test_hub_folder_without_taps_block_loads(model, tmp_path, style):
    raw = hub_config(model)
    if style == "transformers5":  # newer public configs move these two fields
        del raw["rope_theta"], raw["block_size"], raw["rope_scaling"]
        raw["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
        raw["dflash_config"]["block_size"] = 8
    drafter = write_hub_folder(tmp_path / "hub", model, raw)
    target = Target(model)
    loaded = load_drafter(str(tmp_path / "hub"), target)
    assert loaded.block_len == 7 and loaded.model.config.mask_token_id == MASK
    for name, tensor in drafter.state_dict().items():  # bfloat16 on disk, float32 in the target's dtype here
        assert torch.equal(loaded.model.state_dict()[name], tensor.to(torch.bfloat16).float()), name
    assert marginals(loaded, target, PROMPT).shape == (7, 96)


def test_mismatching_target_gives_clear_errors(model, tmp_path):
    save_dflash(random_drafter(model), tmp_path / "d", TargetInfo.of(model, "tiny"))
    other = Target(tiny_model("llama", vocab=120))
    with pytest.raises(ValueError, match=r"trained for target 'tiny' with vocab_size=96, but this target has vocab_size=120"):
        load_drafter(str(tmp_path / "d"), other)
    repointed = Target(model, feature_layers=(0, 1))
    load_drafter(str(tmp_path / "d"), repointed)
    assert repointed.feature_layers == LAYERS  # the drafter says which layers the target reads
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    raw["taps"]["num_hidden_layers"] = 30
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="num_hidden_layers=30, but this target has num_hidden_layers=3"):
        load_drafter(str(tmp_path / "d"), Target(model))
    # hub folders: only what the folder determines is checked
    write_hub_folder(tmp_path / "hub", model)
    with pytest.raises(ValueError, match="vocab_size=96 but the target's LM head has 120 rows"):
        load_drafter(str(tmp_path / "hub"), other)
    write_hub_folder(tmp_path / "deep", model, hub_config(model, num_target_layers=36))
    with pytest.raises(ValueError, match="num_target_layers=36, but this target has 3 layers"):
        load_drafter(str(tmp_path / "deep"), Target(model))
    bad = hub_config(model, dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 7]})
    write_hub_folder(tmp_path / "far", model, bad)
    with pytest.raises(ValueError, match=r"reads target layers \[7\], outside the target's 3 layers"):
        load_drafter(str(tmp_path / "far"), Target(model))


def test_unsupported_hub_variants_are_refused(model, tmp_path):
    for change, message in [
        ({"architectures": ["DFlash2DraftModel"]}, "only one taps implements"),
        ({"layer_types": ["sliding_attention"] * 2}, "full attention only"),
        ({"hidden_size": 32, "head_dim": 8}, "does not fit the DFlash layout"),
    ]:
        write_hub_folder(tmp_path / "x", model, hub_config(model, **change))
        with pytest.raises(ValueError, match=message):
            read_dflash(tmp_path / "x")


def test_bad_or_missing_mask_token_is_an_error(model, tmp_path):
    cfg = DFlashConfig.for_target(model.config, mask_token_id=MASK, target_layer_ids=LAYERS)
    for bad in (None, -1, 96, 1000):
        with pytest.raises(ValueError, match="mask_token_id"):
            DFlashConfig.for_target(model.config, mask_token_id=bad, target_layer_ids=LAYERS)
    assert cfg.mask_token_id == MASK
    write_hub_folder(tmp_path / "none", model, hub_config(model, dflash_config={"target_layer_ids": list(LAYERS)}))
    with pytest.raises(ValueError, match="dflash_config.mask_token_id is missing"):
        read_dflash(tmp_path / "none")
    write_hub_folder(tmp_path / "far", model, hub_config(model, dflash_config={"mask_token_id": 96, "target_layer_ids": list(LAYERS)}))
    with pytest.raises(ValueError, match="mask_token_id=96 is not a token id"):
        read_dflash(tmp_path / "far")


def test_config_validation():
    base = dict(hidden_size=64, num_hidden_layers=1, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=96, target_layer_ids=(0,), mask_token_id=1)
    assert DFlashConfig(**base).block_size == 16
    for change, message in [
        ({"num_key_value_heads": 3}, "must divide"),
        ({"block_size": 1}, "block_size"),
        ({"target_layer_ids": (1, 1)}, "distinct"),
        ({"target_layer_ids": ()}, "distinct"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"draft_vocab_ids": (1, 96)}, "draft_vocab_ids"),
    ]:
        with pytest.raises(ValueError, match=message):
            DFlashConfig(**{**base, **change})


def test_default_target_layers_spread_from_1_to_L_minus_3():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # z-lab Qwen3-4B/8B-DFlash-b16
    assert default_target_layer_ids(52, 5) == (1, 13, 25, 37, 49)
    assert default_target_layer_ids(48, 8) == (1, 7, 14, 20, 26, 32, 39, 45)
    assert default_target_layer_ids(30, 1) == (15,)
    with pytest.raises(ValueError, match="target_layer_ids explicitly"):
        default_target_layer_ids(3, 2)


def test_incremental_context_equals_one_forward(model):
    """Context K/V fed round by round (as decode.py does) gives the marginals of one forward."""
    target = Target(model, feature_layers=LAYERS)
    ids = list(range(3, 40))
    features = target.prefill(ids)  # [37, 128]: any feature rows will do, as long as both runs share them
    drafter = DFlashDrafter(random_drafter(model), target)
    fresh = DFlashDrafter(random_drafter(model), target)
    drafter.start(ids[:6])
    seen = 0
    for end in (6, 7, 12, 13, 14, 25, 37):  # ids[:end] committed, root ids[end - 1]
        got = drafter.draft(ids[:end], features[seen : end - 1])
        seen = end - 1
        fresh.start(ids[:end])
        want = fresh.draft(ids[:end], features[: end - 1])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        assert drafter.cache.length == end - 1  # the cache holds context only, never the block


def test_out_of_step_context_is_an_error(model):
    target = Target(model, feature_layers=LAYERS)
    drafter = DFlashDrafter(random_drafter(model), target)
    features = target.prefill(PROMPT)
    drafter.start(PROMPT)
    with pytest.raises(ValueError, match="holds 0 context positions and got 6 more, but the root is at position 5"):
        drafter.draft(PROMPT, features)  # one row too many: the root's features are not known yet
    assert drafter.draft(PROMPT, features[:-1]).shape == (7, 96)
    single = DFlashDrafter(random_drafter(model), target)
    single.start([7])
    assert single.draft([7], None).shape == (7, 96)  # a one-token prompt: no context at all


def test_rotary_and_norm_match_transformers_qwen3():
    """The public checkpoints were trained with transformers' Qwen3 modules."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb as hf_rotary

    cfg = Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16, rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    pos = torch.tensor([[0, 3, 17, 900, 4000]])
    x = torch.randn(1, 4, 5, 16)
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, pos)
    ours = rotary(pos, 16, 1e6, torch.float32)
    torch.testing.assert_close(ours, (cos, sin))
    torch.testing.assert_close(apply_rotary(x, *ours), hf_rotary(x, x, cos, sin)[0])
    h = torch.randn(3, 64)
    ref, mine = Qwen3RMSNorm(64, eps=1e-6), RMSNorm(64, 1e-6)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        mine.weight.copy_(ref.weight)
    torch.testing.assert_close(mine(h), ref(h))


@pytest.mark.parametrize("method", ["chain", "ddtree"])
def test_decoding_with_a_dflash_drafter_is_lossless(model, method, tmp_path):
    save_dflash(random_drafter(model), tmp_path / "d", TargetInfo.of(model, "tiny"))
    target = Target(model)
    drafter = load_drafter(str(tmp_path / "d"), target)
    res = generate(target, PROMPT, DecodeConfig(method=method, budget=8, max_new_tokens=40, stop_ids=()), drafter)
    assert res.token_ids == hf_greedy(model, PROMPT, 40)


def test_a_hub_id_loads_from_the_hugging_face_cache_offline(model, tmp_path, monkeypatch):
    """Issue 19: a DFlash checkpoint named by its hub id loads unchanged. No hub is reachable here, so
    the cache is prepared as huggingface_hub lays it out (models--OWNER--NAME/snapshots/COMMIT and
    refs/main) and the hub is offline: exactly what a user's machine holds after one download."""
    import huggingface_hub.constants

    import taps
    from taps.hub import AssetError

    repo, commit = tmp_path / "hub" / "models--z-lab--tiny-DFlash-b16", "0123456789abcdef0123456789abcdef01234567"
    drafter = write_hub_folder(repo / "snapshots" / commit, model)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = taps.load(model, "z-lab/tiny-DFlash-b16", method="chain", budget=4)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(spec.drafter.model.state_dict()[name], tensor.to(torch.bfloat16).float()), name
    with pytest.raises(AssetError, match="z-lab/other-DFlash-b16 is not in the Hugging Face cache"):
        taps.load(model, "z-lab/other-DFlash-b16", method="chain")


def test_as_transformers_assistant_computes_what_our_drafter_computes(model):
    """transformers' DFlash assistant (hf-dflash) over the same context features and block: the same
    final hidden states, so it drafts the same tokens from the same head."""
    from transformers.cache_utils import DFlashCache

    from taps.drafters.dflash import as_transformers_assistant

    drafter = random_drafter(model).eval()
    assistant = as_transformers_assistant(drafter)
    context, block = 5, drafter.config.block_size
    torch.manual_seed(0)
    features = torch.randn(1, context, len(LAYERS) * drafter.config.hidden_size)
    embeds = torch.randn(1, block, drafter.config.hidden_size)
    positions = torch.arange(context + block)[None]
    cache = DFlashCache(config=assistant.config)
    cache.set_previous_accepted_tokens(context)  # what transformers' DFlash candidate generator sets
    with torch.no_grad():
        ours = drafter(embeds, positions[:, context:], features, positions[:, :context])
        theirs = assistant(noise_embeds=embeds, context_hidden_states=features, position_ids=positions,
                           attention_mask=torch.ones(1, context + block, dtype=torch.long),
                           past_key_values=cache).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert not torch.allclose(ours, drafter(embeds.flip(1), positions[:, context:], features, positions[:, :context]))


def test_transformers_layer_ids_index_layer_outputs_as_ours_do(model):
    """transformers asks the target for the assistant's `target_layer_ids` as `output_hidden_states`;
    that tuple holds layer i's output at i, where the full tuple (embeddings first) holds it at i + 1,
    which is what our layer ids read (taps.target): the ids carry over unchanged."""
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        chosen = model(ids, output_hidden_states=list(LAYERS)).hidden_states
        every = model(ids, output_hidden_states=True).hidden_states
    for i in LAYERS:
        assert torch.equal(chosen[i], every[i + 1])
