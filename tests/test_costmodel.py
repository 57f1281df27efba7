"""The latency profile: monotone fit, interpolation, throughput-optimal size, JSON, measurement."""

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch

from taps.costmodel import LatencyProfile, OnlineProfile, ProfileInfo, cpu_name, default_profile, measure_profile
from taps.drafters.testing import RandomDrafter
from taps.target import Target
from tiny import tiny_model

INFO = ProfileInfo(target="t", dtype="float32", cpu="c", torch="2", threads=1, context_lengths=(8,), repeats=3)


def profile(sizes, seconds, draft=0.0):
    return LatencyProfile(tuple(sizes), tuple(seconds), draft, INFO)


def test_isotonic_fit_pools_violations_and_keeps_monotone_points():
    assert profile([0, 1, 2, 3], [1.0, 3.0, 2.0, 4.0]).fitted_seconds == (1.0, 2.5, 2.5, 4.0)
    assert profile([0, 4, 8], [1.0, 2.0, 3.0]).fitted_seconds == (1.0, 2.0, 3.0)
    assert profile([0, 4, 8], [3.0, 2.0, 1.0]).fitted_seconds == (2.0, 2.0, 2.0)


def test_curve_interpolates_holds_flat_below_and_extrapolates_linearly():
    p = profile([2, 4, 8], [1.0, 2.0, 4.0])
    assert p.t_verify(0) == p.t_verify(2) == 1.0  # flat below the first measured size
    assert p.t_verify(3) == pytest.approx(1.5)
    assert p.t_verify(6) == pytest.approx(3.0)
    assert p.t_verify(12) == pytest.approx(6.0)  # slope of the last segment, 0.5 s per node
    assert p.verify_curve(12).tolist() == pytest.approx([p.t_verify(n) for n in range(13)])


def test_extrapolation_uses_the_last_rising_segment_when_the_fit_ends_flat():
    p = profile([0, 10, 20, 30], [1.0, 2.0, 4.0, 3.0])  # fit: 1, 2, 3.5, 3.5
    assert p.t_verify(40) == pytest.approx(3.5 + 1.5 / 20 * 10)


@pytest.mark.parametrize("seed", range(5))
def test_curve_is_monotone_for_any_measurements(seed):
    g = torch.Generator().manual_seed(seed)
    sizes = sorted(set(torch.randint(0, 100, (6,), generator=g).tolist()))
    p = profile(sizes, (0.01 + torch.rand(len(sizes), generator=g)).tolist())
    curve = p.verify_curve(150)
    assert bool((curve[1:] >= curve[:-1] - 1e-12).all())


@pytest.mark.parametrize("bad", [
    dict(sizes=(), verify_seconds=()),
    dict(sizes=(0, 1), verify_seconds=(1.0,)),
    dict(sizes=(3, 3), verify_seconds=(1.0, 2.0)),
    dict(sizes=(-1, 3), verify_seconds=(1.0, 2.0)),
    dict(sizes=(0, 3), verify_seconds=(1.0, 0.0)),
    dict(sizes=(0, 3), verify_seconds=(1.0, math.nan)),
    dict(sizes=(0, 3), verify_seconds=(1.0, 2.0), draft_seconds=-1.0),
])
def test_invalid_profiles_are_refused(bad):
    with pytest.raises(ValueError):
        LatencyProfile(**{"draft_seconds": 0.0, "info": INFO, **bad})


