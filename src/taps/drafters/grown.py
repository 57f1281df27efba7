"""The grown drafter kind: a block drafter grown from a pretrained causal LM (issue 3, kind b).

A small pretrained model of the target's family (qwen2.5-coder-0.5b for the 1.5B target, same
tokenizer) learns to fill a block in one forward. After the committed text it reads L - 1 copies
of a mask token; its logits at the root give q_1 (its ordinary next-token prediction, which it
already makes well) and its logits at mask j give q_{j+1}, the token j + 1 places after the root
(docs/method.md section 1's marginals). Attention stays causal: a mask sees the context, the root and
the masks before it, which carry only their positions. The drafter keeps its own KV cache of the
committed text; the masks' K/V are dropped after every draft.

Only low-rank adapters (peft LoRA on every linear layer) and the mask token's embedding row
train; a drafter folder holds just those (`adapter_model.safetensors`), plus `grown.json` naming
the base model (fetched by `taps models fetch`) and the target it was trained for. Loading merges
the adapters into the base, so drafting costs one plain forward of the base model.

A draft vocabulary (`draft_vocab_size`, `draft_vocab.safetensors`) keeps only the head rows of
the training data's most frequent tokens: other tokens get probability 0, which stays lossless
(the target verifies every token; docs/method.md section 1). Why: the 0.5B's head is 896 x 151,936
= 136M of its ~494M weights and is read on every draft. Measured (the shipped drafter, int8,
256 tokens of context, 8 draft rows, median of 12, 2-core AMD EPYC with avx512_bf16): 30.8 ms a
draft with the whole head, 27.3 ms with 32,768 rows, 26.7 ms with 16,384; the share grows as
`base_layers` shrinks the rest. But a token outside the vocabulary ends the accepted path where it
occurs: the 1.5B's answers to 3,072 training prompts use 17,829 distinct ids, and their 16,384
(32,768) most frequent cover 98.2% of 300 held-out training answers' tokens but only 93.6% (97.0%)
of its greedy HumanEval answers' and 93.3% (96.7%) of MT-Bench's (65,536 with the answer's own
earlier tokens: 99.2% / 99.5%). A draft saved 10% of 35 ms against a w8a8 round of ~146 ms does
not pay for that, so no shipped drafter uses one; it is for drafts that dominate a round.

Training rows (`block_layout`): one sequence [context 0..S-1 ; masks of block 0 ; block 1 ; ...]
trains every anchor in one forward, as DFlash's block mask does: block i's masks sit at positions
anchor_i + 1..anchor_i + L - 1 and see the context up to anchor_i and the earlier masks of their
own block, exactly what they see at inference. Training needs no target at all (`GrownTrainee`):
only the base runs, and only its adapters and mask row train.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from taps.decoder import Decoder, fits
from taps.drafters.base import DrafterKind, KindTraining, TargetInfo, register
from taps.drafters.dflash_model import DRAFT_VOCAB_KEY
from taps.drafters.objective import BlockLoss, draft_index, draft_vocabulary, slot_loss, slot_weights
from taps.files import check_weights, read_json
from taps.quantize import load_dtype
from taps.target import Target, common_prefix

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from taps.train.drafter import TrainDrafterConfig

GROWN_FILE = "grown.json"  # marks a grown drafter's folder; the adapters are peft's files beside it
VOCAB_FILE = "draft_vocab.safetensors"  # the draft vocabulary's ids (DRAFT_VOCAB_KEY), when it has one
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# "all": the adapters act on every token and are merged into the base on load (one plain forward).
# "masks": peft's activated LoRA, from the first mask token on: the root's row and the context's
# cache stay exactly the base's (in the "all" runs of results/drafter-distill the root's next-token
# accuracy fell below the base's as the masks learned); unmerged, so a draft adds rank-r products
# on its mask rows.
ADAPT = ("all", "masks")


@dataclass(frozen=True)
class GrownConfig:
    base: str  # the pretrained model grown into a drafter: packaged name, folder or hub id
    mask_token_id: int  # the block filler: a token of the base's vocabulary that text never contains
    block_size: int = 8  # root + drafted positions; the drafter proposes block_size - 1
    lora_rank: int = 16  # rank of the adapters
    lora_alpha: int = 32  # adapter scale numerator (scale = alpha / rank)
    base_layers: int | None = None  # decoder layers of the base kept (`keep_layers`); None: all
    draft_vocab_size: int | None = None  # head rows kept: the ids in VOCAB_FILE; None: the whole head
    adapt: str = "all"  # ADAPT: the tokens the adapters act on

    def __post_init__(self):
        if self.adapt not in ADAPT:
            raise ValueError(f"adapt must be one of {', '.join(ADAPT)}, got {self.adapt!r}")
        for name in ("base_layers", "draft_vocab_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (or None: all), got {getattr(self, name)}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (a root and one drafted position), got {self.block_size}")
        if self.lora_rank < 1 or self.lora_alpha < 1:
            raise ValueError(f"lora_rank and lora_alpha must be >= 1, got {self.lora_rank} and {self.lora_alpha}")
        if self.mask_token_id < 0:
            raise ValueError(f"mask_token_id must be a token id, got {self.mask_token_id}")


def check_mask_token(cfg: GrownConfig, model: PreTrainedModel, source: str = "the drafter") -> None:
    rows = model.get_input_embeddings().weight.shape[0]
    if cfg.mask_token_id >= rows:
        raise ValueError(f"{source} has mask_token_id={cfg.mask_token_id}, not a row of the base's {rows}-row embedding table")


def keep_layers(model: PreTrainedModel, n: int | None) -> PreTrainedModel:
    """The base with only `n` of its L decoder layers (None: all), in place: spread evenly from
    the first to the last (rounded; n = 1 keeps the first), the embedding, final norm and head
    kept. A cheaper draft (issue 22): each layer dropped is 1/L of the base's forward, and the
    adapters, trained on the shortened base, learn to bridge the gaps. Layers are renumbered
    (`self_attn.layer_idx`, and `config.layer_types` where the config has one) so the KV cache
    indexes the kept layers 0..n-1."""
    if n is None:
        return model
    layers = model.get_decoder().layers
    total = len(layers)
    if not 1 <= n <= total:
        raise ValueError(f"base_layers must be between 1 and the base's {total} layers, got {n}")
    keep = [0] if n == 1 else sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})
    model.get_decoder().layers = torch.nn.ModuleList(layers[i] for i in keep)
    for new, layer in enumerate(model.get_decoder().layers):
        layer.self_attn.layer_idx = new
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    model.config.num_hidden_layers = len(keep)
    return model


@contextlib.contextmanager
def quiet_alora():
    """Silences peft's notice that activated LoRA supports only its CAUSAL_LM task: taps activates
    the adapters itself (`masks_only` in training, `MaskRowAdapter` in drafts), not through that
    task's generate, so the notice says nothing to a user of a drafter."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="aLoRA is currently only supported for CAUSAL_LM task")
        yield


