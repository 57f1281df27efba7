"""The DFlash drafter kind: drafting over a Target, the checkpoint layout, loading, registration.

The network is taps.drafters.dflash_model; its training layout is taps.drafters.dflash_training.
A DFlash drafter reads the hidden states of the target layers `target_layer_ids` (its
`feature_layers`) and shares the target's embeddings and LM head, so it runs in the target's dtype.

Checkpoints use the layout of the public DFlash drafters (z-lab/*-DFlash-b16), so those load
unchanged: `config.json` (Qwen3-style fields plus `block_size` and
`dflash_config: {mask_token_id, target_layer_ids}`) and `model.safetensors` with parameter names
`layers.N.self_attn.{q,k,v,o}_proj`, `layers.N.self_attn.{q,k}_norm`, `layers.N.mlp.{gate,up,down}_proj`,
`layers.N.{input,post_attention}_layernorm`, `norm`, `fc`, `hidden_norm`. Ours add a `taps` block
to config.json (the target it was trained for) and, with a draft vocabulary, a `draft_vocab_ids`
tensor. `config.json` marks the kind's folders.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from taps.drafters.base import DrafterKind, KindTraining, TargetInfo, register
from taps.drafters.dflash_model import DRAFT_VOCAB_KEY, ContextCache, DFlashConfig, DFlashDrafterModel
from taps.drafters.dflash_training import DFlashTrainee
from taps.files import check_weights, read_json
from taps.linear import use_linear
from taps.target import Target

ARCHITECTURE = "DFlashDraftModel"  # `architectures` entry of the public checkpoints
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def check_target(cfg: DFlashConfig, target: Target, source: str = "the drafter") -> None:
    """What any DFlash drafter needs from a target: its widths, layers and mask token."""
    tcfg = target.config
    if cfg.hidden_size != tcfg.hidden_size:
        raise ValueError(f"{source} has hidden_size={cfg.hidden_size} but the target has hidden_size={tcfg.hidden_size}")
    if cfg.vocab_size != target.vocab_size:
        raise ValueError(f"{source} has vocab_size={cfg.vocab_size} but the target's LM head has {target.vocab_size} rows")
    outside = [i for i in cfg.target_layer_ids if i >= tcfg.num_hidden_layers]
    if outside:
        raise ValueError(f"{source} reads target layers {outside}, outside the target's {tcfg.num_hidden_layers} layers")
    rows = target.model.get_input_embeddings().weight.shape[0]
    if not 0 <= cfg.mask_token_id < rows:
        raise ValueError(f"{source} has mask_token_id={cfg.mask_token_id}, not a row of the target's {rows}-row embedding table")


class DFlashDrafter:
    """The Drafter protocol (taps.drafters) for a DFlash model over a Target. The target must read
    the drafter's `feature_layers` (its `target_layer_ids`), in that order: load_drafter calls
    `target.read_features(drafter.feature_layers)`."""

    def __init__(self, model: DFlashDrafterModel, target: Target, source: str = "the drafter"):
        cfg = model.config
        check_target(cfg, target, source)
        self.model = use_linear(model.to(target.device, target.dtype).eval())  # beside the target, in its dtype
        self.embed = target.model.get_input_embeddings()
        head = target.model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        self.vocab = None if cfg.draft_vocab_ids is None else model.draft_vocab_ids  # [V_draft]
        if self.vocab is not None:
            weight, bias = weight[self.vocab], None if bias is None else bias[self.vocab]
        self.head_weight, self.head_bias = weight, bias  # [V_draft, H], [V_draft] or None
        self.block_len = cfg.block_size - 1
        self.vocab_size = target.vocab_size
        self.feature_layers = cfg.target_layer_ids
        self.dtype, self.device = target.dtype, target.device
        self.cache = ContextCache(cfg.num_hidden_layers)

    def start(self, prompt_ids: Sequence[int], reused: int = 0) -> None:
        # its context is the target's features of the prompt, all of them given again (Target.prefill)
        self.cache = ContextCache(self.model.config.num_hidden_layers)

    @torch.inference_mode()
    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        """Append the new context features' K/V, then one forward over [root, MASK * (block_size - 1)]."""
        cfg = self.model.config
        root_pos = len(ids) - 1  # the context is every committed token before the root
        if features is None:
            features = torch.empty(0, len(cfg.target_layer_ids) * cfg.hidden_size, dtype=self.dtype, device=self.device)
        if self.cache.length + features.shape[0] != root_pos:
            raise ValueError(
                f"the drafter holds {self.cache.length} context positions and got {features.shape[0]} more, "
                f"but the root is at position {root_pos}: call start() for a new sequence and pass the "
                "features of every committed token except the root, once"
            )
        block = torch.full((1, cfg.block_size), cfg.mask_token_id, dtype=torch.long, device=self.device)
        block[0, 0] = ids[-1]
        hidden = self.model(
            self.embed(block),
            root_pos + torch.arange(cfg.block_size, device=self.device)[None],
            features[None].to(self.dtype),
            torch.arange(self.cache.length, root_pos, device=self.device)[None],
            cache=self.cache,
        )  # [1, block, H]
        logits = F.linear(hidden[0, 1:], self.head_weight, self.head_bias).float()  # [L, V_draft]
        probs = torch.softmax(logits, dim=-1)
        if self.vocab is None:
            return probs
        # tokens outside the draft vocabulary get probability 0; lossless, as the target verifies
        full = torch.zeros(self.block_len, self.vocab_size, device=probs.device)  # [L, vocab]
        full[:, self.vocab] = probs
        return full


