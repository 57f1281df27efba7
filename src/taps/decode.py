"""The round loop (method.md section 1): draft -> select tree -> verify -> commit.

Plain autoregressive decoding is this same loop with the `ar` policy (a root-only tree and no
drafter call), so speed comparisons measure only what speculation changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from taps.copying import CopyPlanner
from taps.costmodel import LatencyProfile
from taps.drafters import Drafter
from taps.lookup import ngram_continuations
from taps.policies import CandidatePath, PolicyFn, get_policy, profile_or_default
from taps.target import Target
from taps.tree import Tree
from taps.verify import SamplingConfig, verify

STAGES = ("draft", "select", "verify", "commit")


@dataclass(frozen=True)
class DecodeConfig:
    method: str = "chain"  # tree policy name (see taps.policies.POLICIES); "ar" = no draft
    budget: int = 16  # most drafted nodes (root excluded) one verification may hold
    max_new_tokens: int = 128  # stop after this many generated tokens
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # temperature, top-k, top-p
    stop_ids: tuple[int, ...] | None = None  # stop after any of these; None = the model's EOS ids
    seed: int = 0  # seeds the target's draws at temperature > 0
    lookup: bool = True  # policies that take extra candidates (taps): add n-gram continuations of the context
    rollout_steps: int = 64  # rollout methods: most greedy drafter steps after the block pass
    rollout_reach: float = 0.2  # rollout methods: stop when the path's drafter probability falls under this

    def __post_init__(self):
        get_policy(self.method)  # unknown names fail here, with the list of known ones
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1 drafted node, got {self.budget}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_rollout(self.rollout_steps, self.rollout_reach)


def check_rollout(steps: int, reach: float) -> None:
    if steps < 0 or not 0 <= reach <= 1:
        raise ValueError(f"need rollout_steps >= 0 and 0 <= rollout_reach <= 1, got {steps}, {reach}")


@dataclass
class Stats:
    accepted_per_round: list[int] = field(default_factory=list)  # drafted tokens accepted each round
    tree_sizes: list[int] = field(default_factory=list)  # drafted nodes verified each round
    stage_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    prefill_seconds: float = 0.0  # the prompt's forward, before the first round
    seconds: float = 0.0  # wall time of the whole call, prefill included
    new_tokens: int = 0
    copy_rounds: int = 0  # rounds that verified an n-gram continuation without calling the drafter

    @property
    def rounds(self) -> int:
        return len(self.accepted_per_round)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round = mean(accepted + 1)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_tree_size(self) -> float:
        return sum(self.tree_sizes) / len(self.tree_sizes) if self.tree_sizes else 0.0

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "tau": self.tau,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "accepted_per_round": self.accepted_per_round,
            "tree_sizes": self.tree_sizes,
            "mean_tree_size": self.mean_tree_size,
            "prefill_seconds": self.prefill_seconds,
            "stage_seconds": self.stage_seconds,
            "copy_rounds": self.copy_rounds,
        }


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only, stop token included when one ended the run
    text: str  # token_ids decoded (empty when the target has no tokenizer)
    method: str
    stats: Stats

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "method": self.method, "stats": self.stats.to_dict()}


def default_stop_ids(target: Target) -> tuple[int, ...]:
    eos = target.model.generation_config.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def check_prompt(target: Target, prompt_ids: Sequence[int]) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if len(prompt_ids) >= target.max_positions:
        raise ValueError(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {target.max_positions}: "
            "nothing can be generated"
        )
    bad = [t for t in prompt_ids if not 0 <= t < target.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the target's vocabulary of {target.vocab_size}")


def check_drafter(target: Target, drafter: Drafter) -> None:
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"the drafter proposes over {drafter.vocab_size} tokens but the target's vocabulary has "
            f"{target.vocab_size}: it was built for another target"
        )
    missing = set(drafter.feature_layers) - set(target.feature_layers)
    if missing:
        raise ValueError(f"the drafter reads target layers {sorted(missing)} that the target does not expose")


def generate(
    target: Target,
    prompt_ids: Sequence[int],
    cfg: DecodeConfig,
    drafter: Drafter | None = None,
    select: PolicyFn | None = None,
    profile: LatencyProfile | None = None,
) -> GenerationResult:
    """Decode `prompt_ids` with `cfg.method`; `select` is that policy configured with options
    (`POLICIES[name].configure(profile=..., scorer=...)`), default: its plain `select`.
    `profile` is the latency profile a method with copy rounds decides them by (taps.copying)."""
    policy = get_policy(cfg.method)
    select = select or policy.select
    lookup = cfg.lookup and policy.accepts_paths
    copier = CopyPlanner(profile_or_default(cfg.method, profile)) if cfg.lookup and policy.copy_rounds else None
    check_prompt(target, prompt_ids)
    if policy.needs_draft:
        if drafter is None:
            raise ValueError(f"method {cfg.method!r} needs a drafter")
        check_drafter(target, drafter)
        if policy.rollout and not callable(getattr(drafter, "rollout", None)):
            raise ValueError(f"method {cfg.method!r} deepens drafts with the drafter's own greedy steps, which only a "
                             "grown drafter can take (taps.grown); use it with one, or use a method without rollout")
    stop = set(default_stop_ids(target) if cfg.stop_ids is None else cfg.stop_ids)
    gen = torch.Generator().manual_seed(cfg.seed)
    stats = Stats()
    clock = time.perf_counter
    t_start = clock()

    ids = list(prompt_ids)
    pending = target.prefill(ids[:-1])  # features of committed tokens the drafter has not been given
    if policy.needs_draft:
        drafter.start(ids)
    stats.prefill_seconds = clock() - t_start
    new: list[int] = []
    done = False
    while not done:
        # tokens this round may still commit: the max_new_tokens and context limits, exactly
        remaining = min(cfg.max_new_tokens - len(new), target.max_positions - len(ids))
        if remaining <= 0:
            break
        t0 = clock()
        tree, drafted, t_draft = Tree.root_only(ids[-1]), False, 0.0
        path = copier.continuation(ids) if copier is not None else None
        copy = copier.copy_tree(ids[-1], path, min(cfg.budget, remaining - 1), len(ids) - 1) if copier is not None else None
        if copy is not None:
            tree = copy
        elif policy.needs_draft and remaining > 1:
            t = clock()
            marginals = drafter.draft(ids, pending)  # [L, vocab]
            if policy.rollout:
                # a path longer than budget - 1 tokens could not be verified whole: no step past it
                steps = min(cfg.rollout_steps, remaining - 2, cfg.budget - 1)
                marginals = drafter.rollout(marginals, steps, cfg.rollout_reach)
            marginals = marginals[: remaining - 1]  # [depth, vocab]
            t_draft, pending, drafted = clock() - t, None, True
            extra = {"extra_paths": [CandidatePath(p) for p in ngram_continuations(ids)]} if lookup else {}
            if policy.reads_context:
                extra["context"] = len(ids) - 1  # cached tokens before the root
                if policy.rollout:  # the rollout's steps are this round's own drafting cost
                    extra["draft_seconds"] = t_draft
            tree = select(marginals, ids[-1], cfg.budget, **extra)
        t2 = clock()
        out = target.forward_tree(tree)
        verdict = verify(tree, out.logits, cfg.sampling, gen)
        t3 = clock()
        keep = [0] + verdict.accepted
        target.commit(keep, tree.n_nodes)
        if policy.needs_draft and out.features is not None:  # a copy round's features wait for the next draft
            pending = out.features[keep] if pending is None else torch.cat([pending, out.features[keep]])
        emitted = tree.tokens[verdict.accepted].tolist() + [verdict.bonus]
        committed = 0
        for tok in emitted:
            ids.append(tok)
            new.append(tok)
            committed += 1
            if tok in stop:
                done = True
                break
        if copier is not None:
            copier.observe(path, emitted[:committed], tree.n_draft if drafted else None, t_draft)
        stats.copy_rounds += copy is not None
        t4 = clock()
        for stage, seconds in zip(STAGES, (t_draft, t2 - t0 - t_draft, t3 - t2, t4 - t3)):
            stats.stage_seconds[stage] += seconds
        stats.accepted_per_round.append(committed - 1)  # a stop token may cut the path short
        stats.tree_sizes.append(tree.n_draft)
    stats.seconds = clock() - t_start
    stats.new_tokens = len(new)
    text = target.tokenizer.decode(new, skip_special_tokens=True) if target.tokenizer is not None else ""
    return GenerationResult(new, text, cfg.method, stats)
