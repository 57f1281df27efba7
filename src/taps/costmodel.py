"""Profiled latency of one round (docs/method.md 3.3 and section 5): t_verify(n) and t_draft.

`t_verify(n)` is the time of one target forward over a tree of n drafted nodes (the root is
not counted, so n = 0 is plain autoregressive decoding); `t_draft` is one drafter call. The
cost-aware policies pick the tree size n that maximises expected committed tokens per second,
`(1 + expected accepted(n)) / (t_draft + t_verify(n))`, so the curve must come from the machine
in use: `measure_profile` times a `Target`, `save`/`load` keep the result as JSON.

The measured points are fitted by isotonic regression (a bigger tree never verifies faster),
interpolated piecewise-linearly, held flat below the first point and extrapolated linearly past
the last one with the slope of the last rising segment.

Both costs grow with the context the round attends to (the drafter's and the target's attention
and caches), so a profile keeps one series per measured context length and `at_context` reads
the curve at the round's own context: a summary of a long article drafts and verifies slower
than the mean of short contexts says, and the best tree size and the copy-or-draft choice
(taps.copying) shift with it.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from taps.cpuload import OthersCpu, is_busy
from taps.files import read_json
from taps.linear import linear_backend, linear_in_use
from taps.quantize import scheme_of
from taps.records import portable_name
from taps.tree import Tree
from taps.weightonly import target_quant_of

if TYPE_CHECKING:  # only the interfaces are used: this module sits below the target adapter and the loop
    from taps.decode import Round
    from taps.target import Target

FORMAT = "taps-latency-profile"
VERSION = 1


@dataclass(frozen=True)
class ProfileInfo:
    """Where and how a profile was measured (or, for the default, where its numbers come from)."""

    target: str  # model name or folder whose forwards were timed
    dtype: str  # the target's dtype, e.g. "bfloat16"
    cpu: str  # processor model
    torch: str  # torch version
    threads: int  # torch intra-op threads during the measurement
    context_lengths: tuple[int, ...]  # cached tokens before the tree, one series per length
    repeats: int  # timed forwards per point (the median is kept)
    verify_by_context: tuple[tuple[float, ...], ...] = ()  # [context, size] median seconds; the curve is their mean
    draft_by_context: tuple[float, ...] = ()  # [context] median t_draft; draft_seconds is their mean (empty: not kept)
    note: str = ""  # free text: provenance, what was not measured
    linear: str = "torch"  # kernel of the float32 linear layers (taps.linear); it changes t_verify(n)
    drafter_quant: str = "none"  # precision of the timed drafter's linear layers (taps.quantize); it changes t_draft
    target_quant: str = "none"  # precision of the timed target's weights (taps.weightonly); it changes t_verify(n)
    others_cpu: float | None = None  # share of the CPU other processes used meanwhile (taps.cpuload; None: unmeasured)


@dataclass(frozen=True)
class LatencyProfile:
    sizes: tuple[int, ...]  # drafted nodes n of each measured tree (root excluded), strictly increasing
    verify_seconds: tuple[float, ...]  # measured t_verify at each size, before the monotone fit
    draft_seconds: float  # t_draft: one drafter call (0 when no drafter was measured)
    info: ProfileInfo  # provenance of the numbers

    def __post_init__(self):
        object.__setattr__(self, "sizes", tuple(int(n) for n in self.sizes))
        object.__setattr__(self, "verify_seconds", tuple(float(t) for t in self.verify_seconds))
        if not self.sizes or len(self.sizes) != len(self.verify_seconds):
            raise ValueError("a latency profile needs one verify time per size, and at least one size")
        if self.sizes[0] < 0 or any(a >= b for a, b in zip(self.sizes, self.sizes[1:])):
            raise ValueError(f"sizes must be >= 0 and strictly increasing, got {self.sizes}")
        if not all(np.isfinite(t) and t > 0 for t in self.verify_seconds):
            raise ValueError(f"verify times must be finite and > 0 seconds, got {self.verify_seconds}")
        if not (np.isfinite(self.draft_seconds) and self.draft_seconds >= 0):
            raise ValueError(f"draft_seconds must be finite and >= 0, got {self.draft_seconds}")

    @cached_property
    def fitted_seconds(self) -> tuple[float, ...]:
        """The measured verify times made non-decreasing in n (isotonic regression, pool adjacent violators)."""
        blocks: list[list[float]] = []  # [sum, count] of each pooled run of points
        for t in self.verify_seconds:
            blocks.append([t, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += count
        return tuple(total / count for total, count in blocks for _ in range(int(count)))

    @cached_property
    def _tail_slope(self) -> float:
        """Seconds per node past the last size: the slope of the last rising segment of the fit."""
        fit = self.fitted_seconds
        rising = [j for j in range(len(fit) - 1) if fit[j] < fit[-1]]
        if not rising:
            return 0.0
        j = rising[-1]
        return (fit[-1] - fit[j]) / (self.sizes[-1] - self.sizes[j])

    def verify_curve(self, n_max: int) -> torch.Tensor:
        """[n_max + 1] float64: t_verify(0), ..., t_verify(n_max) in seconds."""
        if n_max < 0:
            raise ValueError(f"n_max must be >= 0, got {n_max}")
        n = np.arange(n_max + 1, dtype=np.float64)
        t = np.interp(n, self.sizes, self.fitted_seconds)  # flat below the first size
        past = n > self.sizes[-1]
        t[past] = self.fitted_seconds[-1] + self._tail_slope * (n[past] - self.sizes[-1])
        return torch.from_numpy(t)

    def t_verify(self, n: int) -> float:
        """Seconds to verify a tree of n drafted nodes."""
        return float(self.verify_curve(n)[n])

    def best_size(self, gains: Sequence[float] | torch.Tensor, draft_seconds: float | None = None) -> int:
        """The n in 0..len(gains) maximising (1 + sum(gains[:n])) / (t_draft + t_verify(n)).

        gains[i] = the probability that the (i+1)-th node of a prefix-closed admission order is
        accepted, so the numerator is the expected tokens committed by the round (docs/method.md 3.3).
        Ties go to the smaller tree. `draft_seconds` replaces the profile's t_draft when the
        round's drafting cost is known: 0 for a round with no drafter call (a copy round,
        taps.copying), the measured block pass plus rollout steps for a rollout round (sunk by
        the time the tree is chosen, and the larger it is the more a deeper tree pays).
        """
        g = torch.as_tensor(gains, dtype=torch.float64)  # [B]
        committed = 1 + torch.cat([g.new_zeros(1), g.cumsum(0)])  # [B + 1]
        draft = self.draft_seconds if draft_seconds is None else draft_seconds
        seconds = draft + self.verify_curve(g.shape[0])  # [B + 1]
        return int((committed / seconds).argmax())

    def at_context(self, context: int | None) -> LatencyProfile:
        """This profile read at `context` cached tokens: every size's verify time (and t_draft,
        where kept per context) from a least-squares line over the measured context lengths
        (attention and cache work grow linearly with the context; the line also averages out a
        noisy point), its slope never negative, held flat below the shortest length (fixed costs
        dominate there). A profile with fewer than two context series, or context None (not
        known), is returned as it is. Memoised per context rounded to 32 tokens."""
        if context is None:
            return self
        info = self.info
        lengths, rows = info.context_lengths, info.verify_by_context
        if len(lengths) < 2 or len(rows) != len(lengths) or any(len(r) != len(self.sizes) for r in rows):
            return self
        key = max(0, round(context / 32)) * 32
        memo = self.__dict__.setdefault("_at_context", {})  # a cache beside the frozen fields, not one of them
        if key not in memo:
            drafts = info.draft_by_context if len(info.draft_by_context) == len(lengths) else (self.draft_seconds,) * len(lengths)
            series = sorted(zip(lengths, rows, drafts))  # by context length
            xs = [c for c, _, _ in series]
            verify = tuple(_read_line(xs, column, key) for column in zip(*(r for _, r, _ in series)))  # [size]
            draft = _read_line(xs, [d for *_, d in series], key)
            memo[key] = LatencyProfile(self.sizes, verify, draft, info)
        return memo[key]

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "sizes": list(self.sizes),
            "verify_seconds": list(self.verify_seconds),
            "draft_seconds": self.draft_seconds,
            "info": asdict(self.info),
        }

    @staticmethod
    def from_dict(d: dict) -> LatencyProfile:
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError(
                f"not a {FORMAT} v{VERSION} document (format={d.get('format')!r}, version={d.get('version')!r})"
            )
        info = dict(d["info"])
        info["context_lengths"] = tuple(info["context_lengths"])
        info["verify_by_context"] = tuple(tuple(row) for row in info["verify_by_context"])
        info["draft_by_context"] = tuple(info.get("draft_by_context", ()))  # absent in profiles saved before it
        return LatencyProfile(
            tuple(d["sizes"]), tuple(d["verify_seconds"]), float(d["draft_seconds"]), ProfileInfo(**info)
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @staticmethod
    def load(path: str | Path) -> LatencyProfile:
        """The profile saved at `path`; warns when it was measured on another CPU than this one
        (its tree sizes would fit that machine: measure this one with `taps profile`)."""
        profile = LatencyProfile.from_dict(read_json(path, "fix it or measure again with `taps profile`"))
        here = cpu_name()
        if profile.info.cpu != here:
            warnings.warn(f"the latency profile {path} was measured on {profile.info.cpu!r}, this CPU is {here!r}: "
                          "tree sizes follow that machine's costs; run `taps profile` here", stacklevel=2)
        if is_busy(profile.info.others_cpu):
            warnings.warn(f"the latency profile {path} was measured while other processes used "
                          f"{profile.info.others_cpu:.0%} of the CPU: tree sizes follow that busy machine's costs; "
                          "run `taps profile` again on a quiet machine", stacklevel=2)
        return profile


class OnlineProfile:
    """A latency profile refitted from the rounds the decode loop itself times (docs/method.md 3.3).

    A profile measured once can mislead the size cut: one first-call outlier pooled by the
    isotonic fit read "3 to 31 nodes cost 270 ms" where the loop measured 192 ms for 8 nodes
    and 215 ms for 19 (issue 22), so taps grew its trees too far. This wrapper keeps the
    measured `prior` and corrects it where rounds show otherwise:

    - each round gives a log ratio log(observed / prior), at the round's own tree size n and
      context (the prior is read there, so what is learnt is the level, not the context trend);
    - the first round of every distinct n is dropped: a new shape pays one-off costs (kernel
      selection, allocator growth) that later rounds of that shape never pay;
    - a size's correction is the median of its last `window` ratios (a page fault or another
      process taking the core moves a mean, not a median; the window follows drift), shrunk by
      k / (k + shrink), for the k rounds of that size seen in all, toward the pooled correction
      of all sizes (itself shrunk toward 1 the same way): a size seen twice reads like its
      neighbours, not like a prior the neighbours refuted, and one seen often reads as measured;
    - prior sizes with no rounds of their own take the pooled correction.

    Invariant: with no observations `at_context(c)` reads as `prior.at_context(c)`; every read
    is a `LatencyProfile` (the policies need not know it learns), and that profile's isotonic
    fit keeps the refitted curve non-decreasing in n.
    """

    def __init__(self, prior: LatencyProfile, window: int = 32, shrink: float = 3.0):
        if window < 1 or shrink < 0:
            raise ValueError(f"need window >= 1 and shrink >= 0, got {window}, {shrink}")
        self.prior, self.window, self.shrink = prior, window, shrink
        self.ratios: dict[int, list[float]] = {}  # tree size -> log ratios of its last rounds, newest last
        self.draft_ratios: list[float] = []
        self.counts: dict[int | None, int] = {}  # rounds seen per tree size (None: drafts), beyond the window
        self._seen: set[int] = set()  # tree sizes whose first (one-off) round was dropped
        self._memo: dict[int | None, LatencyProfile] = {}

    def _push(self, ratios: list[float], value: float, key: int | None) -> None:
        ratios.append(value)
        del ratios[: -self.window]
        self.counts[key] = self.counts.get(key, 0) + 1

    def add(self, n: int, verify_seconds: float, draft_seconds: float | None = None, context: int | None = None) -> None:
        """One round: a tree of n drafted nodes verified in `verify_seconds`, after a drafter
        call of `draft_seconds` (None: no block pass this round, e.g. a copy or ar round)."""
        if n not in self._seen:
            self._seen.add(n)
            return
        base = self.prior.at_context(context)
        if verify_seconds > 0:
            self._push(self.ratios.setdefault(n, []), float(np.log(verify_seconds / base.t_verify(n))), n)
        if draft_seconds is not None and draft_seconds > 0 and base.draft_seconds > 0:
            self._push(self.draft_ratios, float(np.log(draft_seconds / base.draft_seconds)), None)
        self._memo.clear()

    def observe(self, r: Round) -> None:
        """A round of the decode loop (taps.decode.Round): its verify stage, and its draft stage
        when the round called the drafter's block pass alone (a rollout round's time depends on
        its steps, which the profile's t_draft does not model)."""
        p = r.proposal
        drafted = p is not None and p.fixed is None and p.draft_seconds is None
        self.add(r.tree.n_draft, r.seconds[2], r.seconds[0] if drafted else None, r.context)

    def _log_correction(self, logs: list[float], k: int, toward: float = 0.0) -> float:
        """The median of `logs` after k rounds in all, shrunk toward `toward` (log space)."""
        if not logs:
            return toward
        w = k / (k + self.shrink)
        return float(w * np.median(logs) + (1 - w) * toward)

    def at_context(self, context: int | None) -> LatencyProfile:
        """The prior read at `context`, refitted by the rounds seen so far (memoised until the next round)."""
        key = None if context is None else max(0, round(context / 32)) * 32
        if key not in self._memo:
            base = self.prior.at_context(key)
            pooled = self._log_correction([x for logs in self.ratios.values() for x in logs],
                                          sum(k for n, k in self.counts.items() if n is not None))
            own = {n: self._log_correction(logs, self.counts[n], pooled) for n, logs in self.ratios.items()}
            sizes = sorted(set(base.sizes) | set(own))
            seconds = tuple(base.t_verify(n) * float(np.exp(own.get(n, pooled))) for n in sizes)
            draft = base.draft_seconds * float(np.exp(self._log_correction(self.draft_ratios, self.counts.get(None, 0))))
            self._memo[key] = LatencyProfile(tuple(sizes), seconds, draft, base.info)
        return self._memo[key]