# ---------------------------------------------------------------------------------------------
# Checkpoint layout
# ---------------------------------------------------------------------------------------------


def config_to_json(cfg: DFlashConfig, info: TargetInfo, dtype: torch.dtype) -> dict:
    """The public DFlash config.json fields, plus our `taps` block."""
    dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}
    if cfg.draft_vocab_ids is not None:
        dflash["draft_vocab_size"] = len(cfg.draft_vocab_ids)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": dflash,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "num_target_layers": info.num_hidden_layers,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "dtype": str(dtype).removeprefix("torch."),
        "taps": {
            "target": info.name,
            "vocab_size": info.vocab_size,
            "hidden_size": info.hidden_size,
            "num_hidden_layers": info.num_hidden_layers,
            "target_layer_ids": list(cfg.target_layer_ids),
        },
    }


def _check_supported(raw: dict, source: str) -> None:
    """Refuse hub variants this drafter does not implement, rather than load them wrongly."""
    archs = raw.get("architectures") or [ARCHITECTURE]
    if ARCHITECTURE not in archs:
        raise ValueError(f"{source}: architecture {archs} is not {ARCHITECTURE!r}, the only one taps implements")
    layer_types = set(raw.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(f"{source}: layer types {sorted(layer_types)} are not supported (full attention only)")
    if raw.get("attention_bias"):
        raise ValueError(f"{source}: attention biases are not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act={raw['hidden_act']!r} is not supported (silu only)")
    rope = raw.get("rope_parameters") or {}
    if raw.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        raise ValueError(f"{source}: rope scaling is not supported (default rotary positions only)")


def config_from_json(raw: dict, draft_vocab_ids: Sequence[int] | None, source: str) -> DFlashConfig:
    """Read our config.json or a public one (block_size at the top level or in dflash_config,
    rope_theta at the top level or in rope_parameters)."""
    _check_supported(raw, source)
    dflash = raw.get("dflash_config") or {}
    if dflash.get("mask_token_id") is None:
        raise ValueError(f"{source}: dflash_config.mask_token_id is missing; the mask token must be explicit")
    if not dflash.get("target_layer_ids"):
        raise ValueError(f"{source}: dflash_config.target_layer_ids is missing")
    rope_theta = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
    if rope_theta is None:
        raise ValueError(f"{source}: config.json has no rope_theta (at the top level or in rope_parameters)")
    try:
        heads = raw["num_attention_heads"]
        return DFlashConfig(
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            intermediate_size=raw["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"],
            target_layer_ids=tuple(dflash["target_layer_ids"]),
            mask_token_id=dflash["mask_token_id"],
            block_size=int(dflash.get("block_size", raw.get("block_size", 16))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            draft_vocab_ids=draft_vocab_ids,
        )
    except KeyError as missing:
        raise ValueError(f"{source}: config.json lacks the field {missing}") from None
    except ValueError as bad:
        raise ValueError(f"{source}: {bad}") from None


def save_dflash(model: DFlashDrafterModel, folder: str | os.PathLike, target_info: TargetInfo) -> Path:
    """Write config.json + model.safetensors in the DFlash layout.

    The files go into a temporary sibling folder that then replaces `folder`, so a crash never
    leaves a half-written drafter behind."""
    cfg = model.config
    if (target_info.hidden_size, target_info.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
        raise ValueError(f"target_info {target_info} does not match the drafter's hidden and vocabulary sizes")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
        save_file(state, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        raw = config_to_json(cfg, target_info, next(model.parameters()).dtype)
        (tmp / CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n")
        old = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def read_dflash(folder: str | os.PathLike) -> tuple[DFlashDrafterModel, dict]:
    """The model in float32 from a DFlash folder (ours or the hub's), and its raw config.json."""
    folder = Path(folder)
    source = str(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise ValueError(f"{source} is not a DFlash drafter folder: it needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = read_json(folder / CONFIG_FILE, "fix it or copy the drafter again")
    check_weights(folder, "copy or download the drafter again")
    state = load_file(folder / WEIGHTS_FILE)
    vocab = state.get(DRAFT_VOCAB_KEY)
    expected = (raw.get("dflash_config") or {}).get("draft_vocab_size")
    if (vocab is None) != (expected is None) or (vocab is not None and vocab.numel() != expected):
        raise ValueError(f"{source}: dflash_config.draft_vocab_size={expected} disagrees with the {DRAFT_VOCAB_KEY} tensor")
    cfg = config_from_json(raw, None if vocab is None else vocab.tolist(), source)
    model = DFlashDrafterModel(cfg)
    state = {name: t.float() if t.is_floating_point() else t for name, t in state.items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(f"{source}: {WEIGHTS_FILE} does not fit the DFlash layout of its config.json: {error}") from None
    return model.eval(), raw


# our parameter names that transformers' DFlash assistant spells otherwise; every other name is the same
TRANSFORMERS_NAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}


def as_transformers_assistant(model: DFlashDrafterModel):
    """The drafter as transformers' own DFlash assistant, `MuseGlimmerAssistantModel` (5.19), which
    `model.generate(..., assistant_model=..., speculation_type="dflash")` runs: the same network
    (context projection `fc` + `hidden_norm`, layers with q/k norms, a block of the root and mask
    tokens attending to the context and to each other) under the names of TRANSFORMERS_NAMES. Its
    `target_layer_ids` mean what ours do: transformers asks the target for those layers as
    `output_hidden_states`, and that tuple holds layer i's output at index i. transformers scores
    every token with the target's LM head, so a draft vocabulary is dropped: the drafter then also
    proposes tokens outside it, which the target verifies like any other (lossless either way)."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    cfg = model.config
    assistant = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        layer_types=["full_attention"] * cfg.num_hidden_layers, block_size=cfg.block_size,
        mask_token_id=cfg.mask_token_id, target_layer_ids=list(cfg.target_layer_ids),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    ))  # fmt: skip
    state = {TRANSFORMERS_NAMES.get(name, name): t for name, t in model.state_dict().items() if name != DRAFT_VOCAB_KEY}
    assistant.load_state_dict(state, strict=True)
    return assistant.to(next(model.parameters()).dtype).eval()


def _check_trained_for(info: dict, target: Target, source: str) -> None:
    have = {
        "vocab_size": target.vocab_size,
        "hidden_size": target.config.hidden_size,
        "num_hidden_layers": target.config.num_hidden_layers,
    }
    for name, got in have.items():
        if info.get(name) != got:
            raise ValueError(
                f"{source} was trained for target {info.get('target')!r} with {name}={info.get(name)}, "
                f"but this target has {name}={got}"
            )


def load_dflash(folder: str | os.PathLike, target: Target) -> DFlashDrafter:
    """A drafter from a DFlash folder, checked against `target` and cast to its dtype.

    Ours carry a `taps` block naming the target they were trained for, and any difference is an
    error; a hub folder has none, so only what it determines is checked (hidden size, vocabulary
    size, number of target layers when given, layer ids within range, mask token)."""
    model, raw = read_dflash(folder)
    n_layers = target.config.num_hidden_layers
    if "taps" in raw:
        _check_trained_for(raw["taps"], target, str(folder))
    elif raw.get("num_target_layers", n_layers) != n_layers:
        raise ValueError(
            f"{folder} was made for a target with num_target_layers={raw['num_target_layers']}, "
            f"but this target has {n_layers} layers"
        )
    return DFlashDrafter(model, target, str(folder))


# ---------------------------------------------------------------------------------------------
# The kind
# ---------------------------------------------------------------------------------------------


def _load(folder: Path, target: Target, quantize: str) -> DFlashDrafter:
    return load_dflash(folder, target)  # in the target's dtype whatever `quantize`: it shares the target's embeddings


def _save(trainee: DFlashTrainee, folder: Path) -> None:
    save_dflash(trainee.module, folder, trainee.info)


def _warm_start(trainee: DFlashTrainee, folder: Path) -> None:
    model, _ = read_dflash(folder)
    now = asdict(trainee.spec)
    changed = sorted(k for k, v in asdict(model.config).items() if now[k] != v)
    if changed:
        raise ValueError(f"init_from: {folder} is a DFlash drafter with other settings ({', '.join(changed)} differ); "
                         "use the same drafter options")
    trainee.module.load_state_dict(model.state_dict())


DFLASH = register(DrafterKind(
    name="dflash",
    doc="a new DFlash model reading target features",
    marker=CONFIG_FILE,
    files=f"{CONFIG_FILE} + {WEIGHTS_FILE} (the public DFlash layout)",
    load=_load,
    training=KindTraining(
        options=("num_hidden_layers", "target_layer_ids", "soft_label_weight", "soft_label_top_k", "init_layers"),
        required={},
        runs=lambda cfg: cfg.target,  # the frozen target gives the features and the soft labels
        trainee=DFlashTrainee,
        save=_save,
        warm_start=_warm_start,
    ),
))
