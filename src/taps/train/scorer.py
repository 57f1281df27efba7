"""Training the TAPS edge scorer (docs/method.md 3.4e): record verification traces, then fit.

Recording. Each training prompt is decoded with the drafter, and every round the candidate pool
of 3.4a (`taps.policies.build_pool`: top-K per depth, best-first to N_pool nodes, plus n-gram
lookup paths as in decoding) is verified AS THE ROUND'S TREE. The pool is prefix-closed, so this
is an ordinary (if large) verification and decoding stays lossless (at temperature 0 in float32
the recorded output is plain greedy decoding). Verifying the whole pool, not the tree a policy
would pick from it, is what makes every pool edge labelled: the target's logits at every pool
node u give p_u = SamplingConfig.probs(logits[u]), and each child c of u is labelled with
p_u[token(c)] (temperature > 0) or 1[argmax = token(c)] (temperature 0); "none" is the rest of
the mass, left to `scorer_loss`. The accepted path of that verification labels "reached": a node
of any tree drawn from the pool is reached exactly when it lies on the pool's accepted path (the
same draws, walked in a subtree, stop at the first node the subtree lacks).

A round is stored as a `ScorerExample` (the pool's `EdgeFeatures`, which need only the per-depth
entropy of the marginals, never the [L, vocab] marginals, and its `ScorerLabels`); one
safetensors file per prompt under `out/traces/`, so recording resumes per prompt and a larger
prompt count only adds files.

Training. `EdgeScorer` with `taps.scorer.train_step` (AdamW) on pools of the training prompts;
the traces of `eval_prompts` prompts (chosen by seed) are held out, and `out/log.jsonl` gets one
line per epoch (epoch 0 = before training, i.e. the plain marginal scorer) with the held-out
loss and a calibration pair: mean predicted q_reach vs the actual on-path rate over held-out
pool nodes, and the tokens a round would accept if each held-out pool were cut to the
`guard_nodes` nodes the scorer ranks first (`accepted_at_size`). The scorer is saved with
`EdgeScorer.save(out/scorer)` only if it passes the guard: on those held-out prompts it accepts at
least as many tokens per round at that size as the plain marginals (epoch 0) do; a scorer that
does not generalise would make taps' trees worse than DDTree's (issue 22 measured one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from taps.assets import DTYPES
from taps.scorer import (
    EdgeFeatures,
    EdgeScorer,
    ScorerConfig,
    ScorerExample,
    ScorerLabels,
    log_reach,
    scorer_loss,
    train_step,
)
from taps.train.prompts import parse_mix
from taps.train.traces import (  # noqa: F401  the recording half, re-exported
    TRACE_DIR,
    Trace,
    load_trace,
    pool_labels,
    record_trace,
    record_traces,
    save_trace,
)
from taps.verify import SamplingConfig

if TYPE_CHECKING:
    from taps.drafters import Drafter
    from taps.target import Target

SCORER_DIR = "scorer"  # EdgeScorer.save layout
LOG_FILE = "log.jsonl"  # one line per epoch
RECORD_FIELDS = ("target", "drafter", "block_len", "prompt_seed", "prompt_mix", "chat_template", "temperature",
                 "top_k", "top_p", "max_new_tokens", "k", "pool_size", "lookup", "dtype", "seed")


@dataclass(frozen=True)
class TrainScorerConfig:
    target: str  # the target: packaged model name, folder or hub id (a label only when a Target is passed in)
    drafter: str  # a trained drafter folder or a test drafter name (oracle, noisy, random)
    out: str  # output folder: traces/ (reused), scorer/ (EdgeScorer.save), log.jsonl
    prompts: int = 64  # training prompts (taps.train.prompts.training_prompts: never evaluation prompts)
    prompt_seed: int = 0  # which training prompts (the seed of training_prompts)
    prompt_mix: str = ""  # their sources, SOURCE=WEIGHT,... (taps.train.prompts.parse_mix); "" = DEFAULT_MIX
    chat_template: bool = True  # prompts go through the target's chat template
    block_len: int | None = None  # a test drafter's positions per round; None = its default (a trained one has its own)
    temperature: float = 0.0  # recorded decoding: 0 = greedy (one-hot labels), > 0 = sampled (probability labels)
    top_k: int = 0  # sampling top-k of the labels' distribution; 0 = off
    top_p: float = 1.0  # sampling top-p of the labels' distribution; 1 = off
    max_new_tokens: int = 128  # tokens decoded per prompt while recording
    k: int = 8  # pool: top-K tokens per depth (TapsConfig.k)
    pool_size: int = 128  # pool: most drafter nodes, N_pool (TapsConfig.pool_size); every one is verified each round
    lookup: bool = True  # pool: add n-gram lookup continuations, as decoding does (the scorer learns the source)
    dtype: str = "float32"  # the target's weights while recording: float32 (exact labels) or bfloat16
    eval_prompts: int = 4  # prompts (chosen by seed) whose traces are held out for the per-epoch evaluation
    epochs: int = 10  # passes over the training pools
    batch_pools: int = 32  # pools (rounds) per optimizer step
    lr: float = 3e-3  # AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    bce_weight: float = 1.0  # weight of the q_reach calibration BCE next to the sibling KL (scorer_loss)
    buckets: int = 4096  # scorer: rows of the hashed token embedding (ScorerConfig.buckets)
    hidden: int = 64  # scorer: width of the edge and none MLPs (ScorerConfig.hidden)
    seed: int = 0  # sampling draws while recording (temperature > 0), held-out split, batch order, scorer init
    guard_nodes: int = 32  # the guard's tree size: held-out pools cut to this many nodes by each scorer
    progress: bool = True  # show progress bars

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("prompts", "max_new_tokens", "k", "pool_size", "epochs", "batch_pools", "buckets", "hidden",
                     "guard_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.guard_nodes >= self.pool_size:
            raise ValueError(f"guard_nodes ({self.guard_nodes}) must be below pool_size ({self.pool_size}): cut to the "
                             "whole pool, every scorer selects the same tree and the guard compares nothing; "
                             "raise --pool-size or lower --guard-nodes")
        if self.eval_prompts < 0 or self.prompt_seed < 0 or self.seed < 0:
            raise ValueError("eval_prompts, prompt_seed and seed must be >= 0")
        if self.block_len is not None and self.block_len < 1:
            raise ValueError(f"block_len must be >= 1, got {self.block_len}")
        if not (self.lr > 0 and self.weight_decay >= 0 and self.bce_weight >= 0):
            raise ValueError("need lr > 0, weight_decay >= 0 and bce_weight >= 0")
        self.sampling  # validates temperature, top_k, top_p
        if self.prompt_mix:
            parse_mix(self.prompt_mix)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def record_settings(self) -> dict:
        """What the traces depend on (the seed only draws samples at temperature > 0)."""
        out = {name: getattr(self, name) for name in RECORD_FIELDS}
        if self.temperature == 0:
            del out["seed"]
        if not self.prompt_mix:  # traces recorded before the mix could be chosen pin none
            del out["prompt_mix"]
        return out


HELP = {  # one line per TrainScorerConfig option of `taps train-scorer` (bool fields: their --no-... flag)
    "prompts": "training prompts to record (never evaluation prompts; a larger N later adds traces)",
    "prompt_seed": "which training prompts (seed of the prompt mix)",
    "prompt_mix": "their sources: SOURCE=WEIGHT,... over code-write, code-explain, math, reasoning, general, chat "
                  "(default: taps.train.prompts.DEFAULT_MIX, which has no chat)",
    "chat_template": "tokenize prompts as they are (no chat template)",
    "block_len": "positions a test drafter proposes per round (default: the drafter's)",
    "temperature": "recorded decoding: 0 = greedy, one-hot labels; > 0 = sampled, probability labels",
    "top_k": "sampling top-k of the labels' distribution; 0 = off",
    "top_p": "sampling top-p of the labels' distribution; 1 = off",
    "max_new_tokens": "tokens decoded per prompt while recording",
    "k": "pool: top-K tokens per depth",
    "pool_size": "pool: most drafter nodes, all verified each recorded round",
    "lookup": "pool: no n-gram lookup candidates (decoding adds them by default)",
    "dtype": "target weights while recording (float32 gives exact labels)",
    "eval_prompts": "prompts whose traces are held out for evaluation",
    "epochs": "passes over the training pools",
    "batch_pools": "pools per optimizer step",
    "lr": "AdamW learning rate",
    "weight_decay": "AdamW weight decay",
    "bce_weight": "weight of the q_reach calibration BCE next to the sibling KL",
    "buckets": "scorer: hashed token embedding rows",
    "hidden": "scorer: MLP width",
    "seed": "sampling draws (temperature > 0), held-out split, batch order, scorer init",
    "guard_nodes": "the guard: at this many nodes the trained scorer must accept at least as many tokens per round "
                   "on held-out prompts as the plain marginals, else it is not saved",
    "progress": "no progress bars",
}


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(scorer: EdgeScorer, examples: Sequence[ScorerExample], bce_weight: float = 1.0) -> dict[str, float]:
    """Held-out loss terms and calibration: mean predicted q_reach vs the on-path rate, over
    every non-root pool node (all are labelled in recorded traces)."""
    f = EdgeFeatures.concat([ex.features for ex in examples])
    labels = ScorerLabels.concat([ex.labels for ex in examples])
    log_q, log_none = scorer(f)
    loss = scorer_loss(log_q, log_none, f, labels, bce_weight)
    known = labels.accepted_known & (f.parents >= 0)
    reach = log_reach(log_q, f.parents, f.depths).exp()[known]
    return {"loss": loss.total.item(), "kl": loss.kl.item(), "bce": loss.bce.item(),
            "mean_q_reach": reach.mean().item(), "on_path_rate": labels.accepted[known].float().mean().item()}


@torch.no_grad()
def accepted_at_size(scorer: EdgeScorer, examples: Sequence[ScorerExample], nodes: int) -> float:
    """Mean tokens a round accepts (bonus excluded) when each pool is cut to the `nodes` drafted
    nodes of highest q_reach under `scorer`: the policy's fixed-size selection, replayed on
    recorded pools. The cut is prefix-closed (q_cond <= 1, so a child never outranks its
    parent; equal reach goes to the shallower node), and the accepted path's nodes inside a
    prefix-closed set are a prefix of it, so their count is what verification would accept."""
    if not examples:
        return 0.0
    f = EdgeFeatures.concat([ex.features for ex in examples])
    labels = ScorerLabels.concat([ex.labels for ex in examples])
    log_q, _ = scorer(f)
    reach = log_reach(log_q, f.parents, f.depths)  # [n]
    on_path = labels.accepted * labels.accepted_known  # [n]
    total, start = 0.0, 0
    for ex in examples:
        end = start + ex.features.parents.shape[0]
        drafted = (f.parents[start:end] >= 0).nonzero().squeeze(1) + start  # [m]
        rank = sorted(drafted.tolist(), key=lambda i: (-float(reach[i]), int(f.depths[i])))[:nodes]
        total += float(on_path[rank].sum())
        start = end
    return total / len(examples)


class ScorerGuardError(ValueError):
    """The trained scorer selects worse trees than the plain marginals on held-out prompts."""


def check_guard(line: dict, marginal: dict, nodes: int, log_path: Path) -> None:
    """Raise ScorerGuardError when the trained scorer's held-out log `line` accepts fewer tokens
    per round at `nodes` nodes than the untrained (marginal) scorer's line `marginal`."""
    key = f"eval_accepted_at_{nodes}"
    if key in line and line[key] < marginal[key]:
        raise ScorerGuardError(
            f"the trained scorer accepts {line[key]:.3f} tokens per round at {nodes} nodes on held-out prompts, the "
            f"plain marginals {marginal[key]:.3f}: not saved (log: {log_path}); record more or more varied prompts "
            "(--prompts), train fewer --epochs, or decode with --scorer none")


