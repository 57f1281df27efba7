"""The DFlash training recipe on a tiny random target: mask, train/inference agreement, loss, resume."""

import dataclasses
import json
import math

import pytest
import torch

from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter
from taps.drafters.dflash import DFlashDrafter
from taps.drafters.dflash_model import DFlashConfig, DFlashDrafterModel
from taps.drafters.dflash_training import BlockObjective, build_block_mask, target_pass
from taps.drafters.objective import draft_vocabulary
from taps.drafters.objective import slot_weights
from taps.target import Target
from taps.train.drafter import TrainDrafterConfig, load_sequences, sample_anchors, train_drafter
from tiny import greedy_sequences, hf_greedy, tiny_model

LAYERS = (0, 2)
MASK = 95


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def sequences(model):
    return greedy_sequences(model)


@pytest.fixture
def data_file(tmp_path, sequences):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"ids": s}) + "\n" for s in sequences))
    return path


def config(tmp_path, data_file, **kw) -> TrainDrafterConfig:
    base = dict(target="tiny", data=str(data_file), out=str(tmp_path / "run"), mask_token_id=MASK, num_hidden_layers=1,
                block_size=8, target_layer_ids=LAYERS, anchors_per_sequence=12, sequences_per_step=2, epochs=3,
                lr=3e-3, eval_sequences=2, eval_every=4, save_every=4, progress=False)
    return TrainDrafterConfig(**{**base, **kw})


def brute_force_mask(anchors, seq_len, block):
    n = len(anchors)
    mask = torch.zeros(n * block, seq_len + n * block, dtype=torch.bool)
    for q in range(n * block):
        i = q // block
        for k in range(seq_len):
            mask[q, k] = k < anchors[i]  # context strictly before the anchor
        for k in range(n * block):
            mask[q, seq_len + k] = k // block == i  # its own block only, both directions
    return mask


@pytest.mark.parametrize("anchors,seq_len,block", [([0], 5, 4), ([0, 3, 4, 9], 11, 4), ([2, 7], 9, 16), ([5], 6, 2)])
def test_block_mask_matches_brute_force(anchors, seq_len, block):
    got = build_block_mask(torch.tensor(anchors), seq_len, block)
    assert torch.equal(got, brute_force_mask(anchors, seq_len, block))


def test_slot_weights_and_published_gammas(tmp_path):
    w = slot_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1 and math.isclose(w[8].item(), math.exp(-1), rel_tol=1e-6)
    for block, gamma in [(16, 7.0), (10, 5.0), (8, 4.0)]:
        assert TrainDrafterConfig("t", "d", "o", mask_token_id=1, block_size=block).slot_gamma == gamma
    with pytest.raises(ValueError, match="no published gamma for block_size=12"):
        TrainDrafterConfig("t", "d", "o", mask_token_id=1, block_size=12)
    assert TrainDrafterConfig("t", "d", "o", mask_token_id=1, block_size=12, gamma=6.0).slot_gamma == 6.0


def test_anchors_are_distinct_sorted_and_leave_a_label():
    gen = torch.Generator().manual_seed(0)
    for seq_len, n in [(2, 5), (10, 4), (50, 49), (50, 200)]:
        a = sample_anchors(seq_len, n, gen)
        assert len(a) == min(n, seq_len - 1) and len(set(a.tolist())) == len(a)
        assert torch.equal(a, a.sort().values) and a.min() >= 0 and a.max() <= seq_len - 2


def test_anchors_from_a_first_position_stay_at_or_after_it():
    gen = torch.Generator().manual_seed(0)
    for seq_len, n, first in [(10, 4, 8), (50, 200, 20), (50, 5, 0)]:
        a = sample_anchors(seq_len, n, gen, first)
        assert len(a) == min(n, seq_len - 1 - first) and len(set(a.tolist())) == len(a)
        assert a.min() >= first and a.max() <= seq_len - 2


def test_answer_anchors_start_at_the_first_answer_token(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"ids": [1, 2, 3, 4, 5, 6], "n_prompt": 3}\n{"ids": [7, 8, 9]}\n')
    answer = load_sequences(path, 96, 64, "answer")
    assert [(s.ids, s.first_anchor) for s in answer] == [([1, 2, 3, 4, 5, 6], 3), ([7, 8, 9], 0)]  # raw text: anywhere
    assert [s.first_anchor for s in load_sequences(path, 96, 64, "all")] == [0, 0]
    # the front cut would leave [1, 2, 3, 4], no answer token with a label: the window before the answer instead
    assert [(s.ids, s.first_anchor) for s in load_sequences(path, 96, 4, "answer")] == [([2, 3, 4, 5], 2), ([7, 8, 9], 0)]
    path.write_text('{"ids": [1, 2, 3, 4, 5], "n_prompt": 4}\n')
    with pytest.raises(ValueError, match="the answer holds no token to draft after its first"):
        load_sequences(path, 96, 64, "answer")
    with pytest.raises(ValueError, match="anchor_region must be one of answer, all"):
        TrainDrafterConfig("t", "d", "o", mask_token_id=1, anchor_region="prompt")