def _read_line(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """The least-squares line through (xs, ys) at max(x, min(xs)); a falling fit is read as flat
    at the mean of ys."""
    slope, intercept = np.polyfit(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64), 1)
    if slope < 0:
        return float(np.mean(ys))
    return float(intercept + slope * max(x, min(xs)))


# measured on a 2-core AVX-512 (bf16) CPU, SmolLM2-135M in bf16 (docs/method.md section 6): milliseconds per target
# forward of k new tokens with 256 cached tokens (median of 5). A tree of n drafted nodes is
# n + 1 new tokens (the root too), so the table's k = 1, 4, ..., 128 are n = 0, 3, ..., 127.
_ASSETS_SMOLLM2_BF16_MS = {1: 36.9, 4: 37.6, 8: 42.2, 16: 48.7, 32: 64.3, 64: 97.5, 128: 161.0}


def default_profile() -> LatencyProfile:
    """The stated default when no profile was measured: SmolLM2-135M in bf16 on the 2-core
    AVX-512 CPU measured in docs/method.md section 6, t_verify from its table. No drafter was measured there, so
    t_draft is ASSUMED equal to one single-token target forward (36.9 ms): on this CPU a small
    forward costs mostly per-call overhead and the LM head. Measure your own with
    `measure_profile` for any other target, dtype, drafter or machine.
    """
    sizes = tuple(k - 1 for k in _ASSETS_SMOLLM2_BF16_MS)
    seconds = tuple(ms / 1000 for ms in _ASSETS_SMOLLM2_BF16_MS.values())
    info = ProfileInfo(
        target="SmolLM2-135M-Instruct",
        dtype="bfloat16",
        cpu="2-core AVX-512 (bf16) CPU measured in docs/method.md section 6",
        torch="2.13.0",
        threads=2,
        context_lengths=(256,),
        repeats=5,
        verify_by_context=(seconds,),
        note="t_verify from the SmolLM2-135M bf16 row of a measured table (docs/method.md section 6); t_draft assumed = t_verify(0), no drafter measured",
    )
    return LatencyProfile(sizes, seconds, seconds[0], info)


