"""The methods a user picks by `--method`: a proposer + a tree policy + options (docs/method.md).

A method is written `NAME[+OPTION...]`, e.g. `taps`, `taps+copy`, `chain+rollout`, `taps+pause`. NAME is plain
decoding (`ar`) or one of the tree policies (taps.policies); the options change how rounds are
proposed or how the policy is configured. The paper's ablations are options too
(`taps+no-scorer`, `taps+fixed`, `taps+no-lookup`), so a benchmark can run them side by side
without them crowding the list of methods.

`Method.build(...)` turns a method and the loaded parts (drafter, latency profile, scorer) into
the round's proposer and selector: the only place that knows which option needs what.
"""

from __future__ import annotations

from dataclasses import dataclass

from taps.copying import CopyPlanner
from taps.costmodel import LatencyProfile
from taps.drafters import Drafter
from taps.gate import Gate
from taps.policies import POLICIES, Selector, configure_policy, profile_or_default
from taps.rounds import CopyProposer, DraftProposer, NoProposer, PausingProposer, Proposer, Rollout
from taps.scorer import Scorer

NAMES = {  # name -> (one line for --help, default budget)
    "ar": ("plain autoregressive decoding: one token per target forward, no drafter", None),
    "chain": ("DFlash: the drafter's argmax token at each depth, one path", 16),
    "ddtree": ("DDTree: the `budget` most likely paths by product of the drafter's marginals", 8),
    "cost-aware": ("CaDDTree: DDTree's order cut at the size with the most modelled tokens/s", 32),
    "taps": ("TAPS: target-aware scored candidate pool (drafter + n-gram lookup), cut at the size with the "
             "most modelled tokens/s (recommended)", 32),
}
OPTIONS = {  # option -> (policies it applies to, one line for --help)
    "copy": (("chain", "ddtree", "cost-aware", "taps"),
             "copy rounds: verify an n-gram continuation of the context alone, without drafting, when that is "
             "modelled faster (summaries, code edits, second turns)"),
    "pause": (("chain", "ddtree", "cost-aware", "taps"),
              "pause drafting while plain rounds are measured faster than drafted ones, probing again later "
              "(quantized targets, text the drafter does not know)"),
    "rollout": (("chain", "ddtree", "cost-aware", "taps"),
                "deepen each draft along the drafter's own greedy path (grown drafters only)"),
    "no-lookup": (("taps",), "ablation: no n-gram lookup candidates in the pool"),
    "no-scorer": (("taps",), "ablation: plain marginals instead of the learned edge scorer"),
    "fixed": (("taps",), "ablation: no throughput cut, the tree fills the budget"),
}


@dataclass(frozen=True)
class Method:
    name: str  # NAME from NAMES
    options: frozenset[str] = frozenset()  # from OPTIONS

    @staticmethod
    def parse(spec: str) -> Method:
        name, *options = spec.strip().split("+")
        if name not in NAMES:
            raise ValueError(f"unknown method {name!r}; choose one of {', '.join(NAMES)} (see `taps methods`)")
        for option in options:
            if option not in OPTIONS:
                raise ValueError(f"unknown method option {option!r} in {spec!r}; options: {', '.join(OPTIONS)}")
            if name not in OPTIONS[option][0]:
                raise ValueError(f"option +{option} does not apply to {name}; it applies to "
                                 f"{', '.join(OPTIONS[option][0])}")
        if len(set(options)) != len(options):
            raise ValueError(f"an option is repeated in {spec!r}")
        return Method(name, frozenset(options))

    def __str__(self) -> str:
        """The canonical spelling: options in OPTIONS order (records and reports use it)."""
        return "+".join([self.name, *(o for o in OPTIONS if o in self.options)])

    @property
    def needs_draft(self) -> bool:
        return self.name != "ar"

    @property
    def default_budget(self) -> int | None:
        return NAMES[self.name][1]

    def build(
        self,
        drafter: Drafter | None,
        profile: LatencyProfile | None = None,
        scorer: Scorer | None = None,
        rollout: Rollout = Rollout(),
    ) -> tuple[Proposer, Selector | None]:
        """The round's proposer and selector (None for ar) from the loaded parts. `profile` is the
        latency profile cost-aware, taps and copy rounds decide by (None: the stated default, warned);
        `scorer` taps' edge scorer (None: plain marginals)."""
        if not self.needs_draft:
            return NoProposer(), None
        if drafter is None:
            raise ValueError(f"method {self} needs a drafter")
        opts = self.options
        # taps' learned scorer corrects block marginals (rows blind to earlier positions); rollout rows
        # are the base model's own conditionals, already calibrated: on HumanEval replays it cut their tau
        use_scorer = "no-scorer" not in opts and "rollout" not in opts
        fixed = "fixed" in opts
        select = configure_policy(self.name, scorer=scorer if use_scorer else None,
                                  profile=None if fixed else profile,
                                  **({"throughput": False} if fixed else {}))
        proposer: Proposer = DraftProposer(drafter, lookup=self.name == "taps" and "no-lookup" not in opts,
                                           rollout=rollout if "rollout" in opts else None)
        if "copy" in opts:
            proposer = CopyProposer(proposer, CopyPlanner(profile_or_default(str(self), profile)))
        if "pause" in opts:
            proposer = PausingProposer(proposer, Gate())
        return proposer, select


def every_method() -> list[str]:
    """Every method name with no option and with each option that applies to it (tests run them all)."""
    out = list(NAMES)
    for option, (applies, _) in OPTIONS.items():
        out += [f"{name}+{option}" for name in applies]
    return out


def method_help() -> str:
    """Every method and option, one line each, for --help and `taps methods`."""
    lines = [f"{name}: {doc}" for name, (doc, _) in NAMES.items()]
    lines += [f"+{option}: {doc} ({', '.join(applies)})" for option, (applies, doc) in OPTIONS.items()]
    return "\n".join(lines)


assert set(NAMES) - {"ar"} == set(POLICIES), "every tree policy is a method name"
