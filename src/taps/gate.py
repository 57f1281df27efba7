"""Pausing speculation while plain rounds commit more tokens per second (`+pause`).

An extension beyond docs/method.md. Speculation pays only while a drafted round's tokens per
second beat plain decoding's: tau tokens in t_draft + t_verify(n) against 1 token in
t_verify(0). Where the target's token is cheap (an int8 or int4 target, docs/method.md section
12) and the drafter does not know the text (chat for a code drafter), tau falls under
(t_draft + t_verify(n)) / t_verify(0) and every drafted round loses time: measured, chat on a
w4a8 1.5B ran at 0.94x of its own plain decoding (results/quantized-targets/xeon-amx). The
size cut (taps.costmodel) cannot help there: by the time it chooses a size, the draft is paid.

`Gate` decides before each round whether to draft, from the rounds of this generation:

- two measured rates: drafted rounds' committed tokens over their seconds, and plain rounds'
  tokens over theirs. Each is a ratio of sums in which a round weighs `decay` to the power of
  its age in rounds (of either kind): the rate follows the text, and after a pause the probe's
  own round outweighs drafted rounds from long before it. A round's seconds run from its
  proposal to its commit (draft, tree, verification, commit), the same span for both kinds;
- the first `warmup` rounds draft (they carry one-off costs and say what drafting yields here),
  the next is plain: one measured plain round per generation, whatever the profile says, so the
  comparison never rests on a profile of another machine or model;
- it pauses when the plain rate beats the drafted one by more than `margin`, and resumes when
  the drafted rate is at least the plain one (the gap between the two keeps one noisy round
  from flipping it back and forth);
- while paused, a probe drafts after `wait` plain rounds, so the drafted rate learns when the
  text turns predictable again (a code block in a chat answer); a probe that does not resume
  doubles the wait, up to `max_wait`; resuming resets it.

Its cost where speculation wins: the one plain round (a token where drafting would have
committed tau in about the same time), about 1% of a 128-token answer at tau 3; never more than
one plain round per generation unless the rates say pause. A probe's draft also catches the
drafter up on the tokens committed while paused, so probes read slightly slow: the gate errs
toward staying paused, never toward a slower drafted round.

Measured (results/pause, a 2-core Zen 5 EPYC, the 1.5B, 10 + 10 prompts, T=0): with int4 weights
on MT-Bench, where taps:32 ran 0.86x of plain decoding, taps+pause:32 ran 0.92x (1.083x taps:32,
95% interval 1.030-1.162; 83% of its rounds plain); on HumanEval, and with w8a8 weights on both
sets, level with the method without it. What it still pays where drafting loses: the warm-up
rounds and the probes, each a losing round. With `+copy`, a paused round is plain, not a copy.

Lossless: a paused round is the root alone, verified like any tree; the gate only chooses how
many tokens a round may commit, never which (docs/method.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Throughput:
    """Tokens per second of one kind of round: sums in which a round weighs `decay` ** its age."""

    tokens: float = 0.0
    seconds: float = 0.0
    last: int = 0  # the round number of the newest round added
    rounds: int = 0  # rounds added, undecayed

    def add(self, tokens: int, seconds: float, now: int, decay: float) -> None:
        age = decay ** (now - self.last)  # underflows to 0 after thousands of rounds: only the newest counts
        self.tokens, self.seconds = self.tokens * age + tokens, self.seconds * age + seconds
        self.last, self.rounds = now, self.rounds + 1

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class Gate:
    """Per generation: whether the next round drafts, learnt from the rounds so far."""

    decay: float = 0.8  # weight of a round per round of age
    margin: float = 0.05  # pause when plain rounds are faster than drafted ones by more than this share
    warmup: int = 3  # drafted rounds before the one measured plain round
    first_wait: int = 4  # plain rounds before the first probe of a pause
    max_wait: int = 32  # the longest wait between probes
    drafted: Throughput = field(default_factory=Throughput)
    plain: Throughput = field(default_factory=Throughput)
    rounds: int = 0  # rounds observed
    paused: bool = False
    wait: int = 0  # plain rounds between probes in this pause
    waited: int = 0  # plain rounds since the pause began or its last probe

    def __post_init__(self):
        if not (0.0 <= self.decay < 1.0 and self.margin >= 0 and self.warmup >= 1
                and 1 <= self.first_wait <= self.max_wait):
            raise ValueError("need 0 <= decay < 1, margin >= 0, warmup >= 1 and 1 <= first_wait <= max_wait, got "
                             f"{self.decay}, {self.margin}, {self.warmup}, {self.first_wait}, {self.max_wait}")

    def drafts(self) -> bool:
        """Whether the next round drafts (a probe, when a pause's wait is over)."""
        if self.drafted.rounds < self.warmup:
            return True
        if self.plain.rounds == 0:
            return False  # the one measured plain round
        return not self.paused or self.waited >= self.wait

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """After a round: whether it drafted, the tokens it committed, its seconds."""
        self.rounds += 1
        (self.drafted if drafted else self.plain).add(tokens, seconds, self.rounds, self.decay)
        self.waited += not drafted
        if self.plain.rounds == 0 or self.drafted.rounds < self.warmup:
            return
        if not self.paused and self.plain.per_second > self.drafted.per_second * (1.0 + self.margin):
            self.paused, self.wait, self.waited = True, self.first_wait, 0
        elif self.paused and drafted:  # a probe
            if self.drafted.per_second >= self.plain.per_second:
                self.paused = False
            else:
                self.wait, self.waited = min(2 * self.wait, self.max_wait), 0