def test_best_size_maximises_modelled_tokens_per_second():
    p = profile([0, 4, 8], [1.0, 1.0, 3.0], draft=0.5)
    gains = [0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05]
    rate = [(1 + sum(gains[:n])) / (0.5 + p.t_verify(n)) for n in range(len(gains) + 1)]
    assert p.best_size(gains) == max(range(len(rate)), key=rate.__getitem__) == 4
    assert p.best_size([]) == 0
    assert profile([0, 1], [1.0, 1.5]).best_size([0.3]) == 0  # 30% more tokens for 50% more time: not worth it
    # a round's own drafting time replaces t_draft: a dear (sunk) draft makes bigger trees pay, none smaller ones
    assert profile([0, 1], [1.0, 1.5]).best_size([0.3], draft_seconds=5.0) == 1
    rate0 = [(1 + sum(gains[:n])) / p.t_verify(n) for n in range(len(gains) + 1)]
    assert p.best_size(gains, draft_seconds=0.0) == max(range(len(rate0)), key=rate0.__getitem__)


def by_context(rows, drafts=()):
    """A profile at sizes 0 and 10 with one series per context length in `rows` (context -> (t(0), t(10)))."""
    info = ProfileInfo(target="t", dtype="float32", cpu="c", torch="2", threads=1, context_lengths=tuple(rows),
                       repeats=3, verify_by_context=tuple(rows.values()), draft_by_context=tuple(drafts))  # fmt: skip
    mean = tuple(sum(c) / len(rows) for c in zip(*rows.values()))
    return LatencyProfile((0, 10), mean, sum(drafts) / len(drafts) if drafts else 0.25, info)


def test_at_context_reads_the_curve_between_and_past_the_measured_lengths():
    p = by_context({512: (2.0, 4.0), 128: (1.0, 2.0)}, drafts=(0.3, 0.1))  # given out of order on purpose
    mid = p.at_context(320)  # halfway
    assert mid.verify_seconds == pytest.approx((1.5, 3.0)) and mid.draft_seconds == pytest.approx(0.2)
    far = p.at_context(896)  # past the longest: the last slope, as long again
    assert far.verify_seconds == pytest.approx((3.0, 6.0)) and far.draft_seconds == pytest.approx(0.5)
    near = p.at_context(32)  # below the shortest: flat
    assert near.verify_seconds == pytest.approx((1.0, 2.0)) and near.draft_seconds == pytest.approx(0.1)
    assert far.t_verify(5) == pytest.approx(4.5)
    assert p.at_context(330) is mid  # memoised per 32 tokens
    assert near.sizes == p.sizes and near.info == p.info


def test_at_context_fits_a_line_over_three_lengths_reads_a_falling_cost_flat_and_keeps_a_single_series():
    p = by_context({128: (1.0, 2.0), 256: (1.5, 2.0), 384: (2.0, 3.5)})  # t(10) at 256 is a noisy low point
    assert p.at_context(512).verify_seconds == pytest.approx((2.5, 4.0))  # least-squares lines, not the last two points
    p = by_context({128: (1.0, 2.0), 512: (0.9, 2.5)})  # t(0) fell with context: measurement noise
    assert p.at_context(896).verify_seconds == pytest.approx((0.95, 3.0))
    assert p.at_context(896).draft_seconds == 0.25  # t_draft not kept per context: the mean
    one = by_context({128: (1.0, 2.0)})
    assert one.at_context(4000) is one


def test_default_profile_is_the_assets_smollm2_bf16_row():
    p = default_profile()
    assert p.info.target == "SmolLM2-135M-Instruct" and p.info.dtype == "bfloat16"
    assert p.t_verify(0) == pytest.approx(0.0369)  # k = 1 new token: the root alone
    assert p.t_verify(15) == pytest.approx(0.0487)  # k = 16
    assert p.t_verify(127) == pytest.approx(0.161)
    assert p.draft_seconds == pytest.approx(0.0369)
    assert "measured" in p.info.note and "assumed" in p.info.note


def test_save_load_round_trip(tmp_path):
    p = default_profile()
    p.save(tmp_path / "profile.json")
    with pytest.warns(UserWarning, match="measured on '2-core AVX-512"):  # another CPU than this one
        assert LatencyProfile.load(tmp_path / "profile.json") == p
    here = dataclasses.replace(p, info=dataclasses.replace(p.info, cpu=cpu_name()))
    here.save(tmp_path / "here.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # measured on this CPU: no warning
        assert LatencyProfile.load(tmp_path / "here.json") == here
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="taps-latency-profile"):
        LatencyProfile.load(tmp_path / "other.json")