VECTOR_ISAS = ("amx_tile", "avx512_bf16", "avx512f", "avx2", "avx")  # widest first: what a CPU's matmuls can use


def cpu_name() -> str:
    """The CPU's model name and its widest vector extension, e.g. "AMD EPYC (avx512_bf16)": one
    model name covers machines whose kernels differ severalfold (AVX2 only, or bfloat16 dot products)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = next((f for f in VECTOR_ISAS if f in flags), None)
    return f"{name} ({isa})" if isa else name


def random_tree(n: int, root: int, vocab: int, gen: torch.Generator) -> Tree:
    """A tree of n drafted nodes with random tokens; node i's parent is uniform over earlier nodes."""
    tokens = torch.randint(vocab, (n + 1,), generator=gen).tolist()
    tokens[0] = root
    parents = [-1] + [int(torch.randint(i, (1,), generator=gen)) for i in range(1, n + 1)]
    return Tree.from_lists(tokens, parents)


STABLE_WITHIN = 0.05  # the two halves of a point's timings agree within this share of its median
MOST_REPEATS = 4  # a point is timed at most this many times its `repeats`


def stable_median(time_once: Callable[[], float], repeats: int, warmup: int) -> float:
    """The median of `time_once()` after `warmup` untimed calls (a new shape's first calls pay
    kernel selection and allocation), timed `repeats` times and then again until the medians of
    the first and second half of the timings agree within STABLE_WITHIN, or MOST_REPEATS x
    repeats timings: a point read while another process held the core is timed until it settles
    (one such point, smoothed by the isotonic fit, once flattened a whole curve, issue 22)."""
    for _ in range(warmup):
        time_once()
    times = [time_once() for _ in range(repeats)]
    while len(times) < MOST_REPEATS * repeats:
        half = len(times) // 2
        first, second = statistics.median(times[:half] or times), statistics.median(times[half:])
        if abs(first - second) <= STABLE_WITHIN * statistics.median(times):
            break
        times.append(time_once())
    return statistics.median(times)