def add_adapters(model: PreTrainedModel, cfg: GrownConfig):
    """The base wrapped by peft: LoRA on every linear layer of the decoder and a trainable mask row."""
    from peft import LoraConfig, get_peft_model

    check_mask_token(cfg, model)
    with quiet_alora():
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(LORA_MODULES), trainable_token_indices={"embed_tokens": [cfg.mask_token_id]},
                          alora_invocation_tokens=[cfg.mask_token_id] if cfg.adapt == "masks" else None)
    return get_peft_model(model, lora)


def masks_only(peft_model, cfg: GrownConfig, masks: int):
    """A context in which the activated adapters ("masks") act on the last `masks` tokens of a
    forward that calls the adapted modules directly; nothing for adapters on every token. It is
    the hook peft's own model forward sets (`_enable_peft_forward_hooks`), used here because the
    training forward calls the decoder alone, to run the large head on the needed rows only."""
    if cfg.adapt != "masks":
        return contextlib.nullcontext()
    return peft_model.base_model._enable_peft_forward_hooks(alora_offsets=[masks])


# ---------------------------------------------------------------------------------------------
# Training rows
# ---------------------------------------------------------------------------------------------


@dataclass
class BlockLayout:
    """One training forward over a sequence and its anchors' mask blocks."""

    input_ids: torch.Tensor  # [Q] context tokens, then (L - 1) masks per anchor
    context: int  # S: the first S rows are the context's
    position_ids: torch.Tensor  # [Q]
    mask: torch.Tensor  # [Q, Q] bool, True = may attend
    rows: torch.Tensor  # [N, block] row of Q whose logits predict slot k (slot 0, the root itself: any row)

    @property
    def masks(self) -> int:
        """The mask rows, which follow the context's."""
        return len(self.input_ids) - self.context


