"""Training a block drafter (method.md section 2, "Training recipe"): a DFlash model (kind
"dflash") or a pretrained model grown into one (kind "grown", taps.grown). Both train on the same
data with the same random anchors, slot weights, schedule and checkpoints; a `Trainee` gives the
kind's block losses, trainable parameters and saved folder.

DFlash:
The frozen target runs once over a whole training sequence and gives the hidden states of the
drafter's `target_layer_ids` (and, for soft labels, its top-k next-token distributions). Random
anchors each make one block `[token at the anchor, MASK, ..., MASK]` at positions
`anchor + 0..block_size-1`; one attention mask (`build_block_mask`) trains every block of the
sequence in a single drafter forward: a block sees the context strictly before its anchor and
itself, never another block. This is exactly what the drafter sees at inference, where the root
sits at the anchor and the context is every committed token before it.

Only the drafter's layers, `fc` and norms train; the target's embeddings and LM head stay frozen.

Grown: the base model reads the sequence and every anchor's mask block in one forward
(taps.grown.block_layout) and needs no target at all; only its adapters and mask row train.

Both: slot k >= 1 learns the token at anchor + k with weight exp(-(k-1)/gamma): early slots matter
most, since a drafted path is only accepted up to its first miss.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from taps.assets import DTYPES
from taps.dflash import DFlashConfig, DFlashDrafterModel, TargetInfo, save_drafter
from taps.records import is_header

if TYPE_CHECKING:
    from transformers import PreTrainedModel

KINDS = ("dflash", "grown")
ANCHOR_REGIONS = ("answer", "all")
GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}  # published slot-weight decay per block size
STATE_FILE = "state.pt"  # resumable training state
DRAFTER_DIR = "drafter"  # the latest drafter, DFlash layout
LOG_FILE = "log.jsonl"  # one record per evaluation
# fields that may change between a run and its resumption: they do not change what is trained
# (the data file may move too: its content is compared, by hash)
RUN_FIELDS = frozenset({"out", "data", "stop_after_steps", "progress", "eval_every", "save_every"})


@dataclass(frozen=True)
class TrainDrafterConfig:
    target: str  # the frozen target: a packaged model name, a folder or a hub id (taps.assets.load_model)
    data: str  # JSONL file of training sequences, one {"ids": [token ids of the target]} record a line
    out: str  # output folder: state.pt (resume), drafter/ (DFlash layout), log.jsonl
    mask_token_id: int  # block filler; a row of the target's (dflash) or base's (grown) embedding table, never pad or eos
    kind: str = "dflash"  # "dflash": a new model reading target features; "grown": a pretrained base with adapters
    base: str | None = None  # kind "grown": the pretrained model grown into a drafter (packaged name, folder or hub id)
    lora_rank: int = 16  # kind "grown": rank of the adapters (alpha = 2 * rank)
    num_hidden_layers: int = 1  # kind "dflash": drafter transformer layers (published: 5; 1-3 fit a CPU)
    block_size: int = 16  # root + drafted slots per block (published: 16)
    target_layer_ids: tuple[int, ...] | None = None  # kind "dflash": target layers read; None: one per drafter layer, spread from 1 to L-3
    draft_vocab_size: int | None = None  # kind "dflash": score only the N most frequent tokens of the training data; None: all
    anchors_per_sequence: int = 64  # blocks per sequence per step (published: up to 512); fewer if the sequence is short
    anchor_region: str = "answer"  # "answer": blocks start in a record's answer (after its n_prompt tokens), as at inference; "all": anywhere
    max_seq_len: int = 1024  # longer sequences are cut to their first max_seq_len tokens
    sequences_per_step: int = 1  # sequences whose gradients add up before one optimizer step
    epochs: int = 6  # passes over the training sequences (published: 6)
    lr: float = 6e-4  # peak AdamW learning rate (published: 6e-4)
    warmup_fraction: float = 0.04  # share of all steps spent warming the learning rate up linearly (published: 4%)
    weight_decay: float = 0.01  # AdamW weight decay
    grad_clip: float = 1.0  # gradient-norm clip (published: 1.0)
    gamma: float | None = None  # slot-weight decay exp(-(k-1)/gamma); None: 7, 5, 4 for blocks of 16, 10, 8
    soft_label_weight: float = 0.0  # kind "dflash": share of the loss given to KL(target top-k || drafter); 0: hard labels only
    soft_label_top_k: int = 64  # tokens of the target's distribution kept for soft labels
    eval_sequences: int = 8  # sequences held out (chosen by seed) to measure loss and per-slot accuracy
    eval_every: int = 100  # optimizer steps between evaluations (each appends a record to log.jsonl)
    save_every: int = 100  # optimizer steps between resumable checkpoints (state.pt and drafter/)
    stop_after_steps: int | None = None  # end this run at this step (the schedule still spans all epochs); rerun to resume
    dtype: str = "float32"  # "float32" or "bfloat16": the target's weights and the drafter's compute (its weights stay float32)
    seed: int = 0  # drafter init, held-out split, data order and anchors
    progress: bool = True  # show a tqdm progress bar

    def __post_init__(self):
        if self.target_layer_ids is not None:
            object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if not isinstance(self.mask_token_id, int) or self.mask_token_id < 0:
            raise ValueError(f"mask_token_id must be a token id of the target, got {self.mask_token_id!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "grown":
            if not self.base:
                raise ValueError('kind "grown" needs base: the pretrained model to grow (e.g. qwen2.5-coder-0.5b)')
            dflash_only = {"target_layer_ids": None, "draft_vocab_size": None, "soft_label_weight": 0.0}
            for name, default in dflash_only.items():
                if getattr(self, name) != default:
                    raise ValueError(f'{name} applies to kind "dflash" only; a grown drafter reads no target')
        elif self.base is not None:
            raise ValueError('base applies to kind "grown" only')
        if self.anchor_region not in ANCHOR_REGIONS:
            raise ValueError(f"anchor_region must be one of {', '.join(ANCHOR_REGIONS)}, got {self.anchor_region!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("num_hidden_layers", "anchors_per_sequence", "max_seq_len", "sequences_per_step", "epochs",
                     "soft_label_top_k", "eval_every", "save_every", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_seq_len < 2:
            raise ValueError("max_seq_len must be >= 2: a block needs a root and one label")
        if self.eval_sequences < 0:
            raise ValueError(f"eval_sequences must be >= 0, got {self.eval_sequences}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if not 0 <= self.soft_label_weight <= 1:
            raise ValueError(f"soft_label_weight must be in [0, 1], got {self.soft_label_weight}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.stop_after_steps is not None and self.stop_after_steps < 1:
            raise ValueError(f"stop_after_steps must be >= 1, got {self.stop_after_steps}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")
        if self.gamma is None and self.block_size not in GAMMA_BY_BLOCK:
            raise ValueError(
                f"no published gamma for block_size={self.block_size} (known: {sorted(GAMMA_BY_BLOCK)}); set gamma"
            )

    @property
    def slot_gamma(self) -> float:
        return GAMMA_BY_BLOCK[self.block_size] if self.gamma is None else self.gamma


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainSequence:
    ids: list[int]  # [S] token ids of the target, cut to max_seq_len
    first_anchor: int  # the earliest position a block's root may take (0: anywhere)


def load_sequences(path: str | os.PathLike, vocab_size: int, max_seq_len: int, anchor_region: str) -> list[TrainSequence]:
    """Training sequences from a JSONL file of {"ids": [...]} records, cut to max_seq_len. With
    anchor_region "answer", a record with "n_prompt" (`taps gen-data`'s self-distilled answers)
    places blocks only from its first answer token on: at inference the root is always a token the
    target generated, and a prompt's chat template and system text are no draft to learn. Records
    without "n_prompt" (raw text) place them anywhere."""
    sequences = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if is_header(record):
                    continue  # the settings `taps gen-data` pinned in the file (taps.records)
                ids = record["ids"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f'{path}:{line_no}: expected a JSON object with an "ids" list') from None
            if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(t, int) and 0 <= t < vocab_size for t in ids):
                raise ValueError(f"{path}:{line_no}: ids must be a list of at least 2 token ids below {vocab_size}")
            first = record.get("n_prompt", 0) if anchor_region == "answer" else 0
            if first > min(len(ids), max_seq_len) - 2:
                raise ValueError(f"{path}:{line_no}: no answer token is left to draft within max_seq_len={max_seq_len} "
                                 f"(n_prompt={first}, {len(ids)} ids); raise max_seq_len or use anchor_region 'all'")
            sequences.append(TrainSequence(ids[:max_seq_len], first))
    if not sequences:
        raise ValueError(f"{path} holds no sequences")
    return sequences


def split_sequences(sequences: list, n_held_out: int, seed: int) -> tuple[list, list]:
    """(train, held out): the held-out ones chosen by seed."""
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed)).tolist()
    train = [sequences[i] for i in order[n_held_out:]]
    if not train:
        raise ValueError(f"all {len(sequences)} sequences are held out by eval_sequences={n_held_out}: nothing to train on")
    return train, [sequences[i] for i in order[:n_held_out]]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The epoch's sequence order; it follows from the seed alone, so a resumed run draws the same."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def draft_vocabulary(sequences: Sequence[Sequence[int]], size: int, vocab_size: int) -> tuple[int, ...]:
    """The `size` most frequent tokens (ties: lower id first), sorted by id."""
    counts = torch.bincount(torch.tensor([t for s in sequences for t in s]), minlength=vocab_size)  # [vocab]
    order = torch.argsort(-counts, stable=True)  # [vocab] most frequent first; stable keeps ties by id
    return tuple(sorted(order[:size].tolist()))


# ---------------------------------------------------------------------------------------------
# Blocks, mask, loss
# ---------------------------------------------------------------------------------------------


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[block]: 0 for slot 0 (the root, given), exp(-(k-1)/gamma) for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


def sample_anchors(seq_len: int, n: int, generator: torch.Generator, first: int = 0) -> torch.Tensor:
    """[min(n, seq_len - 1 - first)] distinct sorted anchors in [first, seq_len - 2]: each has a label after it."""
    candidates = first + torch.randperm(seq_len - 1 - first, generator=generator)[:n]
    return candidates.sort().values


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
def target_pass(model: "PreTrainedModel", ids: Sequence[int], layer_ids: Sequence[int], soft_top_k: int = 0) -> TargetPass:
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


@dataclass
class BlockLoss:
    loss: torch.Tensor  # scalar, differentiable
    correct: torch.Tensor  # [N, block] bool: argmax == label (slot 0 and slots past the end: False)
    valid: torch.Tensor  # [N, block] bool: slots with a label (k >= 1, anchor + k inside the sequence)


class BlockObjective:
    """The drafter's blocks over one sequence: logits in one pass, then the weighted loss."""

    def __init__(self, drafter: DFlashDrafterModel, target: "PreTrainedModel", gamma: float, soft_label_weight: float = 0.0):
        cfg = drafter.config
        self.drafter, self.cfg = drafter, cfg
        self.embed = target.get_input_embeddings()
        head = target.get_output_embeddings()
        weight, bias = head.weight.detach(), None if getattr(head, "bias", None) is None else head.bias.detach()
        self.vocab = None  # [V_draft] token id of each draft-vocabulary index
        self.to_draft = None  # [vocab] draft-vocabulary index of each token id, -1 when absent
        if cfg.draft_vocab_ids is not None:
            self.vocab = torch.tensor(cfg.draft_vocab_ids)
            self.to_draft = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
            self.to_draft[self.vocab] = torch.arange(len(self.vocab))
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


# ---------------------------------------------------------------------------------------------
# What trains: one Trainee per drafter kind
# ---------------------------------------------------------------------------------------------


class DFlashTrainee:
    """A new DFlash model over the frozen target's features (kind "dflash")."""

    def __init__(self, cfg: TrainDrafterConfig, target_model: "PreTrainedModel", train: list[TrainSequence]):
        vocab_size = target_model.get_output_embeddings().weight.shape[0]
        vocab = None if cfg.draft_vocab_size is None else draft_vocabulary([s.ids for s in train], min(cfg.draft_vocab_size, vocab_size), vocab_size)
        self.spec = DFlashConfig.for_target(target_model.config, cfg.mask_token_id, cfg.num_hidden_layers,
                                            cfg.target_layer_ids, cfg.block_size, vocab)
        rows = target_model.get_input_embeddings().weight.shape[0]
        if cfg.mask_token_id >= rows:
            raise ValueError(f"mask_token_id={cfg.mask_token_id} is not a row of the target's {rows}-row embedding table")
        torch.manual_seed(cfg.seed)
        self.module = DFlashDrafterModel(self.spec).train()
        self.target = target_model
        self.objective = BlockObjective(self.module, target_model, cfg.slot_gamma, cfg.soft_label_weight)
        self.soft_k = cfg.soft_label_top_k if cfg.soft_label_weight else 0
        self.info = TargetInfo.of(target_model, cfg.target)

    def block_loss(self, ids: Sequence[int], anchors: torch.Tensor, autocast) -> BlockLoss:
        tp = target_pass(self.target, ids, self.spec.target_layer_ids, self.soft_k)
        with autocast:
            logits = self.objective.logits(tp, anchors)
        return self.objective.loss(logits, tp, anchors)

    def save(self, folder: Path) -> None:
        save_drafter(self.module, folder, self.info)


class GrownTrainee:
    """A pretrained base with LoRA adapters and a trainable mask row (kind "grown", taps.grown)."""

    def __init__(self, cfg: TrainDrafterConfig, base_model: "PreTrainedModel", info: TargetInfo):
        from taps.grown import GrownConfig, add_adapters

        rows = base_model.get_output_embeddings().weight.shape[0]
        if rows > info.vocab_size:
            raise ValueError(f"base {cfg.base} predicts {rows} tokens, more than target {cfg.target}'s {info.vocab_size}")
        self.spec = GrownConfig(cfg.base, cfg.mask_token_id, cfg.block_size, cfg.lora_rank, 2 * cfg.lora_rank)
        torch.manual_seed(cfg.seed)
        self.module = add_adapters(base_model, self.spec).train()
        causal_lm = self.module.get_base_model()
        self.decoder, self.head = causal_lm.model, causal_lm.get_output_embeddings()
        self.weights = slot_weights(cfg.block_size, cfg.slot_gamma)
        self.info = info

    def block_loss(self, ids: Sequence[int], anchors: torch.Tensor, autocast) -> BlockLoss:
        from taps.grown import block_layout, block_logits

        ids_t = torch.tensor(list(ids))
        with autocast:
            logits = block_logits(self.decoder, self.head, block_layout(ids_t, anchors, self.spec.block_size,
                                                                        self.spec.mask_token_id))
        return slot_loss(logits, ids_t, anchors, self.weights)[0]

    def save(self, folder: Path) -> None:
        from taps.grown import save_grown

        save_grown(self.module, self.spec, folder, self.info)


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (a grown drafter's frozen base is not saved with them)."""
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    return {k: v for k, v in module.state_dict().items() if k in names}


# ---------------------------------------------------------------------------------------------
# The training run
# ---------------------------------------------------------------------------------------------


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then a cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def evaluate(trainee, sequences: list[TrainSequence], cfg: TrainDrafterConfig, autocast) -> dict:
    """Held-out loss, accuracy per slot and the chain's tau estimate (1 + leading correct slots),
    on anchors fixed by the seed so that evaluations compare across the run."""
    trainee.module.eval()
    losses, correct, valid, runs = [], 0, 0, []
    with torch.no_grad():
        for i, seq in enumerate(sequences):
            generator = torch.Generator().manual_seed(cfg.seed + i)
            anchors = sample_anchors(len(seq.ids), cfg.anchors_per_sequence, generator, seq.first_anchor)
            out = trainee.block_loss(seq.ids, anchors, autocast)
            losses.append(out.loss.item())
            correct = correct + out.correct[:, 1:].sum(0)  # [L]
            valid = valid + out.valid[:, 1:].sum(0)
            runs.append(out.correct[:, 1:].int().cumprod(-1).sum(-1))  # [N] accepted length of each block's chain
    trainee.module.train()
    return {
        "eval_loss": sum(losses) / len(losses),
        "eval_slot_acc": (correct / valid.clamp(min=1)).tolist(),
        "eval_tau_chain": 1 + torch.cat(runs).float().mean().item(),
    }


def train_step(trainee, batch: list[TrainSequence], cfg: TrainDrafterConfig, anchor_rng: torch.Generator,
               autocast) -> list[float]:
    """Gradients of one optimizer step (summed over `batch`, not yet applied); returns the losses."""
    losses = []
    for seq in batch:
        anchors = sample_anchors(len(seq.ids), cfg.anchors_per_sequence, anchor_rng, seq.first_anchor)
        loss = trainee.block_loss(seq.ids, anchors, autocast).loss
        (loss / len(batch)).backward()
        losses.append(loss.item())
    return losses


def _save_state(path: Path, state: dict) -> None:
    """Write-then-rename: a crash leaves the previous state.pt whole."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class TrainResult:
    drafter_dir: Path  # the latest drafter, DFlash layout
    step: int  # optimizer steps done so far
    total_steps: int  # steps of the whole schedule; step < total_steps means rerun to resume


def _target_info(name: str) -> TargetInfo:
    """What a grown drafter records of its target, read from the target's config alone."""
    from transformers import AutoConfig

    from taps.assets import resolve

    config = AutoConfig.from_pretrained(resolve(name))
    return TargetInfo(name, config.vocab_size, config.hidden_size, config.num_hidden_layers)


def train_drafter(cfg: TrainDrafterConfig, model: "PreTrainedModel | None" = None) -> TrainResult:
    """Train (or resume training) a drafter for `cfg.target` on `cfg.data` into `cfg.out`.

    `model` replaces loading the model that runs: the frozen target (kind "dflash") or the base to
    grow (kind "grown"); for tests and notebooks. It is cast to cfg.dtype in place.
    """
    torch.set_flush_denormal(True)  # denormals run through slow microcode on x86 CPUs
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = DTYPES[cfg.dtype]
    if model is None:
        from taps.assets import load_model

        model, _ = load_model(cfg.base if cfg.kind == "grown" else cfg.target, dtype=dtype)
    model = model.to(dtype).eval().requires_grad_(False)
    vocab_size = model.get_output_embeddings().weight.shape[0]

    train, held_out = split_sequences(load_sequences(cfg.data, vocab_size, cfg.max_seq_len, cfg.anchor_region), cfg.eval_sequences, cfg.seed)
    trainee = GrownTrainee(cfg, model, _target_info(cfg.target)) if cfg.kind == "grown" else DFlashTrainee(cfg, model, train)
    params = [p for p in trainee.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.sequences_per_step)
    total = cfg.epochs * steps_per_epoch
    warmup = max(1, round(cfg.warmup_fraction * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup))
    anchor_rng = torch.Generator().manual_seed(cfg.seed)
    run_config = {k: v for k, v in asdict(cfg).items() if k not in RUN_FIELDS}
    run_config["data_sha256"] = hashlib.sha256(Path(cfg.data).read_bytes()).hexdigest()
    step, loss_sum, loss_n = 0, 0.0, 0

    state_path = out / STATE_FILE
    if state_path.exists():
        state = torch.load(state_path, weights_only=True)
        changed = sorted(k for k in run_config if state["config"].get(k) != run_config[k])
        if changed or state["drafter_config"] != asdict(trainee.spec):
            raise ValueError(
                f"{out} holds a run with other settings ({', '.join(changed) or 'data or target'} differ); "
                "resume with the same settings or choose a new out folder"
            )
        trainee.module.load_state_dict(state["drafter"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        anchor_rng.set_state(state["anchor_rng"])
        step, loss_sum, loss_n = state["step"], state["loss_sum"], state["loss_n"]

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    stop = total if cfg.stop_after_steps is None else min(total, cfg.stop_after_steps)
    started = time.perf_counter()

    def log(record: dict) -> None:
        record.update(step=step, epoch=step / steps_per_epoch, lr=scheduler.get_last_lr()[0],
                      elapsed_s=time.perf_counter() - started)
        if held_out:
            record.update(evaluate(trainee, held_out, cfg, autocast))
        with open(out / LOG_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")

    def save() -> None:
        _save_state(state_path, {
            "config": run_config, "drafter_config": asdict(trainee.spec), "step": step,
            "drafter": trainable_state(trainee.module),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "anchor_rng": anchor_rng.get_state(), "loss_sum": loss_sum, "loss_n": loss_n,
        })
        trainee.save(out / DRAFTER_DIR)

    if step == 0:
        log({"train_loss": None})  # the untrained baseline
    bar = tqdm(total=total, initial=step, disable=not cfg.progress, desc="train-drafter", unit="step")
    while step < stop:
        epoch, index = divmod(step, steps_per_epoch)
        chosen = epoch_order(len(train), cfg.seed, epoch)[index * cfg.sequences_per_step : (index + 1) * cfg.sequences_per_step]
        losses = train_step(trainee, [train[i] for i in chosen], cfg, anchor_rng, autocast)
        loss_sum, loss_n = loss_sum + sum(losses), loss_n + len(losses)
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{sum(losses) / len(losses):.3f}")
        if step % cfg.eval_every == 0 or step == total:
            log({"train_loss": loss_sum / max(loss_n, 1)})
            loss_sum, loss_n = 0.0, 0
        if step % cfg.save_every == 0 or step == stop:
            save()
    bar.close()
    return TrainResult(out / DRAFTER_DIR, step, total)
