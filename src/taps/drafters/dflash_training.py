"""How a DFlash drafter trains (docs/method.md section 2, "Training recipe"): its block layout and loss.

The frozen target runs once over a whole training sequence and gives the hidden states of the
drafter's `target_layer_ids` (and, for soft labels, its top-k next-token distributions). Random
anchors each make one block `[token at the anchor, MASK, ..., MASK]` at positions
`anchor + 0..block_size-1`; one attention mask (`build_block_mask`) trains every block of the
sequence in a single drafter forward: a block sees the context strictly before its anchor and
itself, never another block. This is exactly what the drafter sees at inference, where the root
sits at the anchor and the context is every committed token before it.

Only the drafter's layers, `fc` and norms train; the target's embeddings and LM head stay frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from taps.drafters.base import TargetInfo
from taps.drafters.dflash_model import DFlashConfig, DFlashDrafterModel
from taps.drafters.objective import BlockLoss, draft_index, draft_vocabulary, slot_loss, slot_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from taps.train.drafter import TrainDrafterConfig


def build_block_mask(anchors: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """[n_blocks * block, seq_len + n_blocks * block] bool, True = may attend.

    Keys are [context positions 0..seq_len-1 ; block 0 ; block 1 ; ...], queries the blocks.
    Block i sees context strictly before anchors[i] (the root's own features come from the round
    that commits it, so at inference they are never there yet) and all of itself."""
    n = anchors.shape[0]
    query_block = torch.arange(n * block_size) // block_size  # [Q]
    context = torch.arange(seq_len)[None, :] < anchors[query_block][:, None]  # [Q, seq_len]
    same_block = query_block[:, None] == query_block[None, :]  # [Q, Q]
    return torch.cat([context, same_block], dim=1)


@dataclass
class TargetPass:
    """What the frozen target gives for one sequence."""

    ids: torch.Tensor  # [S] the sequence
    features: torch.Tensor  # [S, n_layers * H] outputs of the drafter's target layers
    soft_ids: torch.Tensor | None  # [S, k] row p: the target's top-k tokens for position p + 1
    soft_probs: torch.Tensor | None  # [S, k] their probabilities (renormalised over the k)


@torch.no_grad()
def target_pass(model: PreTrainedModel, ids: Sequence[int], layer_ids: Sequence[int], soft_top_k: int = 0) -> TargetPass:
    """One forward of the frozen target over the whole sequence (features as taps.target reads them)."""
    ids_t = torch.tensor(list(ids))
    out = model.base_model(input_ids=ids_t[None], output_hidden_states=True, use_cache=False)
    # hidden_states[i + 1] is decoder layer i's output, as in Target._features
    features = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1)  # [S, n * H]
    if soft_top_k == 0:
        return TargetPass(ids_t, features, None, None)
    logits = model.get_output_embeddings()(out.last_hidden_state[0]).float()  # [S, vocab]
    top, top_ids = logits.topk(min(soft_top_k, logits.shape[-1]), dim=-1)  # [S, k]
    return TargetPass(ids_t, features, top_ids, torch.softmax(top, dim=-1))


class BlockObjective:
    """The drafter's blocks over one sequence: logits in one pass, then the weighted loss."""

    def __init__(self, drafter: DFlashDrafterModel, target: PreTrainedModel, gamma: float, soft_label_weight: float = 0.0):
        cfg = drafter.config
        self.drafter, self.cfg = drafter, cfg
        self.embed = target.get_input_embeddings()
        head = target.get_output_embeddings()
        weight, bias = head.weight.detach(), None if getattr(head, "bias", None) is None else head.bias.detach()
        self.vocab = None  # [V_draft] token id of each draft-vocabulary index
        self.to_draft = None  # [vocab] draft-vocabulary index of each token id, -1 when absent
        if cfg.draft_vocab_ids is not None:
            self.vocab = torch.tensor(cfg.draft_vocab_ids)
            self.to_draft = draft_index(self.vocab, cfg.vocab_size)
            weight, bias = weight[self.vocab], None if bias is None else bias[self.vocab]
        self.head_weight, self.head_bias = weight, bias  # [V_draft, H]
        self.weights = slot_weights(cfg.block_size, gamma)  # [block]
        self.soft_label_weight = soft_label_weight

    def logits(self, tp: TargetPass, anchors: torch.Tensor) -> torch.Tensor:
        """[N, block, V_draft]: every block of the sequence in one drafter forward."""
        bs, S, n = self.cfg.block_size, tp.ids.shape[0], anchors.shape[0]
        block_ids = torch.full((n, bs), self.cfg.mask_token_id, dtype=torch.long)
        block_ids[:, 0] = tp.ids[anchors]
        positions = anchors[:, None] + torch.arange(bs)  # [N, block]
        embeds = self.embed(block_ids).detach()  # [N, block, H]; detached: the target's embeddings stay frozen
        hidden = self.drafter(
            embeds.reshape(1, n * bs, -1).float(),  # float32 residual stream; autocast does the matmuls
            positions.reshape(1, n * bs),
            tp.features[None].float(),
            torch.arange(S)[None],
            mask=build_block_mask(anchors, S, bs),
        )  # [1, N * block, H]
        return F.linear(hidden, self.head_weight, self.head_bias).view(n, bs, -1)

    def loss(self, logits: torch.Tensor, tp: TargetPass, anchors: torch.Tensor) -> BlockLoss:
        out, logp = slot_loss(logits, tp.ids, anchors, self.weights, self.vocab, self.to_draft)
        if self.soft_label_weight == 0:
            return out
        # the target's distribution for the token at anchor + k comes from its row anchor + k - 1
        bs, S = self.cfg.block_size, tp.ids.shape[0]
        rows = (anchors[:, None] + torch.arange(bs) - 1).clamp(min=0, max=S - 1)
        ids, p = tp.soft_ids[rows], tp.soft_probs[rows]  # [N, block, k]
        if self.vocab is not None:
            ids = self.to_draft[ids]
            p = p * (ids >= 0)
            p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
        kl = (torch.xlogy(p, p) - p * logp.gather(-1, ids.clamp(min=0))).sum(-1)  # [N, block]
        w_soft = self.weights * out.valid
        soft = (w_soft * kl).sum() / w_soft.sum().clamp(min=1e-6)
        return BlockLoss((1 - self.soft_label_weight) * out.loss + self.soft_label_weight * soft, out.correct, out.valid)