def block_layout(ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int) -> BlockLayout:
    S, n, m = ids.shape[0], anchors.shape[0], block_size - 2  # m masks per block (slots 2..L)
    block_of = torch.arange(n * m) // m  # [n * m] which anchor each mask belongs to
    offset = torch.arange(n * m) % m + 1  # [n * m] 1..m places after its anchor
    mask_pos = anchors[block_of] + offset
    input_ids = torch.cat([ids, torch.full((n * m,), mask_token_id, dtype=ids.dtype)])
    position_ids = torch.cat([torch.arange(S), mask_pos])
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    to_context = torch.arange(S)[None, :] <= anchors[block_of][:, None]  # [n*m, S]
    within = (block_of[:, None] == block_of[None, :]) & (offset[:, None] >= offset[None, :])  # [n*m, n*m]
    mask = torch.cat([
        torch.cat([causal, torch.zeros(S, n * m, dtype=torch.bool)], dim=1),
        torch.cat([to_context, within], dim=1),
    ])
    rows = torch.empty(n, block_size, dtype=torch.long)
    rows[:, 0] = anchors  # unused: slot 0 is the root
    rows[:, 1] = anchors  # the root's own next-token row
    rows[:, 2:] = S + torch.arange(n * m).view(n, m)
    return BlockLayout(input_ids, S, position_ids, mask, rows)


def block_logits(model, head, layout: BlockLayout) -> torch.Tensor:
    """[N, block, vocab]: one forward of the (adapted) base over a BlockLayout; the head runs on the
    needed rows only (the vocabulary is large)."""
    hidden = model(
        input_ids=layout.input_ids[None],
        position_ids=layout.position_ids[None],
        attention_mask=layout.mask[None, None],
        use_cache=False,
    ).last_hidden_state[0]  # [Q, H]
    return head(hidden[layout.rows])


def masks_block_logits(peft_model, cfg: GrownConfig, layout: BlockLayout) -> torch.Tensor:
    """block_logits of activated adapters (adapt="masks") in two forwards, as a draft runs: the
    context's rows depend on no trained weight (no adapter acts on them and text holds no mask
    token), so they run once without autograd into a KV cache, and the masks attend to it. The same
    logits and gradients as the one forward, to float rounding (tests/test_grown.py), but the
    backward covers the masks' rows only. Measured (qwen2.5-coder-0.5b, 512 tokens, 24 anchors of
    block 8, float32, 2-core AMD EPYC with AVX2): forward and backward of a sequence 11.3 s in one
    forward, 7.9 s in two."""
    lm = peft_model.get_base_model()
    S, masks = layout.context, layout.masks
    cache = DynamicCache(config=lm.config)
    with torch.no_grad(), masks_only(peft_model, cfg, 0):
        hidden = lm.model(input_ids=layout.input_ids[None, :S], position_ids=layout.position_ids[None, :S],
                          past_key_values=cache, use_cache=True).last_hidden_state[0]  # [S, H]
    if masks:
        with masks_only(peft_model, cfg, masks):
            on_masks = lm.model(input_ids=layout.input_ids[None, S:], position_ids=layout.position_ids[None, S:],
                                attention_mask=layout.mask[None, None, S:], past_key_values=cache,
                                use_cache=True).last_hidden_state[0]  # [masks, H]
        hidden = torch.cat([hidden, on_masks])  # [Q, H]
    return lm.get_output_embeddings()(hidden[layout.rows])


# ---------------------------------------------------------------------------------------------
# Folder layout
# ---------------------------------------------------------------------------------------------


