"""The block objective every drafter kind trains with (docs/method.md section 2, "Training recipe").

A training block is rooted at an anchor a of a sequence: slot 0 holds the token at a (given),
slot k >= 1 learns the token at a + k with weight exp(-(k-1)/gamma). Early slots matter most,
since a drafted path is only accepted up to its first miss. Kinds differ in how they compute the
blocks' logits (their own layouts, in their modules), never in this loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class BlockLoss:
    loss: torch.Tensor  # scalar, differentiable
    correct: torch.Tensor  # [N, block] bool: argmax == label (slot 0 and slots past the end: False)
    valid: torch.Tensor  # [N, block] bool: slots with a label (k >= 1, anchor + k inside the sequence)


def draft_vocabulary(sequences: Sequence[Sequence[int]], size: int, vocab_size: int) -> tuple[int, ...]:
    """The `size` most frequent tokens of the training sequences (ties: lower id first), sorted by id:
    the only ids a drafter with a draft vocabulary scores (a smaller head, a cheaper draft)."""
    counts = torch.bincount(torch.tensor([t for s in sequences for t in s]), minlength=vocab_size)  # [vocab]
    order = torch.argsort(-counts, stable=True)  # [vocab] most frequent first; stable keeps ties by id
    return tuple(sorted(order[:size].tolist()))


def draft_index(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size]: each token id's index in the draft vocabulary `vocab` [V_draft], -1 when absent
    (`slot_loss`'s `to_draft`)."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    return index


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[block]: 0 for slot 0 (the root, given), exp(-(k-1)/gamma) for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


def slot_loss(logits: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor, weights: torch.Tensor,
              vocab: torch.Tensor | None = None, to_draft: torch.Tensor | None = None) -> tuple[BlockLoss, torch.Tensor]:
    """The slot-weighted cross-entropy of blocks' logits [N, block, V_draft] against the sequence
    ids [S] (slot k of the block at anchor a predicts ids[a + k]); also returns the log-probs.
    `vocab`/`to_draft` map a draft vocabulary to token ids and back; labels outside it cannot be
    drafted: no loss, never correct."""
    bs, S = logits.shape[1], ids.shape[0]
    slots = torch.arange(bs)
    positions = anchors[:, None] + slots  # [N, block]
    valid = (positions < S) & (slots >= 1)
    labels = ids[positions.clamp(max=S - 1)]  # [N, block]
    logp = torch.log_softmax(logits.float(), dim=-1)  # [N, block, V_draft]
    if vocab is None:
        index, scorable = labels, valid
        predicted = logp.argmax(-1)
    else:
        index = to_draft[labels]
        scorable = valid & (index >= 0)
        predicted = vocab[logp.argmax(-1)]
    w = weights * scorable  # [N, block]
    hard = -logp.gather(-1, index.clamp(min=0)[..., None])[..., 0]  # [N, block]
    loss = (w * hard).sum() / w.sum().clamp(min=1e-6)
    return BlockLoss(loss, (predicted == labels) & valid, valid), logp