@torch.no_grad()
def copy_target_layers(drafter: DFlashDrafterModel, target: PreTrainedModel, which: str) -> list[int]:
    """Start the drafter's n layers from the target's own last (or first) n decoder layers and
    return their indices. From random initialisation a one-layer DFlash drafter on a CPU budget
    never left token frequencies here (issue 22); the target's layers already map its hidden
    states to next-token-ready ones. Every tensor whose name and shape the two layers share is
    copied (attention and MLP weights, the two layer norms); what the target's layer lacks stays
    as initialised (q_norm/k_norm of a Qwen2 or Llama target: ones), what the drafter lacks is
    dropped (Qwen2's q/k/v biases). With "last", the final norm comes from the target too: the
    drafter's output then meets the target's head as the target's own last layer does."""
    layers = target.get_decoder().layers
    n, total = len(drafter.layers), len(layers)
    if n > total:
        raise ValueError(f"the drafter has {n} layers, more than the target's {total} to start from")
    picked = list(range(total - n, total)) if which == "last" else list(range(n))
    for mine, i in zip(drafter.layers, picked):
        own = mine.state_dict()
        shared = {k: v for k, v in layers[i].state_dict().items() if k in own and own[k].shape == v.shape}
        mine.load_state_dict(shared, strict=False)
    if which == "last":
        drafter.norm.weight.copy_(target.get_decoder().norm.weight)
    return picked


class DFlashTrainee:
    """A new DFlash model over the frozen target's features (the Trainee of kind "dflash");
    `train` is the training sequences' ids, which choose a draft vocabulary when one is asked for."""

    def __init__(self, cfg: TrainDrafterConfig, target_model: PreTrainedModel, train: list[list[int]]):
        vocab_size = target_model.get_output_embeddings().weight.shape[0]
        vocab = None if cfg.draft_vocab_size is None else draft_vocabulary(train, min(cfg.draft_vocab_size, vocab_size), vocab_size)
        self.spec = DFlashConfig.for_target(target_model.config, cfg.mask_token_id, cfg.num_hidden_layers,
                                            cfg.target_layer_ids, cfg.block_size, vocab)
        rows = target_model.get_input_embeddings().weight.shape[0]
        if cfg.mask_token_id >= rows:
            raise ValueError(f"mask_token_id={cfg.mask_token_id} is not a row of the target's {rows}-row embedding table")
        torch.manual_seed(cfg.seed)
        self.module = DFlashDrafterModel(self.spec).train()
        if cfg.init_layers != "random":
            copy_target_layers(self.module, target_model, cfg.init_layers)
        self.target = target_model
        self.objective = BlockObjective(self.module, target_model, cfg.slot_gamma, cfg.soft_label_weight)
        self.soft_k = cfg.soft_label_top_k if cfg.soft_label_weight else 0
        self.info = TargetInfo.of(target_model, cfg.target)

    def block_loss(self, ids: Sequence[int], anchors: torch.Tensor, autocast) -> BlockLoss:
        tp = target_pass(self.target, ids, self.spec.target_layer_ids, self.soft_k)
        with autocast:
            logits = self.objective.logits(tp, anchors)
        return self.objective.loss(logits, tp, anchors)
