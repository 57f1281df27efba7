"""The grown drafter (issue 3, kind b) on tiny random Qwen2 models: training rows equal inference,
training learns, the folder round-trips, decoding stays lossless, bad input is refused."""

import copy as copy_module
import json
import warnings

import pytest
import torch

from taps.decode import DecodeConfig, generate
from taps.drafters import TargetInfo, drafter_kind, load_drafter, shipped_drafter
from taps.drafters.grown import (
    GrownConfig,
    GrownDrafter,
    add_adapters,
    block_layout,
    block_logits,
    masks_block_logits,
    masks_only,
    read_grown,
    save_grown,
    set_draft_vocabulary,
)
from taps.drafters.loading import SHIPPED
from taps.methods import every_method
from taps.quantize import quantized_layers
from taps.rounds import Rollout
from taps.target import Target
from taps.train.drafter import TrainDrafterConfig, train_drafter
from tiny import greedy_sequences, hf_greedy, tiny_model

MASK = 95


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen2", seed=0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, target):
    """The target and a smaller-seeded base saved as folders, as `taps models fetch` leaves them."""
    root = tmp_path_factory.mktemp("models")
    target.save_pretrained(root / "target")
    tiny_model("qwen2", seed=1).save_pretrained(root / "base")
    return root


@pytest.fixture(scope="module")
def sequences(target):
    return greedy_sequences(target)


def test_block_layout_mask_matches_brute_force():
    S, block, anchors = 12, 5, torch.tensor([0, 4, 10])
    lay = block_layout(torch.arange(S), anchors, block, MASK)
    m = block - 2
    assert lay.input_ids.tolist() == list(range(S)) + [MASK] * (3 * m)
    for q in range(lay.mask.shape[0]):
        for k in range(lay.mask.shape[1]):
            if q < S:  # context: causal, never a mask
                want = k <= q
            else:
                i, j = divmod(q - S, m)
                if k < S:
                    want = k <= anchors[i].item()
                else:
                    i2, j2 = divmod(k - S, m)
                    want = i2 == i and j2 <= j
            assert lay.mask[q, k].item() == want, (q, k)
    # mask j of block i sits j + 1 places after its anchor; slot 1 reads the anchor's own row
    assert lay.position_ids[S:].view(3, m).tolist() == [[a + j for j in range(1, m + 1)] for a in anchors.tolist()]
    assert lay.rows[:, 1].tolist() == anchors.tolist()


@pytest.mark.parametrize("vocab", [None, torch.arange(3, 96, 2)])
def test_one_pass_training_forward_equals_inference(target, sequences, vocab):
    """Block i of the training forward gives exactly the marginals the drafter produces at
    inference with the root at anchor i (and its cache built over earlier rounds); with a draft
    vocabulary, the softmax over its ids and 0 elsewhere."""
    base = tiny_model("qwen2", seed=1)
    cfg = GrownConfig("base", MASK, block_size=6)
    peft_model = add_adapters(base, cfg)
    with torch.no_grad():  # adapters start at zero: make them matter
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "trainable_tokens" in name:
                p.normal_(0, 0.05)
    ids = sequences[0]
    anchors = torch.tensor([0, 3, 9, 20, len(ids) - 2])
    lm = peft_model.get_base_model()
    with torch.no_grad():
        logits = block_logits(lm.model, lm.lm_head, block_layout(torch.tensor(ids), anchors, 6, MASK))  # [N, 6, 96]
    probs = torch.zeros_like(logits)
    kept = slice(None) if vocab is None else vocab
    probs[..., kept] = torch.softmax(logits[..., kept], -1)
    merged = peft_model.merge_and_unload()
    drafter = GrownDrafter(merged, cfg, Target(target), vocab=vocab)
    drafter.start(ids[:1])
    for i, a in enumerate(anchors.tolist()):
        q = drafter.draft(ids[: a + 1], None)  # the cache grows round by round, as in decoding
        torch.testing.assert_close(q, probs[i, 1:], atol=2e-5, rtol=1e-4)