def save_grown(peft_model, cfg: GrownConfig, folder: str | os.PathLike, info: TargetInfo,
               vocab: torch.Tensor | None = None) -> Path:
    """Adapters (peft's adapter_config.json + adapter_model.safetensors), grown.json and, with a
    draft vocabulary (`vocab` [V_draft], sorted ids: `draft_vocabulary`), VOCAB_FILE."""
    if (None if vocab is None else len(vocab)) != cfg.draft_vocab_size:
        raise ValueError(f"draft_vocab_size={cfg.draft_vocab_size} needs a draft vocabulary of that many ids, "
                         "and only then")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / VOCAB_FILE).unlink(missing_ok=True)  # a folder saved over keeps no earlier vocabulary
    # name the base as the user gave it (a packaged name), not the cache folder it was loaded from
    for adapter in peft_model.peft_config.values():
        adapter.base_model_name_or_path = cfg.base
    # the base's vocabulary is never resized (the mask row is peft's trainable token, saved on its
    # own): peft's "auto" would ask the hub for the base's config.json to find that out, and warn
    # offline or for a packaged name
    card = folder / "README.md"
    had_card = card.exists()
    peft_model.save_pretrained(folder, save_embedding_layers=False)
    if not had_card:  # peft's blank model card, which names the base by this machine's path
        card.unlink(missing_ok=True)
    if vocab is not None:
        _write_vocabulary(folder, vocab)
    _write_description(folder, cfg, asdict(info))
    return folder


def _write_description(folder: Path, cfg: GrownConfig, info: dict) -> None:
    (folder / GROWN_FILE).write_text(json.dumps({"grown": asdict(cfg), "taps": info}, indent=2) + "\n")


def _write_vocabulary(folder: Path, ids: torch.Tensor) -> None:
    from safetensors.torch import save_file

    save_file({DRAFT_VOCAB_KEY: ids.to(torch.long).contiguous()}, str(folder / VOCAB_FILE))


def set_draft_vocabulary(folder: str | os.PathLike, vocab: Sequence[int]) -> None:
    """Make the grown drafter in `folder` score only the token ids `vocab` (`draft_vocabulary`
    picks them from training data): writes VOCAB_FILE and records its size in grown.json. A drafter
    trained on the whole head keeps its ranking among the kept ids (the softmax renormalises over
    them), so a trained drafter can be given one afterwards."""
    folder = Path(folder)
    cfg, info = read_grown(folder)
    ids = torch.tensor(sorted(set(vocab)), dtype=torch.long)  # [V_draft]
    if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= info["vocab_size"]:
        raise ValueError(f"a draft vocabulary must be token ids of the target's {info['vocab_size']}-token vocabulary")
    _write_vocabulary(folder, ids)
    _write_description(folder, replace(cfg, draft_vocab_size=ids.numel()), info)


def read_draft_vocabulary(folder: str | os.PathLike, cfg: GrownConfig) -> torch.Tensor | None:
    """The folder's draft vocabulary [V_draft] (None: the whole head), checked against grown.json."""
    from safetensors.torch import load_file

    path = Path(folder) / VOCAB_FILE
    ids = load_file(str(path))[DRAFT_VOCAB_KEY] if path.is_file() else None
    if (ids is None) != (cfg.draft_vocab_size is None) or (ids is not None and ids.numel() != cfg.draft_vocab_size):
        raise ValueError(f"{folder}: grown.json's draft_vocab_size={cfg.draft_vocab_size} disagrees with "
                         f"{VOCAB_FILE} ({'absent' if ids is None else f'{ids.numel()} ids'}); "
                         "copy or train the drafter again")
    return ids