@pytest.mark.parametrize("draft_vocab", [None, tuple(range(0, 96, 2))])
def test_one_pass_training_forward_equals_inference(model, sequences, draft_vocab):
    """Block i of the one-pass training forward gives exactly the marginals the drafter produces
    at inference with the root at anchor i: mask, positions and labels line up."""
    torch.manual_seed(0)
    cfg = DFlashConfig.for_target(model.config, MASK, 2, LAYERS, block_size=8, draft_vocab_ids=draft_vocab)
    drafter = DFlashDrafterModel(cfg)
    ids = sequences[0]
    tp = target_pass(model, ids, LAYERS)
    anchors = torch.tensor([0, 1, 9, 20, len(ids) - 2])
    objective = BlockObjective(drafter, model, gamma=4.0)
    with torch.no_grad():
        probs = torch.softmax(objective.logits(tp, anchors)[:, 1:].float(), dim=-1)  # [N, L, V_draft]
    inference = DFlashDrafter(drafter, Target(model, feature_layers=LAYERS))
    for i, a in enumerate(anchors.tolist()):
        inference.start(ids[: a + 1])
        q = inference.draft(ids[: a + 1], tp.features[:a])  # [L, vocab]
        want = q if draft_vocab is None else q[:, list(draft_vocab)]
        torch.testing.assert_close(probs[i], want, atol=1e-6, rtol=1e-5)


def test_a_few_steps_reduce_the_loss(model, sequences):
    torch.manual_seed(0)
    drafter = DFlashDrafterModel(DFlashConfig.for_target(model.config, MASK, 1, LAYERS, block_size=8))
    objective = BlockObjective(drafter, model, gamma=4.0, soft_label_weight=0.3)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    passes = [target_pass(model, s, LAYERS, soft_top_k=16) for s in sequences[:3]]
    anchors = [torch.arange(len(s) - 1) for s in sequences[:3]]
    losses = []
    for _ in range(25):
        total = sum(objective.loss(objective.logits(tp, a), tp, a).loss for tp, a in zip(passes, anchors)) / 3
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < 0.7 * losses[0], losses
    # the target's embeddings and head are not trained
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_train_drafter_end_to_end(model, tmp_path, data_file):
    cfg = config(tmp_path, data_file)
    result = train_drafter(cfg, model=model)
    # 8 training sequences, 2 per step, 3 epochs
    assert result.step == result.total_steps == 12 and result.drafter_dir == tmp_path / "run" / "drafter"
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 4, 8, 12]
    tokens = [r["tokens"] for r in records]  # training tokens passed, for curves against them
    assert tokens[0] == 0 and all(a < b for a, b in zip(tokens, tokens[1:]))
    assert records[0]["train_loss"] is None and all(r["train_loss"] > 0 for r in records[1:])
    assert len(records[-1]["eval_slot_acc"]) == 7 and records[-1]["eval_tau_chain"] >= 1
    assert records[-1]["eval_loss"] < records[0]["eval_loss"]
    assert not list((tmp_path / "run").glob("*.tmp"))
    # the result is an ordinary DFlash folder: it decodes losslessly
    target = Target(model)
    drafter = load_drafter(str(result.drafter_dir), target)
    prompt = [5, 17, 33, 2]
    res = generate(target, prompt, DecodeConfig("ddtree", budget=8, max_new_tokens=30, stop_ids=()), drafter)
    ref = hf_greedy(model, prompt, 30)
    assert res.token_ids == ref


def test_resume_continues_where_it_stopped(model, tmp_path, data_file):
    assert train_drafter(config(tmp_path, data_file, out=str(tmp_path / "a")), model=model).step == 12
    first = train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b"), stop_after_steps=5), model=model)
    assert first.step == 5 and first.total_steps == 12
    resumed = train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b")), model=model)
    assert resumed.step == 12
    a = torch.load(tmp_path / "a" / "state.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "state.pt", weights_only=True)
    for name, tensor in a["drafter"].items():
        assert torch.equal(tensor, b["drafter"][name]), name
    log_a = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["eval_loss"] for r in log_a] == [r["eval_loss"] for r in log_b]
    # a finished run resumed again does nothing; other training settings are refused
    assert train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b")), model=model).step == 12
    with pytest.raises(ValueError, match="lr differ"):
        train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b"), lr=1e-3), model=model)
    data_file.write_text(data_file.read_text().replace("[", "[1, ", 1))
    with pytest.raises(ValueError, match="data_sha256 differ"):
        train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b")), model=model)


