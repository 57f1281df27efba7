"""Recording the TAPS edge scorer's training traces (docs/method.md 3.4e): decode with the
drafter, verify each round's whole candidate pool, label every pool edge exactly.

See taps.train.scorer for the whole recipe. Recording is the round loop itself
(taps.decode.rounds) with a selector that verifies the whole pool and an `on_round` hook that
labels it. One safetensors file per prompt under `out/traces/`, so recording resumes per prompt
and a larger prompt count only adds files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from taps.scorer import CandidatePool, EdgeFeatures, ScorerExample, ScorerLabels, depth_entropy
from taps.train.settings import check_pinned
from taps.verify import SamplingConfig, Verdict

if TYPE_CHECKING:
    from taps.decode import Round
    from taps.drafters import Drafter
    from taps.policies import Proposal
    from taps.target import Target
    from taps.train.scorer import TrainScorerConfig
    from taps.tree import Tree

TRACE_DIR = "traces"  # one safetensors file per prompt, and meta.json (the recording settings)
TRACE_FORMAT = "taps-scorer-trace"
TRACE_VERSION = 1
FEATURE_FIELDS = ("parents", "parent_tokens", "tokens", "depths", "sources", "logq", "entropy", "child_entropy")
LABEL_FIELDS = ("target_prob", "labelled", "accepted", "accepted_known")
# fields that shape the recorded traces: a rerun with other values must not reuse them


@dataclass
class Trace:
    """One prompt's recorded decoding: a ScorerExample per round that drafted a pool."""

    prompt_ids: list[int]
    token_ids: list[int]  # generated ids (stop token included when one ended the run)
    examples: list[ScorerExample]  # one per pool round
    round_starts: list[int]  # per example: committed ids (prompt + generated) when its round began; root = the last
    accepted_per_round: list[int]  # drafted tokens accepted each round (all rounds, pool or not)


def pool_labels(pool: CandidatePool, logits: torch.Tensor, verdict: Verdict, sampling: SamplingConfig) -> ScorerLabels:
    """Exact labels of every pool edge from one verification of the whole pool.

    logits [n, vocab]: row u = the target's next-token logits after pool node u. Child c of u gets
    p_u[token(c)] (1[argmax_u == token(c)] at temperature 0, argmax as `verify` takes it). Every
    node is labelled (its distribution is known) and every node's "on the accepted path" is known.
    """
    n = pool.n
    child = torch.arange(1, n)
    parent = pool.parents[1:]
    target_prob = torch.ones(n)  # the root has no parent edge: never read
    if n > 1:
        rows = parent.unique()  # only nodes with children need their distribution
        row_of = torch.full((n,), -1, dtype=torch.long).index_copy(0, rows, torch.arange(rows.shape[0]))
        if sampling.greedy:
            best = logits[rows].argmax(dim=-1)  # [rows]
            target_prob[child] = (best[row_of[parent]] == pool.tokens[child]).float()
        else:
            probs = sampling.probs(logits[rows])  # [rows, vocab]
            target_prob[child] = probs[row_of[parent], pool.tokens[child]]
    accepted = torch.zeros(n)
    accepted[0] = 1.0
    accepted[torch.tensor(verdict.accepted, dtype=torch.long)] = 1.0
    every = torch.ones(n, dtype=torch.bool)
    return ScorerLabels(target_prob=target_prob, labelled=every, accepted=accepted, accepted_known=every.clone())


class _PoolRecorder:
    """A selector that verifies each round's whole candidate pool, and the `on_round` hook that
    labels it: the round loop's seam, so recording is decoding (taps.decode.rounds) itself."""

    def __init__(self, cfg: TrainScorerConfig, trace: Trace):
        self.cfg, self.trace = cfg, trace
        self.pool: CandidatePool | None = None

    def select(self, proposal: Proposal, budget: int) -> Tree:
        from taps.policies import build_pool
        from taps.tree import Tree

        self.pool = build_pool(proposal.marginals, proposal.root, self.cfg.k, self.cfg.pool_size, proposal.paths)
        return Tree(self.pool.tokens, self.pool.parents, self.pool.depths)  # the whole pool is the round's tree

    def on_round(self, r: Round) -> None:
        if r.proposal is not None:
            pool, entropy = self.pool, depth_entropy(r.proposal.marginals)
            labels = pool_labels(pool, r.logits, r.verdict, self.cfg.sampling)
            self.trace.examples.append(ScorerExample(EdgeFeatures.from_pool(pool, entropy), labels))
            self.trace.round_starts.append(r.proposal.context + 1)
        self.trace.token_ids += r.committed
        self.trace.accepted_per_round.append(len(r.committed) - 1)


def record_trace(
    target: Target, drafter: Drafter, prompt_ids: Sequence[int], cfg: TrainScorerConfig,
    generator_seed: int = 0, stop_ids: Sequence[int] | None = None,
) -> Trace:
    """Decode `prompt_ids` verifying each round's whole candidate pool; label every pool edge.

    The round loop of `taps.decode` with the drafter's proposals (lookup candidates as in
    decoding) and one difference: the tree verified is the whole pool, not a policy's pick from
    it, so that the target's distribution is known at every pool node. The output is therefore
    still exact (any prefix-closed tree is), only with other round boundaries than the taps
    policy would have. `stop_ids` None = the model's EOS ids.
    """
    from taps.decode import DecodeConfig, Stats, check_drafter, rounds
    from taps.rounds import DraftProposer

    check_drafter(target, drafter)
    trace = Trace(list(prompt_ids), [], [], [], [])
    recorder = _PoolRecorder(cfg, trace)
    decode = DecodeConfig(method="taps", budget=cfg.pool_size, max_new_tokens=cfg.max_new_tokens,
                          sampling=cfg.sampling, stop_ids=None if stop_ids is None else tuple(stop_ids),
                          seed=generator_seed)
    for r in rounds(target, prompt_ids, decode, DraftProposer(drafter, lookup=cfg.lookup), recorder.select, Stats()):
        recorder.on_round(r)
    return trace