def read_grown(folder: str | os.PathLike) -> tuple[GrownConfig, dict]:
    path = Path(folder) / GROWN_FILE
    if not path.is_file():
        raise ValueError(f"{folder} is not a grown drafter folder: it has no {GROWN_FILE}")
    raw = read_json(path, "fix it or copy the drafter again")
    check_weights(folder, "copy or train the drafter again")
    try:
        return GrownConfig(**raw["grown"]), raw["taps"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a valid grown drafter description: {e}") from None


class GrownDrafter:
    """The Drafter protocol (taps.drafters) for a base model with merged adapters."""

    feature_layers: tuple[int, ...] = ()  # reads no target features: its own cache holds the context
    prefix_drafts = True  # draft(..., slots) gives the first `slots` positions alone (taps.drafters.Drafter)

    def __init__(
        self,
        model: PreTrainedModel,
        cfg: GrownConfig,
        target: Target,
        source: str = "the drafter",
        dtype: torch.dtype | None = None,
        vocab: torch.Tensor | None = None,
    ):
        rows = model.get_output_embeddings().weight.shape[0]
        if rows > target.vocab_size:
            raise ValueError(f"{source} predicts {rows} tokens but the target's vocabulary has {target.vocab_size}")
        check_mask_token(cfg, model, source)
        if vocab is not None:
            if int(vocab.max()) >= rows:
                raise ValueError(f"{source}'s draft vocabulary names ids past its head's {rows} rows")
            model = keep_head_rows(model, vocab)
        # token id of each head row; None when the rows are the target's ids one to one
        ids = vocab if vocab is not None else torch.arange(rows) if rows < target.vocab_size else None
        self.device = target.device  # beside the target's weights
        self.ids = None if ids is None else ids.to(self.device)
        # It reads token ids and returns probabilities, so its dtype may differ from the target's
        # (`dtype`, default the target's: float32 for an int8 drafter beside a bfloat16 target).
        self.model = model.to(self.device, dtype or target.dtype).eval()
        self.cfg = cfg
        self.block_len = cfg.block_size - 1
        self.vocab_size = target.vocab_size
        self.start(())

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @model.setter
    def model(self, model: PreTrainedModel) -> None:
        # walked by taps.decoder where the base allows, else by transformers' forward; made
        # anew whenever the model is set, so it walks the present layers (a drafter is quantized
        # after it is built: taps.drafters.loading)
        self._model = model
        self.decoder = Decoder(model) if fits(model) else None

    def start(self, prompt_ids: Sequence[int], reused: int = 0) -> None:
        """Keep the K/V of the longest prefix of the prompt's first `reused` tokens that the cache holds (a
        chat's next turn: the previous prompt and answer, which the target kept too), forget the rest.
        Invariant: self.cache holds the K/V of exactly self.cached, at positions 0.. in order."""
        keep = common_prefix(self.cached, prompt_ids[:reused]) if reused else 0
        if keep:
            self.cache.crop(keep)  # both caches' crop keeps the first `keep` positions
            self.cached = list(prompt_ids[:keep])
            return
        self.cache = self.decoder.new_cache() if self.decoder else DynamicCache(config=self.model.config)
        self.cached: list[int] = []  # committed tokens whose K/V are in self.cache

    def fork(self) -> GrownDrafter:
        """A drafter on the same weights with a cache of its own, empty: one per sequence when
        several run side by side (taps.vllm_proposer); the weights are not copied."""
        twin = copy.copy(self)
        twin.start(())
        return twin

    @torch.inference_mode()
    def draft(self, ids: Sequence[int], features: torch.Tensor | None, slots: int | None = None) -> torch.Tensor:
        """Feed the committed tokens not yet cached (the root last) and `slots` - 1 masks (default L - 1) in
        one forward: [slots, vocab]. Each mask attends to the rows before it alone, so the first `slots`
        positions are the same with fewer masks after them (`prefix_drafts`), at fewer rows' cost."""
        ids = list(ids)
        if self.cached != ids[: len(self.cached)] or len(self.cached) >= len(ids):
            self.start(ids)  # the context changed under us: rebuild the cache from scratch
        new = ids[len(self.cached):]
        slots = self.block_len if slots is None else min(max(slots, 1), self.block_len)
        n_masks = slots - 1
        # [slots, rows]: the root's row and the masks'
        logits = self._logits(new + [self.cfg.mask_token_id] * n_masks, len(self.cached), n_masks, slots)
        if n_masks:
            self.cache.crop(-n_masks)  # a negative crop drops that many tokens: the masks are not context
        self.cached = ids
        return self._probs(logits)

    @torch.inference_mode()
    def rollout(self, marginals: torch.Tensor, steps: int, min_reach: float) -> torch.Tensor:
        """Deepen the draft just made along the drafter's own greedy path (the `rollout` methods).

        The block pass's marginals are strong at depth 1 and weak beyond: later masks never see
        which token came first. Here the base reads its greedy token a_1 = argmax q_1, then a_2,
        ... one row per forward, and row d becomes p(x_{d+1} | context, a_1..a_d), the drafter's
        conditional along that path (row 0 is unchanged: the root's row is already conditional).
        It stops after `steps` tokens or when the path's drafter probability prod_d p(a_d) falls
        under `min_reach`; rows past the path keep their block marginals. Returns
        [max(L, 1 + path length), vocab]. Must follow `draft` (its cache ends at the root); the
        path's K/V are dropped again, so the cache still holds committed text only.
        """
        rows, path, reach = [marginals[0]], [], 1.0
        while len(path) < steps:
            token = int(rows[-1].argmax())
            reach *= float(rows[-1][token])
            if reach < min_reach:
                break
            path.append(token)
            # a path token is context: the base's own row
            logits = self._logits([token], len(self.cached) + len(path) - 1, 0, 1)  # [1, rows]
            rows.append(self._probs(logits)[0])
        if path:
            self.cache.crop(-len(path))
        return torch.cat([torch.stack(rows), marginals[len(rows):]])  # [max(L, 1 + len(path)), vocab]

    def _logits(self, tokens: list[int], start: int, n_masks: int, keep: int) -> torch.Tensor:
        """Float32 logits [keep, rows] of the last `keep` of `tokens`, fed at positions from `start`
        (the cache's length) into the cache; activated adapters act on the last `n_masks` rows."""
        if self.decoder is not None:
            return self.decoder(torch.tensor(tokens, device=self.device), self.cache, n_masks, keep).float()
        if self.cfg.adapt == "masks":
            self.model.mask_rows.n = n_masks  # on_mask_rows' adapters read it
        return self.model(
            input_ids=torch.tensor([tokens], device=self.device),
            position_ids=torch.arange(start, start + len(tokens), device=self.device)[None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=keep,
        ).logits[0].float()

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, rows] logits -> [n, vocab] probabilities; ids without a head row get 0."""
        probs = torch.softmax(logits, dim=-1)
        if self.ids is None:
            return probs
        full = torch.zeros(probs.shape[0], self.vocab_size, device=probs.device)  # [n, vocab]
        full[:, self.ids] = probs
        return full


def keep_head_rows(model: PreTrainedModel, vocab: torch.Tensor) -> PreTrainedModel:
    """`model` whose LM head scores only the ids `vocab` [V_draft] (in that order), in place. The
    head gets weights of its own, so a head tied to the input embeddings stops being tied (the
    embeddings keep every row: the context may hold any token)."""
    head = model.get_output_embeddings()
    kept = torch.nn.Linear(head.in_features, len(vocab), bias=head.bias is not None, dtype=head.weight.dtype)
    with torch.no_grad():
        kept.weight.copy_(head.weight[vocab])  # [V_draft, H]
        if head.bias is not None:
            kept.bias.copy_(head.bias[vocab])
    model.config.tie_word_embeddings = False
    model.set_output_embeddings(kept)
    return model


def _check_trained_for(info: dict, target: Target, source: str) -> None:
    if info.get("vocab_size") != target.vocab_size:
        raise ValueError(
            f"{source} was trained for target {info.get('name')!r} with vocab_size={info.get('vocab_size')}, "
            f"but this target has vocab_size={target.vocab_size}"
        )


def load_grown(folder: str | os.PathLike, target: Target, dtype: torch.dtype | None = None) -> GrownDrafter:
    """The base from `taps.assets.load_model` with the folder's adapters merged in, in `dtype`
    (default: the target's)."""
    from peft import PeftModel

    from taps.assets import load_model

    cfg, info = read_grown(folder)
    _check_trained_for(info, target, str(folder))
    vocab = read_draft_vocabulary(folder, cfg)
    base, _ = load_model(cfg.base, dtype=torch.float32)
    with quiet_alora():
        model = PeftModel.from_pretrained(keep_layers(base, cfg.base_layers), str(folder))
    model = model.merge_and_unload() if cfg.adapt == "all" else on_mask_rows(model)
    return GrownDrafter(model, cfg, target, str(folder), dtype, vocab)


class MaskRows:
    """How many trailing tokens of the next forward are masks (shared by a drafter's MaskRowAdapters)."""

    n = 0


class MaskRowAdapter(torch.nn.Module):
    """A base linear layer plus its activated adapter on the forward's last `rows.n` tokens:
    y = base(x), and y[:, -n:] += x[:, -n:] A^T B^T * scale, peft's activated-LoRA arithmetic."""

    def __init__(self, base: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor, scale: float, rows: MaskRows):
        super().__init__()
        self.base_layer, self.rows = base, rows  # peft's name: taps.weightonly looks through it
        self.register_buffer("a_t", a.detach().T.contiguous())  # [in, r]
        self.register_buffer("b_t", (b.detach() * scale).T.contiguous())  # [r, out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)  # [B, T, out]
        n = self.rows.n
        if n:  # the model's one dtype throughout (an int8 drafter runs float32 activations)
            # Per sequence, 2-D in place (mm, then addmm_ into y's rows): half the time of the 3-D
            # `y[:, -n:] += x[:, -n:] @ a_t @ b_t`, whose second product ran as a broadcast bmm
            # (168 adapted layers of the 0.5B, 6 mask rows: 32.6 -> 17.9 ms, 2-core AVX2 EPYC).
            for x_seq, y_seq in zip(x, y):  # [T, in], [T, out]; a draft is one sequence
                y_seq[-n:].addmm_(x_seq[-n:].mm(self.a_t), self.b_t)  # [n, out]
        return y


def on_mask_rows(peft_model) -> PreTrainedModel:
    """The base of a peft model with activated adapters, for drafting: the mask's trained embedding
    row written into the base's table (and the head tied to it) and each adapted linear layer a
    MaskRowAdapter; the model's `mask_rows` (MaskRows) says how many trailing tokens are masks.
    Measured (a grown 0.5B, int8, 256 tokens of context, one draft, profiler self time, 2-core
    EPYC): through peft's own modules 72 ms against 34 merged (274-338 ms while peft also rebuilt
    the whole embedding table with the mask row swapped in on every forward); with MaskRowAdapter
    52.7 against 48.0 merged in one run."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

    rows = MaskRows()
    for module in peft_model.modules():
        if isinstance(module, TrainableTokensLayer) and not module.merged:
            module.merge()
    for name, module in list(peft_model.named_modules()):
        if isinstance(module, LoraLayer):
            adapter = module.active_adapters[0]
            parent, _, child = name.rpartition(".")
            setattr(peft_model.get_submodule(parent), child, MaskRowAdapter(
                module.get_base_layer(), module.lora_A[adapter].weight, module.lora_B[adapter].weight,
                module.scaling[adapter], rows))
    model = peft_model.get_base_model()
    model.mask_rows = rows
    return model


# ---------------------------------------------------------------------------------------------
# Training and registration
# ---------------------------------------------------------------------------------------------


class GrownTrainee:
    """A pretrained base with LoRA adapters and a trainable mask row (the Trainee of kind "grown");
    `train` is the training sequences' ids, which choose a draft vocabulary when one is asked for
    (the loss is then the softmax over those ids: what the drafter computes at inference)."""

    def __init__(self, cfg: TrainDrafterConfig, base_model: PreTrainedModel, train: list[list[int]]):
        info = _target_info(cfg.target)
        rows = base_model.get_output_embeddings().weight.shape[0]
        if rows > info.vocab_size:
            raise ValueError(f"base {cfg.base} predicts {rows} tokens, more than target {cfg.target}'s {info.vocab_size}")
        self.vocab = None  # [V_draft] token id of each draft-vocabulary index
        if cfg.draft_vocab_size is not None:
            self.vocab = torch.tensor(draft_vocabulary(train, min(cfg.draft_vocab_size, rows), rows))
        self.to_draft = None if self.vocab is None else draft_index(self.vocab, rows)  # [rows]
        self.spec = GrownConfig(cfg.base, cfg.mask_token_id, cfg.block_size, cfg.lora_rank, 2 * cfg.lora_rank,
                                cfg.base_layers, None if self.vocab is None else len(self.vocab), cfg.adapt)
        torch.manual_seed(cfg.seed)
        self.module = add_adapters(keep_layers(base_model, cfg.base_layers), self.spec).train()
        causal_lm = self.module.get_base_model()
        self.decoder, self.head = causal_lm.model, causal_lm.get_output_embeddings()
        self.weights = slot_weights(cfg.block_size, cfg.slot_gamma)
        self.info = info

    def block_loss(self, ids: Sequence[int], anchors: torch.Tensor, autocast) -> BlockLoss:
        ids_t = torch.tensor(list(ids))
        layout = block_layout(ids_t, anchors, self.spec.block_size, self.spec.mask_token_id)
        with autocast:
            if self.spec.adapt == "masks":
                logits = masks_block_logits(self.module, self.spec, layout)  # [N, block, rows]
            else:
                logits = block_logits(self.decoder, self.head, layout)
        if self.vocab is not None:
            logits = logits[..., self.vocab]  # [N, block, V_draft]
        return slot_loss(logits, ids_t, anchors, self.weights, self.vocab, self.to_draft)[0]


def _target_info(name: str) -> TargetInfo:
    """What a grown drafter records of its target, read from the target's config alone."""
    from transformers import AutoConfig

    from taps.assets import resolve

    config = AutoConfig.from_pretrained(resolve(name))
    return TargetInfo(name, config.vocab_size, config.hidden_size, config.num_hidden_layers)


def _load(folder: Path, target: Target, quantize: str) -> GrownDrafter:
    # it reads token ids only: an int8 one loads in float32 beside any target
    return load_grown(folder, target, load_dtype(quantize, target.dtype))


def _save(trainee: GrownTrainee, folder: Path) -> None:
    save_grown(trainee.module, trainee.spec, folder, trainee.info, trainee.vocab)


def _warm_start(trainee: GrownTrainee, folder: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    cfg, info = read_grown(folder)
    changed = sorted(k for k, v in asdict(cfg).items() if getattr(trainee.spec, k) != v)
    if info.get("vocab_size") != trainee.info.vocab_size:
        changed.append("target")
    vocab = read_draft_vocabulary(folder, cfg)
    if not changed and vocab is not None and not torch.equal(vocab, trainee.vocab):
        changed.append("draft vocabulary")  # chosen from the training data: other data, other ids
    if changed:
        raise ValueError(f"init_from: {folder} is a grown drafter with other settings ({', '.join(changed)} differ); "
                         "use the same base and drafter options")
    loaded = set_peft_model_state_dict(trainee.module, load_file(str(folder / "adapter_model.safetensors")))
    if loaded.unexpected_keys:
        raise ValueError(f"init_from: {folder}'s adapters do not fit this drafter "
                         f"({len(loaded.unexpected_keys)} unexpected, e.g. {loaded.unexpected_keys[0]})")


GROWN = register(DrafterKind(
    name="grown",
    doc="a pretrained --base with LoRA adapters",
    marker=GROWN_FILE,
    files=f"{GROWN_FILE} + peft's adapter_config.json and adapter_model.safetensors",
    load=_load,
    training=KindTraining(
        options=("base", "lora_rank", "base_layers", "adapt"),  # and draft_vocab_size, which every kind reads
        required={"base": "the pretrained model to grow (e.g. qwen2.5-coder-0.5b)"},
        runs=lambda cfg: cfg.base,  # only the base runs: a grown drafter reads no target
        trainee=GrownTrainee,
        save=_save,
        warm_start=_warm_start,
    ),
    auto_quant="int8",  # a network of its own, read as token ids: int8 on the CPU (taps.quantize.auto_scheme)
))