def test_activated_adapters_train_on_a_cached_context_with_the_one_forwards_logits_and_gradients(sequences):
    """adapt="masks" trains in two forwards (the context without autograd, then the masks against its
    cache): the same logits and the same adapter gradients as the one forward over the layout."""
    cfg = GrownConfig("base", MASK, block_size=6, adapt="masks")
    peft_model = add_adapters(tiny_model("qwen2", seed=1), cfg)
    with torch.no_grad():  # adapters start at zero: make them matter
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "trainable_tokens" in name:
                p.normal_(0, 0.05)
    ids = sequences[0]
    layout = block_layout(torch.tensor(ids), torch.tensor([0, 3, 9, 20, len(ids) - 2]), 6, MASK)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    lm = peft_model.get_base_model()
    with masks_only(peft_model, cfg, layout.masks):
        one = block_logits(lm.model, lm.lm_head, layout)  # [N, 6, 96]
    want = torch.autograd.grad(one.logsumexp(-1).sum(), params)
    two = masks_block_logits(peft_model, cfg, layout)
    torch.testing.assert_close(two, one, atol=2e-5, rtol=1e-4)
    got = torch.autograd.grad(two.logsumexp(-1).sum(), params)
    assert any(g.abs().max() > 1e-3 for g in want)  # the adapters do move the loss
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4)
    # control: the masks with the adapters acting on the context too would differ
    with masks_only(peft_model, cfg, len(layout.input_ids)):
        assert not torch.allclose(block_logits(lm.model, lm.lm_head, layout), one, atol=1e-3)


def config(tmp_path, folders, data_file, **kw) -> TrainDrafterConfig:
    base = dict(target=str(folders / "target"), data=str(data_file), out=str(tmp_path / "run"), mask_token_id=MASK,
                kind="grown", base=str(folders / "base"), lora_rank=4, block_size=6, gamma=3.0, anchors_per_sequence=12,
                sequences_per_step=2, epochs=4, lr=1e-2, eval_sequences=2, eval_every=8, save_every=8, progress=False)
    return TrainDrafterConfig(**{**base, **kw})


def test_train_a_grown_drafter_and_decode_losslessly(tmp_path, folders, sequences, target):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": s}) + "\n" for s in sequences))
    result = train_drafter(config(tmp_path, folders, data))
    assert result.step == result.total_steps == 16
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert records[-1]["eval_loss"] < 0.8 * records[0]["eval_loss"], records
    # the folder holds the adapters only (the base comes from its own folder or `taps models fetch`)
    files = {p.name for p in result.drafter_dir.iterdir()}
    assert {"grown.json", "adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    cfg, info = read_grown(result.drafter_dir)
    assert cfg.base == str(folders / "base") and info["vocab_size"] == 96
    assert drafter_kind(result.drafter_dir).name == "grown"
    tgt = Target(target, feature_layers=(0, 2))
    drafter = load_drafter(str(result.drafter_dir), tgt)
    assert tgt.feature_layers == ()  # a grown drafter reads no target features
    assert drafter.block_len == 5
    prompt = [5, 17, 33, 2]
    ref = hf_greedy(target, prompt, 30)
    for method in ("chain", "ddtree"):
        res = generate(tgt, prompt, DecodeConfig(method, budget=8, max_new_tokens=30, stop_ids=()), drafter)
        assert res.token_ids == ref, method
    int8 = load_drafter(str(result.drafter_dir), tgt, quantize="int8")  # taps.quantize, through the folder
    assert quantized_layers(int8.model) > 0
    assert generate(tgt, prompt, DecodeConfig("ddtree", budget=8, max_new_tokens=30, stop_ids=()), int8).token_ids == ref
    # resuming a finished run is a no-op; other settings in the same folder are refused
    assert train_drafter(config(tmp_path, folders, data)).step == 16
    with pytest.raises(ValueError, match="other settings"):
        train_drafter(config(tmp_path, folders, data, lora_rank=8))


def test_a_drafter_for_another_target_is_refused(tmp_path, folders, target):
    base = tiny_model("qwen2", seed=1)
    cfg = GrownConfig(str(folders / "base"), MASK, block_size=4)
    save_grown(add_adapters(base, cfg), cfg, tmp_path / "d", TargetInfo("other", 128, 64, 3))
    with pytest.raises(ValueError, match="vocab_size=128"):
        load_drafter(str(tmp_path / "d"), Target(target))


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="needs base"):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="grown")
    with pytest.raises(ValueError, match='kind "dflash" only'):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="grown", base="b", init_layers="last")
    with pytest.raises(ValueError, match="draft_vocab_size must be >= 1"):
        GrownConfig("b", 1, draft_vocab_size=0)
    with pytest.raises(ValueError, match="kind must be"):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="lora")
    with pytest.raises(ValueError, match="block_size"):
        GrownConfig("b", 1, block_size=1)
    with pytest.raises(ValueError, match="not a row"):
        add_adapters(tiny_model("qwen2"), GrownConfig("b", 500))
    with pytest.raises(ValueError, match="no grown.json"):
        read_grown(tmp_path)