def test_a_larger_max_steps_extends_a_finished_run(model, tmp_path, data_file):
    """The run goes on from its step with its data order and optimizer; the learning rate restarts its warm-up
    and decay over the added steps, and the extended run resumes like any other."""
    first = train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b"), max_steps=4), model=model)
    assert first.step == 4 and first.total_steps == 4
    with pytest.raises(ValueError, match="at step 4 already"):
        train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b"), max_steps=3), model=model)
    half = train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b"), max_steps=10, stop_after_steps=6),
                         model=model)
    assert half.step == 6 and half.total_steps == 10
    assert train_drafter(config(tmp_path, data_file, out=str(tmp_path / "b"), max_steps=10), model=model).step == 10
    # the same extension in one go: same weights, so the stop at 6 kept the restarted schedule
    train_drafter(config(tmp_path, data_file, out=str(tmp_path / "a"), max_steps=4), model=model)
    train_drafter(config(tmp_path, data_file, out=str(tmp_path / "a"), max_steps=10), model=model)
    a = torch.load(tmp_path / "a" / "state.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "state.pt", weights_only=True)
    assert a["step"] == b["step"] == 10 and a["schedule_start"] == b["schedule_start"] == 4
    for name, tensor in a["drafter"].items():
        assert torch.equal(tensor, b["drafter"][name]), name
    log = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["lr"] for r in log}
    assert lr[4] == 0 and lr[8] > 0 and lr[10] == 0  # decayed, restarted, decayed again
    # the control: a run of 10 steps from the start trains other weights
    c = train_drafter(config(tmp_path, data_file, out=str(tmp_path / "c"), max_steps=10), model=model)
    c_state = torch.load(c.drafter_dir.parent / "state.pt", weights_only=True)
    assert any(not torch.equal(t, c_state["drafter"][n]) for n, t in a["drafter"].items())


def test_a_warm_start_on_more_data_begins_where_another_run_ended(model, tmp_path, data_file):
    first = train_drafter(config(tmp_path, data_file, out=str(tmp_path / "a")), model=model)
    more = tmp_path / "more.jsonl"
    more.write_text(data_file.read_text())
    # several files train as one list (10 + 10 sequences, 2 held out, 2 a step: 9 steps an epoch)
    cfg = config(tmp_path, data_file, data=(str(data_file), str(more)), out=str(tmp_path / "b"), epochs=1,
                 init_from=str(tmp_path / "a"))
    assert train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "f"), max_steps=3), model=model).step == 3
    warm = train_drafter(dataclasses.replace(cfg, stop_after_steps=1), model=model)
    assert warm.total_steps == 9
    log = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    cold = train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "c"), init_from=None, stop_after_steps=1), model=model)
    cold_log = [json.loads(x) for x in (tmp_path / "c" / "log.jsonl").read_text().splitlines()]
    # step 0 on the same held-out split: the first run's weights, against a fresh init (the control)
    assert first.step == 12 and cold.step == 1 and log[0]["eval_loss"] < cold_log[0]["eval_loss"]
    # the data and the start are pinned: a resume with another file list or start is refused
    with pytest.raises(ValueError, match="data_sha256 differ"):
        train_drafter(dataclasses.replace(cfg, data=(str(data_file),)), model=model)
    with pytest.raises(ValueError, match="init_from differ"):
        train_drafter(dataclasses.replace(cfg, init_from=str(tmp_path / "c")), model=model)
    with pytest.raises(ValueError, match="init_from: no training state"):
        train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "d"), init_from=str(tmp_path / "none")), model=model)
    with pytest.raises(ValueError, match="num_hidden_layers, target_layer_ids differ"):
        train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "e"), num_hidden_layers=2, target_layer_ids=(0, 1)), model=model)
    # the first run's drafter folder (what a checkout carries, unlike state.pt) starts at the same weights
    folder = train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "g"), init_from=str(first.drafter_dir),
                                               stop_after_steps=1), model=model)
    folder_log = [json.loads(x) for x in (folder.drafter_dir.parent / "log.jsonl").read_text().splitlines()]
    assert folder_log[0]["eval_loss"] == pytest.approx(log[0]["eval_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="DFlash drafter with other settings"):
        train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "h"), init_from=str(first.drafter_dir),
                                          num_hidden_layers=2), model=model)
    with pytest.raises(ValueError, match="taps ships no dflash drafter for tiny"):
        train_drafter(dataclasses.replace(cfg, out=str(tmp_path / "i"), init_from="shipped"), model=model)


def test_a_crash_while_saving_leaves_the_last_checkpoint_whole(model, tmp_path, data_file, monkeypatch):
    train_drafter(config(tmp_path, data_file, stop_after_steps=4), model=model)

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(config(tmp_path, data_file, stop_after_steps=8), model=model)
    monkeypatch.undo()
    assert torch.load(tmp_path / "run" / "state.pt", weights_only=True)["step"] == 4
    assert not list((tmp_path / "run").glob("*.tmp"))
    assert train_drafter(config(tmp_path, data_file), model=model).step == 12