@pytest.fixture
def one_thread():
    """Tiny multi-token forwards on a busy 2-core machine are 100x slower with 2 OpenMP threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_measure_profile_on_a_tiny_model(tmp_path, one_thread):
    target = Target(tiny_model("llama", max_positions=64), feature_layers=(0, 2))
    drafter = RandomDrafter(target, block_len=4)
    p = measure_profile(target, drafter, sizes=(0, 2, 5), context_lengths=(4, 12), repeats=2)
    assert p.sizes == (0, 2, 5) and p.draft_seconds > 0
    assert all(t > 0 for t in p.verify_seconds)
    assert len(p.info.verify_by_context) == 2 and p.info.context_lengths == (4, 12)
    assert p.info.dtype == "float32" and p.info.target == "llama" and p.info.repeats == 2 and p.info.threads == 1
    assert p.verify_seconds == pytest.approx([sum(c) / 2 for c in zip(*p.info.verify_by_context)])
    assert len(p.info.draft_by_context) == 2 and p.draft_seconds == pytest.approx(sum(p.info.draft_by_context) / 2)
    p.save(tmp_path / "p.json")
    assert LatencyProfile.load(tmp_path / "p.json") == p
    assert measure_profile(target, sizes=(1,), context_lengths=(4,), repeats=1).draft_seconds == 0.0
    with pytest.raises(ValueError, match="overflow"):
        measure_profile(target, sizes=(40,), context_lengths=(30,), repeats=1)


# --- the online refit (OnlineProfile) ---------------------------------------------------------

# issue 22's case: one first-call outlier (7 nodes read 409 ms once) pooled by the isotonic fit into a
# flat "3 to 31 nodes cost ~270 ms", while the loop measured ~190 ms for 8 nodes and ~257 ms for 32
MISLED = ((0, 3, 7, 15, 31), (0.189, 0.200, 0.409, 0.205, 0.260))


def true_seconds(n):
    return 0.189 + 0.0022 * n  # the machine's real verify time of n drafted nodes


def gains_of(n_max=31, rate=0.8):
    return [rate ** (i + 1) for i in range(n_max)]  # a geometric acceptance model


def run_rounds(online, rounds, rng, outliers=0.1):
    """Decode-loop rounds against a synthetic timer: each round's size is the cut of the current
    curve (some rounds off it, as selections that admit fewer nodes are), its time the true one
    with 3% noise, 10% outliers x3, and every new size's first round x2.5 (a first-call cost)."""
    seen = set()
    gains = gains_of()
    for _ in range(rounds):
        n = online.at_context(None).best_size(gains)
        if rng.random() < 0.3:
            n = int(rng.integers(0, 32))
        t = true_seconds(n) * float(np.exp(rng.normal(0, 0.03)))
        if rng.random() < outliers:
            t *= 3
        if n not in seen:
            seen.add(n)
            t *= 2.5
        online.add(n, t, draft_seconds=0.076 * float(np.exp(rng.normal(0, 0.03))))
    return seen


def test_online_profile_converges_to_the_measured_times_despite_outliers():
    import numpy as np

    prior = profile(*MISLED, draft=0.12)
    online = OnlineProfile(prior)
    rng = np.random.default_rng(0)
    seen = run_rounds(online, 400, rng)
    fitted = online.at_context(None)
    often = [n for n in seen if online.counts.get(n, 0) >= 16]
    assert len(often) >= 2
    for n in often:  # a size the loop ran often reads its measured time
        assert fitted.t_verify(n) == pytest.approx(true_seconds(n), rel=0.05), n
    assert fitted.draft_seconds == pytest.approx(0.076, rel=0.05)
    # and the size it cuts at runs within 3% of the true best rate, where the misled prior's loses > 5%
    gains = np.array(gains_of())

    def true_rate(n):
        return (1 + gains[:n].sum()) / (0.076 + true_seconds(n))

    best = max(true_rate(n) for n in range(32))
    assert true_rate(prior.best_size(gains)) < 0.95 * best  # negative control
    assert true_rate(fitted.best_size(gains)) > 0.97 * best