@dataclass(frozen=True)
class TrainScorerResult:
    scorer_dir: Path  # EdgeScorer.load(scorer_dir)
    log_path: Path  # one JSON line per epoch
    train_pools: int  # pools trained on
    eval_pools: int  # held-out pools
    last: dict  # the last log line


def split_prompts(n: int, n_held_out: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) prompt indices; the held-out ones chosen by seed."""
    if n_held_out >= n:
        raise ValueError(f"eval_prompts={n_held_out} holds out all {n} prompts: nothing to train on")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[n_held_out:]), sorted(order[:n_held_out])


def train_scorer(
    cfg: TrainScorerConfig, *, prompts: Sequence[str | Sequence[int]] | None = None,
    target: Target | None = None, drafter: Drafter | None = None,
) -> TrainScorerResult:
    """Record traces (once; reused when present), train an EdgeScorer, save it to out/scorer.

    prompts/target/drafter: see `record_traces` (given prompts replace cfg.prompts/prompt_seed).
    The log is rewritten each run: it describes the scorer saved. Raises ScorerGuardError, saving
    nothing, when the scorer loses to the plain marginals on the held-out prompts (`check_guard`)."""
    from tqdm import tqdm

    n_prompts = cfg.prompts if prompts is None else len(prompts)
    if cfg.eval_prompts >= n_prompts:  # said now, not after recording the traces (minutes)
        raise ValueError(f"--eval-prompts {cfg.eval_prompts} holds out all {n_prompts} prompts: nothing to train "
                         "on; pass fewer --eval-prompts or more --prompts")
    traces = record_traces(cfg, prompts, target, drafter)
    train_idx, eval_idx = split_prompts(len(traces), cfg.eval_prompts, cfg.seed)
    train = [ex for i in train_idx for ex in traces[i].examples]
    held = [ex for i in eval_idx for ex in traces[i].examples]
    if not train:
        raise ValueError("the training prompts gave no pools (max_new_tokens too small?)")
    torch.manual_seed(cfg.seed)
    scorer = EdgeScorer(ScorerConfig(buckets=cfg.buckets, hidden=cfg.hidden))
    optimizer = torch.optim.AdamW(scorer.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    out = Path(cfg.out)
    log_path = out / LOG_FILE
    log_path.write_text("")
    line: dict = {}
    lines: list[dict] = []
    start = time.perf_counter()
    for epoch in tqdm(range(cfg.epochs + 1), disable=not cfg.progress, desc="train scorer", unit="epoch"):
        line = {"epoch": epoch, "train_pools": len(train), "eval_pools": len(held)}
        if epoch > 0:  # epoch 0: the untrained scorer, i.e. the plain marginals
            scorer.train()
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))
            totals = {"loss": 0.0, "kl": 0.0, "bce": 0.0}
            batches = [order[j : j + cfg.batch_pools].tolist() for j in range(0, len(train), cfg.batch_pools)]
            for batch in batches:
                step = train_step(scorer, optimizer, [train[i] for i in batch], cfg.bce_weight)
                for key in totals:
                    totals[key] += step[key] / len(batches)
            line.update({f"train_{k}": v for k, v in totals.items()})
        scorer.eval()
        if held:
            line.update({f"eval_{k}": v for k, v in evaluate(scorer, held, cfg.bce_weight).items()})
            line[f"eval_accepted_at_{cfg.guard_nodes}"] = accepted_at_size(scorer, held, cfg.guard_nodes)
        line["seconds"] = round(time.perf_counter() - start, 3)
        with open(log_path, "a") as f:
            f.write(json.dumps(line) + "\n")
        lines.append(line)
    check_guard(line, lines[0], cfg.guard_nodes, log_path)
    scorer_dir = out / SCORER_DIR
    scorer.save(scorer_dir)
    return TrainScorerResult(scorer_dir, log_path, len(train), len(held), line)

