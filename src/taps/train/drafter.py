"""Training a block drafter of any registered kind (taps.drafters.KINDS; docs/method.md section 2,
"Training recipe"). Every kind trains on the same data with the same random anchors, slot
weights (taps.drafters.objective), schedule and checkpoints; the kind's `Trainee` gives its block
losses, its trainable parameters and, through the kind, its saved folder. This module is the
generic loop: data, anchors, optimizer, schedule, evaluation, logging, resume.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from taps.assets import DTYPES
from taps.drafters import KINDS, shipped_drafter
from taps.drafters.base import DrafterKind, Trainee
from taps.drafters.grown import ADAPT
from taps.files import output_folder
from taps.records import is_header
from taps.train.eta import say_estimate

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ANCHOR_REGIONS = ("answer", "all")
INIT_LAYERS = ("random", "last", "first")  # kind "dflash": where the drafter layers start (taps.drafters.dflash_training.copy_target_layers)
GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}  # published slot-weight decay per block size
STATE_FILE = "state.pt"  # resumable training state
DRAFTER_DIR = "drafter"  # the latest drafter, a folder of its kind
LOG_FILE = "log.jsonl"  # one record per evaluation
# fields that may change between a run and its resumption: they do not change what is trained
# (the data file may move too: its content is compared, by hash)
RUN_FIELDS = frozenset({"out", "data", "stop_after_steps", "progress", "eval_every", "save_every"})


@dataclass(frozen=True)
class TrainDrafterConfig:
    target: str  # the frozen target: a packaged model name, a folder or a hub id (taps.assets.load_model)
    data: tuple[str, ...]  # JSONL files of training sequences, one {"ids": [token ids of the target]} record a line (a str: one file)
    out: str  # output folder: state.pt (resume), drafter/ (a folder of the kind), log.jsonl
    mask_token_id: int  # block filler; a row of the target's (dflash) or base's (grown) embedding table, never pad or eos
    kind: str = "dflash"  # the drafter kind to train: a name in taps.drafters.KINDS (each lists the options below only it reads)
    base: str | None = None  # kind "grown": the pretrained model grown into a drafter (packaged name, folder or hub id)
    lora_rank: int = 16  # kind "grown": rank of the adapters (alpha = 2 * rank)
    base_layers: int | None = None  # kind "grown": keep N of the base's decoder layers, spread evenly (None: all)
    adapt: str = "all"  # kind "grown": the tokens the adapters act on, "all" or "masks" (taps.drafters.grown.ADAPT)
    init_layers: str = "random"  # kind "dflash": "random" (published), or copy the target's "last" or "first" layers
    num_hidden_layers: int = 1  # kind "dflash": drafter transformer layers (published: 5; 1-3 fit a CPU)
    block_size: int = 16  # root + drafted slots per block (published: 16)
    target_layer_ids: tuple[int, ...] | None = None  # kind "dflash": target layers read; None: one per drafter layer, spread from 1 to L-3
    draft_vocab_size: int | None = None  # score only the N most frequent tokens of the training data (any kind); None: all
    anchors_per_sequence: int = 64  # blocks per sequence per step (published: up to 512); fewer if the sequence is short
    anchor_region: str = "answer"  # "answer": blocks start in a record's answer (after its n_prompt tokens), as at inference; "all": anywhere
    max_seq_len: int = 1024  # longer sequences are cut to their first max_seq_len tokens
    sequences_per_step: int = 1  # sequences whose gradients add up before one optimizer step
    epochs: int = 6  # passes over the training sequences (published: 6)
    # cut the schedule (warm-up, decay) to this many optimizer steps; None: all epochs; another on resume extends the run
    max_steps: int | None = None
    lr: float = 6e-4  # peak AdamW learning rate (published: 6e-4)
    warmup_fraction: float = 0.04  # share of all steps spent warming the learning rate up linearly (published: 4%)
    weight_decay: float = 0.01  # AdamW weight decay
    grad_clip: float = 1.0  # gradient-norm clip (published: 1.0)
    gamma: float | None = None  # slot-weight decay exp(-(k-1)/gamma); None: 7, 5, 4 for blocks of 16, 10, 8
    soft_label_weight: float = 0.0  # kind "dflash": share of the loss given to KL(target top-k || drafter); 0: hard labels only
    soft_label_top_k: int = 64  # kind "dflash": tokens of the target's distribution kept for soft labels
    eval_sequences: int = 8  # sequences held out (chosen by seed) to measure loss and per-slot accuracy
    eval_every: int = 100  # optimizer steps between evaluations (each appends a record to log.jsonl)
    save_every: int = 100  # optimizer steps between resumable checkpoints (state.pt and drafter/)
    stop_after_steps: int | None = None  # end this run at this step (the schedule still spans all epochs); rerun to resume
    dtype: str = "float32"  # "float32" or "bfloat16": the target's weights and the drafter's compute (its weights stay float32)
    seed: int = 0  # drafter init, held-out split, data order and anchors
    # start the weights from a run folder's state.pt, a drafter folder of the kind or "shipped" (the drafter
    # taps ships for the target), of the same drafter settings; the schedule starts anew
    init_from: str | None = None
    progress: bool = True  # show a tqdm progress bar

    def __post_init__(self):
        files = [self.data] if isinstance(self.data, (str, os.PathLike)) else self.data
        object.__setattr__(self, "data", tuple(map(os.fspath, files)))
        if not self.data:
            raise ValueError("data must name at least one JSONL file")
        if self.target_layer_ids is not None:
            object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if not isinstance(self.mask_token_id, int) or self.mask_token_id < 0:
            raise ValueError(f"mask_token_id must be a token id of the target, got {self.mask_token_id!r}")
        self._check_kind_options()
        if self.adapt not in ADAPT:
            raise ValueError(f"adapt must be one of {', '.join(ADAPT)}, got {self.adapt!r}")
        if self.init_layers not in INIT_LAYERS:
            raise ValueError(f"init_layers must be one of {', '.join(INIT_LAYERS)}, got {self.init_layers!r}")
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
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.stop_after_steps is not None and self.stop_after_steps < 1:
            raise ValueError(f"stop_after_steps must be >= 1, got {self.stop_after_steps}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")
        if self.gamma is None and self.block_size not in GAMMA_BY_BLOCK:
            raise ValueError(
                f"no published gamma for block_size={self.block_size} (known: {sorted(GAMMA_BY_BLOCK)}); set gamma"
            )

    def _check_kind_options(self) -> None:
        """The kind is registered, its required options are given, other kinds' options are not."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name, what in KINDS[self.kind].training.required.items():
            if getattr(self, name) is None:
                raise ValueError(f'kind "{self.kind}" needs {name}: {what}')
        defaults = {f.name: f.default for f in fields(self)}
        foreign = [(name, other.name) for other in KINDS.values() if other.name != self.kind for name in other.training.options]
        for name, owner in foreign:
            if getattr(self, name) != defaults[name]:
                raise ValueError(f'{name} applies to kind "{owner}" only, not to kind "{self.kind}"')

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
    target generated, and a prompt's chat template and system text are no draft to learn; a record
    whose answer starts too late for the cut (a follow-up after a long first turn) keeps
    max_seq_len // 2 tokens before its answer and the answer's start instead of its beginning.
    Records without "n_prompt" (raw text) place them anywhere."""
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
            if first > len(ids) - 2:
                raise ValueError(f"{path}:{line_no}: the answer holds no token to draft after its first "
                                 f"(n_prompt={first}, {len(ids)} ids); drop the record or use anchor_region 'all'")
            start = 0 if first <= max_seq_len - 2 else first - max_seq_len // 2  # a long conversation: its last part
            sequences.append(TrainSequence(ids[start : start + max_seq_len], first - start))
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


# ---------------------------------------------------------------------------------------------
# Anchors and trainable state
# ---------------------------------------------------------------------------------------------


def sample_anchors(seq_len: int, n: int, generator: torch.Generator, first: int = 0) -> torch.Tensor:
    """[min(n, seq_len - 1 - first)] distinct sorted anchors in [first, seq_len - 2]: each has a label after it."""
    candidates = first + torch.randperm(seq_len - 1 - first, generator=generator)[:n]
    return candidates.sort().values


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


def evaluate(trainee: Trainee, sequences: list[TrainSequence], cfg: TrainDrafterConfig, autocast) -> dict:
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


def train_step(trainee: Trainee, batch: list[TrainSequence], cfg: TrainDrafterConfig, anchor_rng: torch.Generator,
               autocast) -> list[float]:
    """Gradients of one optimizer step (summed over `batch`, not yet applied); returns the losses."""
    losses = []
    for seq in batch:
        anchors = sample_anchors(len(seq.ids), cfg.anchors_per_sequence, anchor_rng, seq.first_anchor)
        loss = trainee.block_loss(seq.ids, anchors, autocast).loss
        (loss / len(batch)).backward()
        losses.append(loss.item())
    return losses


def tau_gain_per_doubling(evals: list[dict], tokens_per_step: float) -> float:
    """Least-squares slope of a run's estimated chain tau against log2(training tokens) over its
    evaluation records (log.jsonl lines with "eval_tau_chain") after step 0: what one more
    doubling of tokens would add if the trend held (a cosine schedule's decay flattens the end,
    so this is a lower estimate). Needs evaluations at two or more steps after 0."""
    points = [(math.log2(r["step"] * tokens_per_step), r["eval_tau_chain"]) for r in evals if r["step"] > 0]
    if len({x for x, _ in points}) < 2:
        raise ValueError("a trend needs evaluations at two or more steps after step 0")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


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
    drafter_dir: Path  # the latest drafter, a folder of its kind
    step: int  # optimizer steps done so far
    total_steps: int  # steps of the whole schedule; step < total_steps means rerun to resume


def train_drafter(cfg: TrainDrafterConfig, model: PreTrainedModel | None = None) -> TrainResult:
    """Train (or resume training) a drafter for `cfg.target` on `cfg.data` into `cfg.out`.

    `model` replaces loading the model that runs (the kind says which: the frozen target for
    "dflash", the base to grow for "grown"); for tests and notebooks. It is cast to cfg.dtype in place.
    A run refused before it wrote anything (a bad mask token, say) leaves no empty `cfg.out`.
    """
    with output_folder(cfg.out, f"the training run to {cfg.out}", "choose another --out") as out:
        return _train_drafter(cfg, model, out)


def _changed(saved: dict, now: dict) -> list[str]:
    """The settings a saved state holds otherwise than `now` (or only one of them holds)."""
    return sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))


def _warm_start(trainee: Trainee, kind: DrafterKind, given: str, target: str) -> None:
    """Start the trainee's weights from another run's state.pt (its folder or the file) or from a
    saved drafter folder of the same kind ("shipped": the drafter of that kind taps ships for the target), for a
    drafter of the same settings: e.g. to go on with more data, whose file hash a resumed run would
    refuse, or on a machine where the run that trained the shipped drafter is gone."""
    path = Path(given)
    if given == "shipped":
        shipped = shipped_drafter(target, kind.name)
        if shipped is None:
            raise ValueError(f"init_from: taps ships no {kind.name} drafter for {target}; name a run or drafter folder")
        path = Path(shipped)
    if (path / kind.marker).is_file():
        kind.training.warm_start(trainee, path)
        return
    state_path = path / STATE_FILE if path.is_dir() else path
    if not state_path.is_file():
        raise ValueError(f"init_from: no training state or {kind.name} drafter at {path}; "
                         "name a train-drafter run folder, a drafter folder of that kind, or 'shipped'")
    state = torch.load(state_path, weights_only=True)
    changed = _changed(state["drafter_config"], asdict(trainee.spec))
    if changed:
        raise ValueError(f"init_from: {state_path} trained a drafter with other settings "
                         f"({', '.join(changed)} differ); use the same kind, base and drafter options")
    trainee.module.load_state_dict(state["drafter"], strict=False)


def _train_drafter(cfg: TrainDrafterConfig, model: PreTrainedModel | None, out: Path) -> TrainResult:
    torch.set_flush_denormal(True)  # denormals run through slow microcode on x86 CPUs
    dtype = DTYPES[cfg.dtype]
    training = KINDS[cfg.kind].training
    if model is None:
        from taps.assets import load_model

        model, _ = load_model(training.runs(cfg), dtype=dtype)
    model = model.to(dtype).eval().requires_grad_(False)
    vocab_size = model.get_output_embeddings().weight.shape[0]

    sequences = [s for path in cfg.data for s in load_sequences(path, vocab_size, cfg.max_seq_len, cfg.anchor_region)]
    train, held_out = split_sequences(sequences, cfg.eval_sequences, cfg.seed)
    trainee: Trainee = training.trainee(cfg, model, [s.ids for s in train])
    params = [p for p in trainee.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.sequences_per_step)
    total = cfg.epochs * steps_per_epoch if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * steps_per_epoch)

    def schedule(start: int) -> torch.optim.lr_scheduler.LambdaLR:
        """Warm-up, then decay to 0 at `total`, over the steps from `start`: 0, or the step an extended run stood at."""
        span = total - start
        warmup = max(1, round(cfg.warmup_fraction * span))
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s - start, span, warmup), last_epoch=start - 1)

    schedule_start = 0
    scheduler = schedule(schedule_start)
    anchor_rng = torch.Generator().manual_seed(cfg.seed)
    run_config = {k: v for k, v in asdict(cfg).items() if k not in RUN_FIELDS}
    data_hash = hashlib.sha256()  # of the files' bytes in order (one file: its own sha256, as before several)
    for path in cfg.data:
        data_hash.update(Path(path).read_bytes())
    run_config["data_sha256"] = data_hash.hexdigest()
    step, loss_sum, loss_n, tokens = 0, 0.0, 0, 0  # tokens: of the training sequences passed so far

    state_path = out / STATE_FILE
    if state_path.exists():
        state = torch.load(state_path, weights_only=True)
        changed = _changed(state["config"], run_config) + _changed(state["drafter_config"], asdict(trainee.spec))
        # another --max-steps alone extends (or cuts) the run: it goes on with its data order, anchors and
        # optimizer, and the learning rate warms up and decays again over the steps from where it stands
        extended = changed == ["max_steps"]
        if extended and total <= state["step"]:
            raise ValueError(f"{out} is at step {state['step']} already; give --max-steps above it to go on")
        if changed and not extended:
            raise ValueError(
                f"{out} holds a run with other settings ({', '.join(changed)} differ); "
                "resume with the same settings or choose a new out folder"
            )
        trainee.module.load_state_dict(state["drafter"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        anchor_rng.set_state(state["anchor_rng"])
        step, loss_sum, loss_n = state["step"], state["loss_sum"], state["loss_n"]
        schedule_start = step if extended else state.get("schedule_start", 0)  # checkpoints from before extensions: 0
        scheduler = schedule(schedule_start)  # sets the optimizer's rates: right for an extension only
        if not extended:  # back to where the saved schedule stood
            scheduler.load_state_dict(state["scheduler"])
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
        tokens = state.get("tokens", 0)  # checkpoints from before the count resume from 0
    elif cfg.init_from is not None:
        _warm_start(trainee, KINDS[cfg.kind], cfg.init_from, cfg.target)

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    stop = total if cfg.stop_after_steps is None else min(total, cfg.stop_after_steps)
    started = time.perf_counter()

    def log(record: dict) -> None:
        record.update(step=step, epoch=step / steps_per_epoch, tokens=tokens, lr=scheduler.get_last_lr()[0],
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
            "anchor_rng": anchor_rng.get_state(), "loss_sum": loss_sum, "loss_n": loss_n, "tokens": tokens,
            "schedule_start": schedule_start,
        })
        training.save(trainee, out / DRAFTER_DIR)

    if step == 0:
        log({"train_loss": None})  # the untrained baseline
    bar = tqdm(total=total, initial=step, disable=not cfg.progress, desc="train-drafter", unit="step")
    first, loop_start = step, time.perf_counter()
    while step < stop:
        epoch, index = divmod(step, steps_per_epoch)
        chosen = epoch_order(len(train), cfg.seed, epoch)[index * cfg.sequences_per_step : (index + 1) * cfg.sequences_per_step]
        losses = train_step(trainee, [train[i] for i in chosen], cfg, anchor_rng, autocast)
        loss_sum, loss_n = loss_sum + sum(losses), loss_n + len(losses)
        tokens += sum(len(train[i].ids) for i in chosen)
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step == first + 1 and stop > step:
            say_estimate("train-drafter", time.perf_counter() - loop_start, stop - step, "step")
        bar.update(1)
        bar.set_postfix(loss=f"{sum(losses) / len(losses):.3f}")
        if step % cfg.eval_every == 0 or step == total:
            log({"train_loss": loss_sum / max(loss_n, 1)})
            loss_sum, loss_n = 0.0, 0
        if step % cfg.save_every == 0 or step == stop:
            save()
    bar.close()
    return TrainResult(out / DRAFTER_DIR, step, total)