def test_the_shipped_grown_drafter_names_its_base_and_target():
    from taps.assets import MODELS

    folder = SHIPPED / "qwen2.5-coder-1.5b"
    assert shipped_drafter("qwen2.5-coder-1.5b") == str(folder) and drafter_kind(folder).name == "grown"
    cfg, info = read_grown(folder)
    assert cfg.base in MODELS and info["name"] == "qwen2.5-coder-1.5b" and info["vocab_size"] == 151936
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == cfg.base
    assert (folder / "adapter_model.safetensors").stat().st_size < 60e6  # the limit per shipped drafter


def test_rollout_rows_are_the_drafters_conditionals_along_its_greedy_path(target):
    """Row d of a rolled-out draft is the base's next-token distribution after the context and
    its first d greedy tokens; the cache holds the committed text only afterwards."""
    base = tiny_model("qwen2", seed=1)
    drafter = GrownDrafter(base, GrownConfig("base", MASK, block_size=4), Target(target))
    ids = [5, 17, 33, 2, 40]
    marginals = drafter.draft(ids, None)  # [3, vocab]
    deep = drafter.rollout(marginals, steps=6, min_reach=0.0)
    assert deep.shape == (7, 96)
    path = list(ids)
    with torch.no_grad():
        for d in range(7):
            want = torch.softmax(base(torch.tensor([path], device=base.device)).logits[0, -1], -1)
            torch.testing.assert_close(deep[d], want, atol=2e-5, rtol=1e-4)
            path.append(int(want.argmax()))
    assert drafter.cache.get_seq_length() == len(ids)
    # min_reach stops the path once its probability falls under it; later rows keep the block marginals
    reach = torch.cumprod(deep.max(-1).values, 0)
    cut = int((reach >= 0.5).sum())
    short = drafter.rollout(drafter.draft(ids, None), steps=6, min_reach=0.5)
    assert short.shape[0] == max(3, cut + 1)
    torch.testing.assert_close(short[: cut + 1], deep[: cut + 1], atol=2e-5, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_a_chats_next_turn_keeps_the_drafters_cache_of_what_the_target_kept(target):
    """With reuse_prefix, a drafter keeps its K/V of the prompt's prefix the target kept (the previous turn)
    and is fed only the rest; its drafts then equal a fresh drafter's and the output stays greedy. Without
    reuse_prefix, or where the new prompt leaves the old one, it keeps nothing past the common part."""
    tgt = Target(target)
    drafter = GrownDrafter(noisy_copy(target, 0.05), GrownConfig("base", MASK, block_size=4), tgt)
    fed = []  # the token count of each drafter forward
    forward = drafter._logits
    drafter._logits = lambda tokens, *rest: fed.append(len(tokens)) or forward(tokens, *rest)
    cfg = DecodeConfig("ddtree", budget=6, max_new_tokens=12, stop_ids=())
    first = [5, 17, 33, 2, 40, 8]
    answer = generate(tgt, first, cfg, drafter, reuse_prefix=True).token_ids
    turn2 = first + answer + [61, 7, 19]

    def second_turn(prompt, reuse):
        fed.clear()
        res = generate(tgt, prompt, cfg, drafter, reuse_prefix=reuse)
        assert res.token_ids == hf_greedy(target, prompt, 12)
        return fed[0]

    kept = tgt.n_cached  # the target's cache after the first turn: its prompt and answer but the last token
    had = len(drafter.cached)  # the drafter's: up to its last draft's root, the first turn's last round short
    assert len(first) < had <= kept
    assert second_turn(turn2, reuse=True) == len(turn2) - had + 2  # the rest of the prompt and 2 masks
    assert tgt.reused == kept
    assert second_turn(turn2, reuse=False) == len(turn2) + 2  # a bench's prompt: everything again
    changed = turn2[:4] + [9] + turn2[5:]  # leaves the previous prompt at token 4
    generate(tgt, turn2, cfg, drafter, reuse_prefix=True)
    assert second_turn(changed, reuse=True) == len(changed) - 4 + 2
    # the kept cache drafts as a fresh one does
    generate(tgt, turn2, cfg, drafter, reuse_prefix=True)
    drafter.start(turn2, reused=len(turn2) - 3)
    assert len(drafter.cached) > 0
    fresh = GrownDrafter(drafter.model, drafter.cfg, tgt)
    torch.testing.assert_close(drafter.draft(turn2, None), fresh.draft(turn2, None), atol=1e-5, rtol=1e-4)


def test_a_shallower_draft_is_the_first_rows_of_a_full_one(target):
    """`prefix_drafts`: a draft of `slots` positions feeds slots - 1 masks and gives the full draft's first
    `slots` rows (each mask attends to the rows before it alone); the cache keeps the committed text only."""
    tgt = Target(target)
    drafter = GrownDrafter(noisy_copy(target, 0.05), GrownConfig("base", MASK, block_size=6), tgt)
    assert drafter.prefix_drafts and drafter.block_len == 5
    ids = [5, 17, 33, 2, 40, 8]
    full = drafter.draft(ids, None)  # [5, vocab]
    for slots in range(1, 6):
        drafter.start(())
        part = drafter.draft(ids, None, slots)
        assert part.shape == (slots, 96)
        torch.testing.assert_close(part, full[:slots], atol=1e-6, rtol=1e-5)
        assert drafter.cache.get_seq_length() == len(ids)
    assert drafter.draft(ids + [3], None, 9).shape == (5, 96)  # never more than L


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("method", ["ddtree", "taps", "chain", "taps+copy"])
def test_drafts_go_as_deep_as_the_last_drafted_tree_plus_one_and_decode_losslessly(target, method):
    """A sequence's first draft asks for all L positions; each later one for the previous drafted tree's
    depth + 1, at most L and at most what the round may still commit; a copy round's tree changes nothing.
    The output stays the target's greedy one."""
    tgt = Target(target)
    drafter = GrownDrafter(noisy_copy(target, 0.05), GrownConfig("base", MASK, block_size=6), tgt)
    asked = []
    draft = drafter.draft
    drafter.draft = lambda ids, features, slots=None: asked.append(slots) or draft(ids, features, slots)
    rounds = []  # (tree depth, drafted by the drafter, tokens committed)
    prompt = [5, 17, 33, 2]
    cfg = DecodeConfig(method, budget=6, max_new_tokens=40, stop_ids=())
    res = generate(tgt, prompt, cfg, drafter, on_round=lambda r: rounds.append(
        (int(r.tree.depths.max()), r.proposal is not None and r.proposal.fixed is None, len(r.committed))))
    assert res.token_ids == hf_greedy(target, prompt, 40)
    want, slots, done = [], 5, 0
    for depth, drafted, committed in rounds:
        if drafted:
            want.append(min(slots, 40 - done - 1))
            slots = min(5, depth + 1)
        done += committed
    assert asked == want
    if method == "chain":
        assert set(want[:-2]) == {5}  # a chain uses every position drafted: always L
    elif method == "taps+copy":
        assert not all(drafted for _, drafted, _ in rounds)  # copy rounds among them
    else:
        assert min(want[:-2]) < 5  # the noisy drafter's trees do not always use every position


def noisy_copy(model, noise: float):
    """`model` with Gaussian noise on its head: its greedy path agrees with the model's only partly."""
    copy = copy_module.deepcopy(model)
    with torch.no_grad():
        w = copy.lm_head.weight
        w.add_(noise * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)).to(w.device))  # CPU draws
    return copy


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
# rollouts all accepted, partly, hardly ever (the last: many rounds, slow set)
@pytest.mark.parametrize("base", ["target", "noisy", pytest.param("unrelated", marks=pytest.mark.slow)])
def test_rollout_methods_decode_losslessly(target, base):
    tgt = Target(target)
    bases = {"target": lambda: target, "noisy": lambda: noisy_copy(target, 0.05),
             "unrelated": lambda: tiny_model("qwen2", seed=1)}
    name, base = base, bases[base]()
    drafter = GrownDrafter(base, GrownConfig("base", MASK, block_size=4), tgt)
    prompt = [5, 17, 33, 2]
    ref = hf_greedy(target, prompt, 40)
    for method in [m for m in every_method() if "rollout" in m] + ["taps+copy+rollout"]:
        cfg = DecodeConfig(method, budget=12, max_new_tokens=40, stop_ids=(), rollout=Rollout(reach=0.0))
        res = generate(tgt, prompt, cfg, drafter)
        assert res.token_ids == ref, method
        if base is target and method == "chain+rollout":  # the rollout is the target's greedy path: all accepted
            assert res.stats.accepted_per_round[:-1] == [12] * (len(res.stats.accepted_per_round) - 1), method
        if name == "noisy":
            assert 1.2 < res.stats.tau < 5, method  # partly accepted