def _median_verify_seconds(target: Target, tree: Tree, repeats: int, warmup: int) -> float:
    def once() -> float:
        t0 = time.perf_counter()
        target.forward_tree(tree)
        seconds = time.perf_counter() - t0
        target.commit([], tree.n_nodes)  # drop the tree's entries: the context is unchanged
        return seconds

    return stable_median(once, repeats, warmup)


def measure_profile(
    target: Target,
    drafter=None,
    sizes: Sequence[int] = (0, 3, 7, 15, 31, 63),
    context_lengths: Sequence[int] = (128, 512, 2048),
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
) -> LatencyProfile:
    """Time `target.forward_tree` on random trees of each size after a random context of each
    length (median of at least `repeats` timings after `warmup` untimed runs, more until they
    settle: `stable_median`), and the drafter's `draft` call in a steady-state round at each
    context length. The curve's points are the mean over context
    lengths; the per-length series stay in `info` for `LatencyProfile.at_context`. Without a
    drafter, t_draft is 0 and the profile's note says so.

    Model-agnostic: it only uses the `Target` interface (prefill, forward_tree, commit) and the
    `Drafter` protocol (start, draft). It leaves a random context in the target's cache and
    the drafter's state: call `prefill` / `start` again before decoding.
    """
    sizes, context_lengths = tuple(sizes), tuple(context_lengths)
    if not sizes or not context_lengths or repeats < 1 or warmup < 0:
        raise ValueError("measure_profile needs sizes, context lengths, repeats >= 1 and warmup >= 0")
    # the deepest random tree is a chain of max(sizes); the drafter's rounds add up to warmup + MOST_REPEATS x repeats
    longest = max(context_lengths) + max(max(sizes), warmup + MOST_REPEATS * repeats) + 1
    if min(context_lengths) < 1 or longest >= target.max_positions:
        raise ValueError(
            f"context lengths {context_lengths} with sizes up to {max(sizes)} overflow the target's "
            f"{target.max_positions} positions"
        )
    gen = torch.Generator().manual_seed(seed)
    verify_rows, draft_times = [], []
    with OthersCpu() as load:
        for context in context_lengths:
            ids = torch.randint(target.vocab_size, (context + 1,), generator=gen).tolist()  # root last
            features = target.prefill(ids[:-1])
            trees = [random_tree(n, ids[-1], target.vocab_size, gen) for n in sizes]
            verify_rows.append(tuple(_median_verify_seconds(target, tree, repeats, warmup) for tree in trees))
            if drafter is not None:
                draft_times.append(_median_draft_seconds(target, drafter, ids, features, repeats, warmup))
    verify = tuple(statistics.fmean(col) for col in zip(*verify_rows))
    info = ProfileInfo(
        target=portable_name(target.config._name_or_path) or target.config.model_type,
        dtype=target.dtype_name,
        cpu=cpu_name(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        context_lengths=context_lengths,
        repeats=repeats,
        verify_by_context=tuple(verify_rows),
        draft_by_context=tuple(draft_times),
        linear=linear_backend(target.model),
        drafter_quant=scheme_of(getattr(drafter, "model", None)),
        target_quant=target_quant_of(target.model),
        others_cpu=load.share,
        note="measure_profile" + ("" if drafter is not None else ": no drafter given, t_draft = 0"),
    )
    return LatencyProfile(sizes, verify, statistics.fmean(draft_times) if draft_times else 0.0, info)


def _median_draft_seconds(target: Target, drafter, ids: list[int], features, repeats: int, warmup: int) -> float:
    """Median drafter call in steady state: each call follows a one-token round, as in decoding,
    so the drafter receives the new root's features exactly as the decode loop would pass them."""
    ids = list(ids)
    drafter.start(ids)
    drafter.draft(ids, features)  # the first call sees the whole context's features

    def once() -> float:
        out = target.forward_tree(Tree.root_only(ids[-1]))
        target.commit([0], 1)
        ids.append(int(out.logits[0].argmax()))
        new_features = out.features[[0]] if out.features is not None else None
        t0 = time.perf_counter()
        drafter.draft(ids, new_features)
        return time.perf_counter() - t0

    return stable_median(once, repeats, warmup)


def profile_path(target: str, dtype: str, linear: str | None = None, drafter_quant: str = "none",
                 target_quant: str = "none") -> Path:
    """Where `taps profile` saves the profile of a target, dtype, linear backend (default: the
    one that dtype runs, `taps.linear.linear_in_use`), target and drafter precision on this machine."""
    from taps.assets import taps_home

    safe = target.strip("/").replace("/", "--")
    kernel = linear_in_use(dtype, linear) if target_quant == "none" else target_quant
    quant = "" if drafter_quant == "none" else f"-draft-{drafter_quant}"
    return taps_home() / "profiles" / f"{safe}-{dtype}-{kernel}{quant}.json"


def saved_profile(target: str, dtype: str, linear: str | None = None, drafter_quant: str = "none",
                  target_quant: str = "none") -> LatencyProfile | None:
    """The profile `taps profile` measured for this target, dtype, linear backend, target and
    drafter precision, or None."""
    path = profile_path(target, dtype, linear, drafter_quant, target_quant)
    return LatencyProfile.load(path) if path.is_file() else None

