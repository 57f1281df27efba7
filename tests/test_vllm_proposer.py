"""taps' vLLM proposer logic (taps.vllm_proposer, issue 24) without vLLM: the arguments vLLM 0.32's
custom_class proposers get (sampled tokens per row, tokens per row, the batch's token table), a
tiny grown drafter, and the chains, empty and ragged proposals it must answer with.
tests/test_vllm.py runs the same class inside vLLM where the vllm extra is installed."""

import numpy as np
import pytest
import torch

from taps.drafters import load_drafter
from taps.drafters.grown import GrownConfig, GrownDrafter
from taps.target import Target
from taps.vllm_proposer import DRAFTER_ENV, ChainProposer, drafter_folder, shape_only_target
from tiny import tiny_model

MASK, BLOCK = 95, 5  # the drafter proposes BLOCK - 1 = 4 tokens
MAX_LEN = 64


@pytest.fixture(scope="module")
def drafter():
    return GrownDrafter(tiny_model("qwen2", seed=1), GrownConfig("base", MASK, block_size=BLOCK),
                        Target(tiny_model("qwen2", seed=0)))


def batch(contexts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's num_tokens_no_spec and token_ids_cpu for these rows (zeros past each row's text)."""
    table = np.zeros((len(contexts) + 2, MAX_LEN), dtype=np.int32)  # vLLM's table has spare rows
    for row, ids in enumerate(contexts):
        table[row, : len(ids)] = ids
    return np.array([len(ids) for ids in contexts] + [0, 0], dtype=np.int32), table


def chain(drafter: GrownDrafter, context: list[int], k: int) -> list[int]:
    """The greedy chain of a fresh drafter: what every row must propose, whatever ran before."""
    return drafter.fork().draft(context, None)[:k].argmax(dim=-1).tolist()


def test_chain_per_row_empty_rows_and_shrinking_batch(drafter):
    proposer = ChainProposer(drafter, k=3, max_model_len=MAX_LEN)
    contexts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    lengths, table = batch(contexts)
    got = proposer.propose([[8], [], [13, 2]], lengths, table)  # row 1 sampled nothing (prefill chunk)
    assert got == [chain(drafter, contexts[0], 3), [], chain(drafter, contexts[2], 3)]
    assert all(len(draft) == 3 for draft in got if draft)
    # next step: row 0 grew by one token, row 2 left the batch (vLLM shrank it to two rows)
    contexts = [[5, 6, 7, 8, 21], [9, 10, 22]]
    lengths, table = batch(contexts)
    got = proposer.propose([[21], [22]], lengths, table)
    assert got == [chain(drafter, ctx, 3) for ctx in contexts]
    assert sorted(proposer.rows) == [0, 1]  # the departed row's cache is gone


def test_row_taken_over_by_another_request_drafts_its_text(drafter):
    """vLLM reuses a row for a new request: the row's cache holds the old text and must not leak."""
    proposer = ChainProposer(drafter, k=4, max_model_len=MAX_LEN)
    lengths, table = batch([[1, 2, 3, 4, 5, 6]])
    proposer.propose([[6]], lengths, table)
    lengths, table = batch([[40, 41, 42]])
    assert proposer.propose([[42]], lengths, table) == [chain(drafter, [40, 41, 42], 4)]


def test_drafts_stop_at_the_context_limit(drafter):
    """Ragged: a row 2 tokens short of max_model_len gets 2, one at the limit gets none."""
    proposer = ChainProposer(drafter, k=4, max_model_len=8)
    contexts = [[1, 2, 3], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8]]
    lengths, table = batch(contexts)
    got = proposer.propose([[3], [6], [8]], lengths, table)
    assert got == [chain(drafter, contexts[0], 4), chain(drafter, contexts[1], 2), []]


def test_bad_settings_are_refused(drafter):
    with pytest.raises(ValueError, match="num_speculative_tokens <= 4"):
        ChainProposer(drafter, k=5, max_model_len=MAX_LEN)
    with pytest.raises(ValueError, match="grown drafter"):
        ChainProposer(load_drafter("random", Target(tiny_model("qwen2")), block_len=4), k=2, max_model_len=MAX_LEN)


def test_drafter_folder_names_the_remedy(tmp_path, monkeypatch):
    monkeypatch.delenv(DRAFTER_ENV, raising=False)
    with pytest.raises(ValueError, match=f"set {DRAFTER_ENV}"):
        drafter_folder(str(tmp_path))
    monkeypatch.setenv(DRAFTER_ENV, str(tmp_path))
    assert drafter_folder("/any/served/model") == str(tmp_path)


def test_shape_only_target_has_the_served_vocabulary_and_no_weights(tmp_path):
    tiny_model("qwen2", vocab=120).save_pretrained(tmp_path)
    target = shape_only_target(str(tmp_path), torch.bfloat16)
    assert (target.vocab_size, target.dtype) == (120, torch.bfloat16)
    assert all(p.is_meta for p in target.model.parameters())
    # a grown drafter over it runs on the CPU with its own weights (vLLM's CPU build holds the target's)
    drafter = GrownDrafter(tiny_model("qwen2", vocab=120, seed=1), GrownConfig("base", 119, block_size=4), target)
    q = drafter.draft([5, 17, 33], None)  # [3, 120]
    assert q.device.type == "cpu" and torch.allclose(q.sum(-1), torch.ones(3))