def test_rollout_needs_a_drafter_that_can_roll_out(target):
    tgt = Target(target)
    with pytest.raises(ValueError, match="only a grown drafter"):
        generate(tgt, [5, 17, 33], DecodeConfig("taps+rollout", max_new_tokens=4), load_drafter("noisy", tgt))
    with pytest.raises(ValueError, match="rollout steps"):
        Rollout(steps=-1)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_a_rollout_round_passes_its_own_drafting_time_to_the_policy(target):
    """taps+rollout chooses its size with the round's block pass + rollout time as t_draft."""
    rounds = []
    tgt = Target(target)
    drafter = GrownDrafter(target, GrownConfig("base", MASK, block_size=4), tgt)
    generate(tgt, [5, 17, 33, 2], DecodeConfig("taps+rollout", budget=8, max_new_tokens=20, stop_ids=()), drafter,
             on_round=rounds.append)
    proposals = [r.proposal for r in rounds if r.proposal is not None]
    assert proposals and all(p.draft_seconds > 0 and p.context is not None for p in proposals)


def test_keep_layers_spreads_the_kept_layers_and_renumbers_them_for_the_cache():
    from taps.drafters.grown import keep_layers

    full = tiny_model("qwen2", seed=1)  # 3 layers
    originals = list(full.model.layers)
    ids = torch.tensor([[5, 17, 33, 2, 9]])
    same = keep_layers(copy_module.deepcopy(full), 3)  # all kept: the same model
    assert torch.equal(same(ids).logits, full(ids).logits)
    short = keep_layers(full, 2)
    assert [originals.index(layer) for layer in short.model.layers] == [0, 2]
    assert [layer.self_attn.layer_idx for layer in short.model.layers] == [0, 1]
    assert short.config.num_hidden_layers == 2 and len(short.config.layer_types) == 2
    # the KV cache indexes the kept layers: cached decoding equals full forwards
    out = short.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6, pad_token_id=0)
    seq = ids
    for _ in range(6):
        seq = torch.cat([seq, short(seq).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, seq)
    with pytest.raises(ValueError, match="between 1 and the base's 2 layers"):
        keep_layers(short, 3)


def test_a_grown_drafter_on_fewer_base_layers_trains_saves_and_decodes_losslessly(tmp_path, folders, sequences, target):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": s}) + "\n" for s in sequences))
    result = train_drafter(config(tmp_path, folders, data, base_layers=2))
    cfg, _ = read_grown(result.drafter_dir)
    assert cfg.base_layers == 2
    tgt = Target(target)
    drafter = load_drafter(str(result.drafter_dir), tgt)
    assert len(drafter.model.model.layers) == 2
    prompt = [5, 17, 33, 2]
    ref = hf_greedy(target, prompt, 20)
    res = generate(tgt, prompt, DecodeConfig("ddtree", budget=8, max_new_tokens=20, stop_ids=()), drafter)
    assert res.token_ids == ref


def test_a_grown_drafter_with_a_draft_vocabulary_trains_saves_and_decodes_losslessly(tmp_path, folders, sequences,
                                                                                    target):
    """--draft-vocab-size: the training data's most frequent ids, kept in the folder; the loaded
    drafter's head has that many rows, other ids get probability 0, and decoding stays exact
    (also int8, and with a vocabulary that misses tokens the target emits)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": s}) + "\n" for s in sequences))
    result = train_drafter(config(tmp_path, folders, data, draft_vocab_size=24))
    cfg, _ = read_grown(result.drafter_dir)
    assert cfg.draft_vocab_size == 24 and (result.drafter_dir / "draft_vocab.safetensors").is_file()
    tgt = Target(target)
    drafter = load_drafter(str(result.drafter_dir), tgt)
    assert drafter.model.get_output_embeddings().weight.shape == (24, 64)
    prompt = [5, 17, 33, 2]
    q = drafter.draft(prompt, None)  # [L, vocab]
    assert q.shape == (5, 96) and int((q[0] > 0).sum()) == 24
    torch.testing.assert_close(q.sum(-1), torch.ones(5))
    ref = hf_greedy(target, prompt, 30)
    assert not set(ref) <= set(torch.nonzero(q[0]).flatten().tolist())  # some answer tokens cannot be drafted
    for quant in ("none", "int8"):
        d = load_drafter(str(result.drafter_dir), tgt, quantize=quant)
        for method in ("chain", "ddtree", "taps"):
            res = generate(tgt, prompt, DecodeConfig(method, budget=8, max_new_tokens=30, stop_ids=()), d)
            assert res.token_ids == ref, (quant, method)


def test_saving_under_a_packaged_base_name_asks_no_hub_keeps_the_mask_row_and_writes_no_blank_card(tmp_path):
    """A packaged name (no folder of that name here) as the base: peft's "auto" embedding check would
    query the hub for its config.json and warn; the trained mask row is saved all the same."""
    from safetensors.torch import load_file

    cfg = GrownConfig("qwen2.5-coder-0.5b", MASK, block_size=4)
    peft_model = add_adapters(tiny_model("qwen2", seed=1), cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "trainable_tokens" in name:
                p.fill_(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_grown(peft_model, cfg, tmp_path / "d", TargetInfo("t", 96, 64, 3))
    saved = load_file(tmp_path / "d" / "adapter_model.safetensors")
    assert any("trainable_tokens" in k and torch.all(v == 0.25) for k, v in saved.items()), list(saved)
    assert not (tmp_path / "d" / "README.md").exists()  # no blank peft model card naming this machine's folders
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "README.md").write_text("mine\n")
    save_grown(peft_model, cfg, tmp_path / "e", TargetInfo("t", 96, 64, 3))
    assert "mine" in (tmp_path / "e" / "README.md").read_text()  # a card of the user's own stays (peft adds to it)


def test_a_draft_vocabulary_given_afterwards_renormalises_the_drafters_marginals(tmp_path, folders, target):
    base = tiny_model("qwen2", seed=1)
    cfg = GrownConfig(str(folders / "base"), MASK, block_size=4)
    save_grown(add_adapters(base, cfg), cfg, tmp_path / "d", TargetInfo("t", 96, 64, 3))
    tgt = Target(target)
    full = load_drafter(str(tmp_path / "d"), tgt).draft([5, 17, 33], None)  # [3, vocab]
    vocab = [1, 5, 9, 40, 41, 42, 90]
    set_draft_vocabulary(tmp_path / "d", vocab)
    restricted = load_drafter(str(tmp_path / "d"), tgt).draft([5, 17, 33], None)
    want = torch.zeros_like(full)
    want[:, vocab] = full[:, vocab] / full[:, vocab].sum(-1, keepdim=True)
    torch.testing.assert_close(restricted, want, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="token ids of the target's 96-token"):
        set_draft_vocabulary(tmp_path / "d", [3, 96])
    (tmp_path / "d" / "draft_vocab.safetensors").unlink()
    with pytest.raises(ValueError, match="draft_vocab_size=7 disagrees"):
        load_drafter(str(tmp_path / "d"), tgt)


def test_activated_adapters_keep_the_roots_row_and_train_infer_and_decode_losslessly(tmp_path, folders, sequences,
                                                                                    target):
    """adapt="masks": the adapters act on the mask rows only, so the root's row is the base's own
    next-token distribution (not so for adapters on every token: the control); the training
    forward equals inference; the folder loads unmerged and decodes exactly, also in int8."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": s}) + "\n" for s in sequences))
    ids = sequences[0][:12]
    base = tiny_model("qwen2", seed=1)
    with torch.no_grad():
        want_root = torch.softmax(base(torch.tensor([ids])).logits[0, -1], -1)
    tgt = Target(target)
    for adapt in ("masks", "all"):
        result = train_drafter(config(tmp_path, folders, data, adapt=adapt, out=str(tmp_path / adapt)))
        assert read_grown(result.drafter_dir)[0].adapt == adapt
        drafter = load_drafter(str(result.drafter_dir), tgt)
        q = drafter.draft(ids, None)  # [L, vocab]
        same_root = torch.allclose(q[0], want_root, atol=1e-5)
        assert same_root == (adapt == "masks"), adapt
    assert not torch.allclose(q[1], drafter.draft(ids, None)[1] * 0)  # the masks' rows are not empty
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # peft's CAUSAL_LM notice is not for a drafter's user (grown.quiet_alora)
        masked = load_drafter(str(tmp_path / "masks" / "drafter"), tgt)
    assert masked.model.mask_rows.n == 0  # unmerged (MaskRowAdapter): activated adapters skip the context
    # a sequence's start reads no `.weight` of the embedding: peft's wrapper (the mask row) builds its whole
    # merged table on each read (130 ms a start for the 0.5B's; taps.decoder)
    wrapper = masked.decoder.embed
    assert type(wrapper).__name__ == "TrainableTokensWrapper"
    masked.decoder.embed = Unread(wrapper)
    masked.start(ids)
    assert masked.draft(ids, None).shape[0] == masked.block_len
    masked.decoder.embed = wrapper
    # the training forward (peft's activated LoRA on the folder's adapters) equals the drafter's rounds
    from peft import PeftModel

    cfg = read_grown(tmp_path / "masks" / "drafter")[0]
    peft_model = PeftModel.from_pretrained(tiny_model("qwen2", seed=1), str(tmp_path / "masks" / "drafter"))
    anchors = torch.tensor([2, 7, len(ids) - 2])
    layout = block_layout(torch.tensor(ids), anchors, cfg.block_size, MASK)
    with torch.no_grad(), masks_only(peft_model, cfg, len(layout.input_ids) - len(ids)):
        lm = peft_model.get_base_model()
        probs = torch.softmax(block_logits(lm.model, lm.lm_head, layout), -1)
    for i, a in enumerate(anchors.tolist()):
        torch.testing.assert_close(masked.draft(ids[: a + 1], None), probs[i, 1:], atol=2e-5, rtol=1e-4)
    prompt = [5, 17, 33, 2]
    ref = hf_greedy(target, prompt, 30)
    from taps.weightonly import _int8_kernel_is_exact

    for quant in ("none", "int8") + ("w8a8",) * _int8_kernel_is_exact():
        d = load_drafter(str(tmp_path / "masks" / "drafter"), tgt, quantize=quant)
        if quant == "w8a8":  # q, k, v under their adapters share one product (taps.weightonly), drafts stay close
            attn = d.model.model.layers[0].self_attn
            assert attn.q_proj.base_layer.shared is attn.v_proj.base_layer.shared is not None
            torch.testing.assert_close(d.draft(ids, None), masked.draft(ids, None), atol=0.05, rtol=0)
        for method in ("chain", "ddtree", "taps+rollout"):
            res = generate(tgt, prompt, DecodeConfig(method, budget=8, max_new_tokens=30, stop_ids=()), d)
            assert res.token_ids == ref, (quant, method)