def test_bfloat16_soft_labels_and_draft_vocabulary(tmp_path, data_file):
    model = tiny_model("qwen2")
    cfg = config(tmp_path, data_file, dtype="bfloat16", soft_label_weight=0.5, soft_label_top_k=8,
                 draft_vocab_size=40, epochs=2)
    result = train_drafter(cfg, model=model)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["eval_loss"]) for r in records)
    assert records[-1]["eval_loss"] < records[0]["eval_loss"]
    target = Target(model)
    drafter = load_drafter(str(result.drafter_dir), target)
    assert len(drafter.model.config.draft_vocab_ids) == 40 and drafter.model.fc.weight.dtype == torch.bfloat16


def test_draft_vocabulary_takes_the_most_frequent_tokens():
    assert draft_vocabulary([[5, 5, 5, 2, 2, 9], [9, 9, 9, 1]], 2, 12) == (5, 9)
    assert draft_vocabulary([[3, 1]], 1, 12) == (1,)  # ties: the lower id


def test_bad_data_gives_clear_errors(tmp_path):
    cases = ['{"ids": [1, 2, 3]}\n{"text": "x"}\n', '{"ids": [1, 200]}\n', '{"ids": [4]}\n', "not json\n"]
    for i, text in enumerate(cases):
        path = tmp_path / f"{i}.jsonl"
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"{i}.jsonl:\d"):
            load_sequences(path, 96, 64, "answer")
    with pytest.raises(ValueError, match="mask_token_id"):
        TrainDrafterConfig("t", "d", "o", mask_token_id=None)


@pytest.mark.parametrize("which", ["last", "first"])
def test_a_dflash_drafter_can_start_from_the_targets_own_layers(model, tmp_path, data_file, which):
    import copy

    from taps.drafters.dflash_training import copy_target_layers

    source = copy.deepcopy(model)  # norms not all ones, so that copying them shows
    with torch.no_grad():
        for i, layer in enumerate(source.model.layers):
            layer.input_layernorm.weight.fill_(2.0 + i)
        source.model.norm.weight.fill_(7.0)
    drafter = DFlashDrafterModel(DFlashConfig.for_target(model.config, MASK, 2, LAYERS, 8))
    picked = copy_target_layers(drafter, source, which)
    assert picked == ([1, 2] if which == "last" else [0, 1])
    for mine, i in zip(drafter.layers, picked):
        theirs = source.model.layers[i]
        assert torch.equal(mine.self_attn.q_proj.weight, theirs.self_attn.q_proj.weight)
        assert torch.equal(mine.mlp.down_proj.weight, theirs.mlp.down_proj.weight)
        assert torch.equal(mine.input_layernorm.weight, theirs.input_layernorm.weight)
        assert torch.equal(mine.self_attn.q_norm.weight, torch.ones_like(mine.self_attn.q_norm.weight))  # Llama has none
    assert torch.equal(drafter.norm.weight, source.model.norm.weight) == (which == "last")
    with pytest.raises(ValueError, match="more than the target's 3"):
        copy_target_layers(DFlashDrafterModel(DFlashConfig.for_target(model.config, MASK, 4, LAYERS, 8)), model, which)
    # through the trainer: the option is pinned with the run, and the result decodes losslessly
    result = train_drafter(config(tmp_path, data_file, init_layers=which, epochs=1), model=model)
    target = Target(model)
    prompt = [5, 17, 33, 2]
    res = generate(target, prompt, DecodeConfig("chain", budget=7, max_new_tokens=20, stop_ids=()),
                   load_drafter(str(result.drafter_dir), target))
    ref = hf_greedy(model, prompt, 20)
    assert res.token_ids == ref
    with pytest.raises(ValueError, match="init_layers must be one of random, last, first"):
        config(tmp_path, data_file, init_layers="middle")
    with pytest.raises(ValueError, match="init_layers"):
        config(tmp_path, data_file, kind="grown", base="b", target_layer_ids=None, init_layers="last")  # not its option


def test_tau_gain_per_doubling_reads_the_slope_of_a_log_linear_curve():
    from taps.train.drafter import tau_gain_per_doubling

    evals = [{"step": 0, "eval_tau_chain": 9.0}]  # step 0 (the untrained drafter) is not part of the trend
    evals += [{"step": s, "eval_tau_chain": 1.2 + 0.3 * math.log2(s * 250)} for s in (25, 50, 100, 200)]
    assert tau_gain_per_doubling(evals, 250) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="two or more steps after step 0"):
        tau_gain_per_doubling(evals[:2], 250)
