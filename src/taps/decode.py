"""The round loop (docs/method.md section 1): propose -> select tree -> verify -> commit.

Plain autoregressive decoding is this same loop with no proposal (a root-only tree and no
drafter call), so speed comparisons measure only what speculation changes. `rounds` is the one
loop: a generator of `Round`s, so generation, streaming (taps.engine), scorer traces
(taps.train.scorer) and replays are all callers of it, through `generate`'s `on_round` seam or by
iterating it themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from taps.drafters import Drafter
from taps.methods import Method
from taps.policies import Proposal, Selector
from taps.rounds import Proposer, Rollout
from taps.target import Target
from taps.tree import Tree
from taps.verify import SamplingConfig, Verdict, verify

STAGES = ("draft", "select", "verify", "commit")
FINISH_REASONS = ("stop", "length", "context")  # a stop token; max_new_tokens; the context limit


@dataclass(frozen=True)
class DecodeConfig:
    method: str = "chain"  # NAME[+OPTION...], see taps.methods
    budget: int = 16  # most drafted nodes (root excluded) one verification may hold
    max_new_tokens: int = 128  # stop after this many generated tokens
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # temperature, top-k, top-p
    stop_ids: tuple[int, ...] | None = None  # stop after any of these; None = the model's EOS ids
    seed: int = 0  # seeds the target's draws at temperature > 0
    rollout: Rollout = field(default_factory=Rollout)  # methods with +rollout: how far drafts are deepened

    def __post_init__(self):
        object.__setattr__(self, "method", str(Method.parse(self.method)))  # unknown names fail here, listed
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget must be an integer >= 1 drafted node, got {self.budget}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")


@dataclass
class Stats:
    accepted_per_round: list[int] = field(default_factory=list)  # drafted tokens accepted each round
    tree_sizes: list[int] = field(default_factory=list)  # drafted nodes verified each round
    stage_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    prefill_seconds: float = 0.0  # the prompt's forward, before the first round
    seconds: float = 0.0  # wall time of the whole call, prefill included
    new_tokens: int = 0
    copy_rounds: int = 0  # rounds that verified an n-gram continuation without calling the drafter
    finish_reason: str = "length"  # why decoding ended, one of FINISH_REASONS

    def add_round(self, committed: Sequence[int], tree: Tree, proposal: Proposal | None,
                  stage_seconds: Sequence[float]) -> None:
        self.new_tokens += len(committed)
        self.accepted_per_round.append(len(committed) - 1)  # a stop token may cut the path short
        self.tree_sizes.append(tree.n_draft)
        self.copy_rounds += proposal is not None and proposal.fixed is not None
        if proposal is None or proposal.fixed is not None:  # no drafter call: proposing was choosing
            t_propose, t_select, *rest = stage_seconds
            stage_seconds = (0.0, t_propose + t_select, *rest)
        for stage, seconds in zip(STAGES, stage_seconds):
            self.stage_seconds[stage] += seconds

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
            "finish_reason": self.finish_reason,
        }


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only, stop token included when one ended the run
    text: str  # token_ids decoded (empty when the target has no tokenizer)
    method: str
    stats: Stats
    finish_reason: str = "length"  # one of FINISH_REASONS
    prompt_tokens: int = 0

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "method": self.method,
                "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class Round:
    """One round, as the loop hands it to its callers."""

    proposal: Proposal | None  # what the proposer offered (None: the root alone)
    tree: Tree  # what was verified
    logits: torch.Tensor  # [n_nodes, vocab] the target's logits at every tree node
    verdict: Verdict  # the accepted path and the bonus token
    committed: list[int]  # tokens this round added to the output (accepted + bonus, cut at a stop token)
    context: int  # cached tokens before the root when the round began
    seconds: tuple[float, float, float, float]  # this round's time in each of STAGES (propose, select, verify, commit)


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


def rounds(
    target: Target, prompt_ids: Sequence[int], cfg: DecodeConfig, proposer: Proposer, select: Selector | None,
    stats: Stats, reuse_prefix: bool = False,
) -> Iterator[Round]:
    """Decode `prompt_ids`, one `Round` per target forward; `stats` is filled as rounds go, its
    `finish_reason` set when the loop ends. Closing the generator stops at the round boundary,
    leaving the target's cache consistent. `reuse_prefix`: keep what the target's cache already
    holds of the prompt (Target.prefill)."""
    check_prompt(target, prompt_ids)
    stop = set(default_stop_ids(target) if cfg.stop_ids is None else cfg.stop_ids)
    gen = torch.Generator(device=target.device).manual_seed(cfg.seed)
    clock = time.perf_counter
    t_start = clock()
    ids = list(prompt_ids)
    features = target.prefill(ids[:-1], reuse_prefix)  # 1. prefill all but the root, fed by each round
    proposer.start(ids, features, target.reused)  # what the target kept, the drafter may keep
    stats.prefill_seconds = clock() - t_start
    while True:
        # 2. what this round may still commit: the max_new_tokens and context limits, exactly
        remaining = min(cfg.max_new_tokens - stats.new_tokens, target.max_positions - len(ids))
        if remaining <= 0:
            stats.finish_reason = "length" if stats.new_tokens >= cfg.max_new_tokens else "context"
            return
        context = len(ids) - 1  # cached tokens before the root
        t0 = clock()
        proposal = proposer.propose(ids, remaining - 1, cfg.budget)  # 3. propose
        t1 = clock()
        if proposal is None:  # 4. select
            tree = Tree.root_only(ids[-1])
        else:
            tree = proposal.fixed if proposal.fixed is not None else select(proposal, cfg.budget)
        t2 = clock()
        out = target.forward_tree(tree)  # 5. verify: one forward, the target's own draws
        verdict = verify(tree, out.logits, cfg.sampling, gen)
        t3 = clock()
        keep = [0] + verdict.accepted  # 6. commit the accepted path and the bonus
        target.commit(keep, tree.n_nodes)
        emitted = tree.tokens[verdict.accepted].tolist() + [verdict.bonus]
        cut = next((i + 1 for i, tok in enumerate(emitted) if tok in stop), len(emitted))
        committed = emitted[:cut]
        ids += committed
        proposer.observe(tree, committed, None if out.features is None else out.features[keep])
        seconds = (t1 - t0, t2 - t1, t3 - t2, clock() - t3)
        stats.add_round(committed, tree, proposal, seconds)
        yield Round(proposal, tree, out.logits, verdict, committed, context, seconds)
        if committed[-1] in stop:
            stats.finish_reason = "stop"
            return


def generate(
    target: Target,
    prompt_ids: Sequence[int],
    cfg: DecodeConfig,
    drafter: Drafter | None = None,
    *,
    profile=None,
    scorer=None,
    select: Selector | None = None,
    on_round: Callable[[Round], None] | None = None,
    reuse_prefix: bool = False,
) -> GenerationResult:
    """Decode `prompt_ids` with `cfg.method` (taps.methods) and return the result. `profile` is the
    latency profile cost-aware, taps and copy rounds decide by, `scorer` taps' edge scorer;
    `select` replaces the method's tree selection (e.g. a recorder that verifies whole pools);
    `on_round` sees every round; `reuse_prefix`: keep what the target's cache holds of the prompt."""
    proposer, method_select = Method.parse(cfg.method).build(drafter, profile, scorer, cfg.rollout)
    if drafter is not None:
        check_drafter(target, drafter)
    stats = Stats()
    new: list[int] = []
    t_start = time.perf_counter()
    for r in rounds(target, prompt_ids, cfg, proposer, select or method_select, stats, reuse_prefix):
        new += r.committed
        if on_round is not None:
            on_round(r)
    stats.seconds = time.perf_counter() - t_start
    text = target.tokenizer.decode(new, skip_special_tokens=True) if target.tokenizer is not None else ""
    return GenerationResult(new, text, cfg.method, stats, stats.finish_reason, len(prompt_ids))