class Unread(torch.nn.Module):
    """An embedding's forward whose `.weight` must not be read."""

    def __init__(self, embed: torch.nn.Module):
        super().__init__()
        self.embed = embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)

    @property
    def weight(self):
        pytest.fail("the embedding's weight was read")


def test_a_warm_start_from_a_grown_drafter_folder_begins_with_its_weights(tmp_path, folders, sequences):
    """--init-from a drafter folder (the shipped drafter, or one from another machine) loads its
    adapters and mask row: the held-out loss before the first step equals that of a warm start from
    the run's own state.pt, and is far below a fresh start's (the control)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": s}) + "\n" for s in sequences))
    first = train_drafter(config(tmp_path, folders, data, adapt="masks", out=str(tmp_path / "a")))

    def step0_loss(name: str, init_from: str | None) -> float:
        train_drafter(config(tmp_path, folders, data, adapt="masks", out=str(tmp_path / name), init_from=init_from,
                             stop_after_steps=1))
        return json.loads((tmp_path / name / "log.jsonl").read_text().splitlines()[0])["eval_loss"]

    from_state = step0_loss("state", str(tmp_path / "a"))
    assert step0_loss("folder", str(first.drafter_dir)) == pytest.approx(from_state, rel=1e-6)
    assert step0_loss("cold", None) > 1.2 * from_state
    with pytest.raises(ValueError, match=r"grown drafter with other settings \(adapt differ\)"):
        train_drafter(config(tmp_path, folders, data, out=str(tmp_path / "all"), init_from=str(first.drafter_dir)))