def _prompt_key(prompt: str | Sequence[int]) -> str:
    text = prompt if isinstance(prompt, str) else json.dumps([int(t) for t in prompt])
    return hashlib.sha256(text.encode()).hexdigest()


def save_trace(trace: Trace, path: str | os.PathLike, prompt_key: str = "") -> None:
    """One safetensors file (atomic: written aside, then renamed); the pools are concatenated."""
    path = Path(path)
    ex = trace.examples
    tensors = {"sizes": torch.tensor([e.features.tokens.shape[0] for e in ex], dtype=torch.long)}
    for name in FEATURE_FIELDS:
        tensors["f." + name] = torch.cat([getattr(e.features, name) for e in ex]) if ex else torch.zeros(0)
    for name in LABEL_FIELDS:
        tensors["l." + name] = torch.cat([getattr(e.labels, name) for e in ex]) if ex else torch.zeros(0)
    for name in ("prompt_ids", "token_ids", "round_starts", "accepted_per_round"):
        tensors[name] = torch.tensor(getattr(trace, name), dtype=torch.long)
    meta = {"format": TRACE_FORMAT, "version": str(TRACE_VERSION), "prompt_key": prompt_key}
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def trace_prompt_key(path: str | os.PathLike) -> str:
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != TRACE_FORMAT or meta.get("version") != str(TRACE_VERSION):
        raise ValueError(f"{path} is not a {TRACE_FORMAT} v{TRACE_VERSION} file")
    return meta.get("prompt_key", "")


def load_trace(path: str | os.PathLike) -> Trace:
    trace_prompt_key(path)  # checks the format
    with safe_open(str(path), "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    sizes = t["sizes"].tolist()
    examples = []
    for parts in zip(*(t["f." + n].split(sizes) for n in FEATURE_FIELDS),
                     *(t["l." + n].split(sizes) for n in LABEL_FIELDS)):
        features = EdgeFeatures(*parts[: len(FEATURE_FIELDS)])
        examples.append(ScorerExample(features, ScorerLabels(*parts[len(FEATURE_FIELDS):])))
    return Trace(t["prompt_ids"].tolist(), t["token_ids"].tolist(), examples, t["round_starts"].tolist(),
                 t["accepted_per_round"].tolist())


def _check_settings(folder: Path, settings: dict) -> None:
    meta = folder / "meta.json"
    check_pinned(meta, settings, f"{folder} holds traces recorded", "use them or choose another --out")
    if not meta.exists():
        folder.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(settings, indent=1) + "\n")


def scorer_prompts(cfg: TrainScorerConfig) -> list[str]:
    """The training prompts a scorer run records: cfg.prompts of cfg.prompt_mix's sources (never
    evaluation prompts: checked)."""
    from taps.train.overlap import check_no_eval_overlap
    from taps.train.prompts import parse_mix, training_prompts

    prompts = training_prompts(cfg.prompts, cfg.prompt_seed, parse_mix(cfg.prompt_mix) if cfg.prompt_mix else None)
    check_no_eval_overlap(prompts)
    return prompts


def record_traces(
    cfg: TrainScorerConfig, prompts: Sequence[str | Sequence[int]] | None = None,
    target: Target | None = None, drafter: Drafter | None = None,
) -> list[Trace]:
    """The traces of every prompt, recorded into out/traces/ where missing, else read back.

    prompts: texts (encoded with the target's chat template unless chat_template=False) or token
    ids; None = `scorer_prompts(cfg)`. target/drafter: None = loaded
    from cfg.target / cfg.drafter (only if some trace is missing)."""
    from tqdm import tqdm

    if prompts is None:
        prompts = scorer_prompts(cfg)
    folder = Path(cfg.out) / TRACE_DIR
    _check_settings(folder, cfg.record_settings())
    paths = [folder / f"prompt-{i:05d}.safetensors" for i in range(len(prompts))]
    keys = [_prompt_key(p) for p in prompts]
    for i, (path, key) in enumerate(zip(paths, keys)):
        if path.exists() and trace_prompt_key(path) != key:
            raise ValueError(f"{path} holds the trace of another prompt {i}; choose another --out")
    missing = [i for i, path in enumerate(paths) if not path.exists()]
    if missing:
        if target is None:  # the composition root loads both
            from taps.engine import load

            spec = load(cfg.target, cfg.drafter, method="chain", dtype=cfg.dtype, block_len=cfg.block_len,
                        scorer=False)
            target, drafter = spec.target, spec.drafter
        elif drafter is None:
            from taps.drafters import load_drafter

            drafter = load_drafter(cfg.drafter, target, block_len=cfg.block_len)
        for i in tqdm(missing, disable=not cfg.progress, desc="record traces", unit="prompt"):
            p = prompts[i]
            ids = target.encode(p, chat=cfg.chat_template) if isinstance(p, str) else [int(t) for t in p]
            save_trace(record_trace(target, drafter, ids, cfg, cfg.seed * 1_000_003 + i), paths[i], keys[i])
    return [load_trace(path) for path in paths]


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