def test_online_profile_reads_as_its_prior_until_rounds_are_seen_and_drops_each_sizes_first_round():
    prior = profile(*MISLED, draft=0.12)
    online = OnlineProfile(prior)
    assert online.at_context(None).fitted_seconds == pytest.approx(prior.fitted_seconds)
    assert online.at_context(None).draft_seconds == 0.12
    online.add(8, 5.0, draft_seconds=9.0)  # a first round of size 8: dropped whole
    assert online.ratios == {} and online.draft_ratios == []
    online.add(8, 0.19, draft_seconds=0.06)
    fitted = online.at_context(None)
    assert 8 in fitted.sizes and fitted.draft_seconds < 0.12
    # one round is shrunk toward the pooled correction, itself shrunk toward 1: log ratio x (1/4 + 3/4 x 1/4)
    r = 0.19 / prior.t_verify(8)
    point = dict(zip(fitted.sizes, fitted.verify_seconds))  # before the isotonic fit
    assert point[8] == pytest.approx(prior.t_verify(8) * r ** (1 / 4 + 3 / 16))
    # sizes with no rounds of their own take the pooled correction
    assert point[31] == pytest.approx(prior.t_verify(31) * r ** (1 / 4))
    with pytest.raises(ValueError, match="window"):
        OnlineProfile(prior, window=0)


def test_a_speculator_refits_its_profile_from_its_rounds_and_a_static_one_does_not():
    import taps

    model = tiny_model("llama")
    spec = taps.load(model, "random", method="cost-aware", budget=6, block_len=4)
    assert isinstance(spec.profile, OnlineProfile)
    spec.generate([1, 2, 3], max_new_tokens=12)
    assert spec.profile.ratios
    assert spec.profile.at_context(None) != spec.profile.prior.at_context(None)
    static = taps.load(model, "random", method="cost-aware", budget=6, block_len=4, adapt_profile=False)
    assert isinstance(static.profile, LatencyProfile)


def test_stable_median_drops_warmup_and_times_until_the_halves_agree():
    from taps.costmodel import MOST_REPEATS, stable_median

    calls = iter([9.0, 1.0, 1.0, 1.0, 1.0])  # a first call of a new shape, then steady
    assert stable_median(lambda: next(calls), repeats=4, warmup=1) == 1.0
    noisy = iter([1.0, 1.0, 2.0, 2.0] + [1.0] * 8)  # the core was taken mid-way: more timings, then it settles
    times = []

    def once():
        times.append(next(noisy))
        return times[-1]

    assert stable_median(once, repeats=4, warmup=0) == 1.0 and len(times) > 4
    never = iter(range(1, 100))  # never settles (ever slower): stops at MOST_REPEATS x repeats
    count = []
    stable_median(lambda: count.append(1) or next(never), repeats=2, warmup=0)
    assert len(count) == MOST_REPEATS * 2


def test_loading_a_profile_measured_on_a_busy_machine_warns(tmp_path):
    p = default_profile()
    for share in (None, 0.02, 0.4):
        info = dataclasses.replace(p.info, cpu=cpu_name(), others_cpu=share)
        dataclasses.replace(p, info=info).save(tmp_path / f"{share}.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # unmeasured or quiet: no warning
        for share in (None, 0.02):
            assert LatencyProfile.load(tmp_path / f"{share}.json").info.others_cpu == share
    with pytest.warns(UserWarning, match="other processes used 40% of the CPU"):
        LatencyProfile.load(tmp_path / "0.4.json")
