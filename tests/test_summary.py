"""Bootstrap intervals of paired speed ratios (taps.summary.ratio_interval): they cover the true
ratio at about the nominal rate, narrow with more prompts, and are reproducible."""

import math
import random

from taps.summary import is_level, machine_label, ratio_interval


def pairs_with_ratios(ratios):
    """(record, baseline) pairs whose tokens/s ratios are `ratios` (baseline at 10 tokens/s)."""
    return [({"new_tokens": 10 * x, "total_seconds": 1.0}, {"new_tokens": 10, "total_seconds": 1.0}) for x in ratios]


def test_the_interval_covers_the_true_median_ratio_at_about_the_nominal_rate():
    """A seeded simulation: per-prompt log ratios normal around log 1.3 (the true median ratio),
    spread 0.25 as real prompts spread; 300 samples of 30 prompts. A 95% percentile interval of a
    median covers it in about 95% of samples (the bootstrap of a median runs a little short at
    small n, hence the lower bound 0.88). The negative control: a much narrower interval would fail."""
    rng = random.Random(7)
    true, hits, narrow_hits = 1.3, 0, 0
    for trial in range(300):
        ratios = [math.exp(rng.gauss(math.log(true), 0.25)) for _ in range(30)]
        low, high = ratio_interval(pairs_with_ratios(ratios), resamples=500, seed=trial)
        hits += low <= true <= high
        low50, high50 = ratio_interval(pairs_with_ratios(ratios), level=0.5, resamples=500, seed=trial)
        narrow_hits += low50 <= true <= high50
    assert 0.88 <= hits / 300 <= 0.99
    assert narrow_hits / 300 < 0.7  # a 50% interval covers about half the time: the check can fail


def test_more_prompts_narrow_the_interval_and_a_seed_reproduces_it():
    rng = random.Random(1)
    ratios = [math.exp(rng.gauss(0.2, 0.3)) for _ in range(120)]
    small = ratio_interval(pairs_with_ratios(ratios[:10]))
    large = ratio_interval(pairs_with_ratios(ratios))
    assert large[1] - large[0] < small[1] - small[0]
    assert ratio_interval(pairs_with_ratios(ratios[:10])) == small  # seeded: the same report twice
    assert ratio_interval(pairs_with_ratios([1.2])) == (None, None)  # one prompt: no interval


def test_level_means_the_interval_contains_one():
    assert is_level(0.95, 1.04) and not is_level(1.01, 1.2) and not is_level(0.8, 0.99) and not is_level(None, None)


def test_the_machine_label_names_cpu_threads_kernel_dtype_and_precision():
    env = {"cpu": "AMD EPYC (avx512_bf16)", "threads": 2, "linear": "onednn", "dtype": "bfloat16", "target_quant": "int4"}
    assert machine_label([{"env": env}, {"env": env}]) == "AMD EPYC (avx512_bf16), 2 threads, onednn, bfloat16, target int4"
    assert machine_label([{"env": {**env, "target_quant": "none"}}]).endswith("onednn, bfloat16")
    assert machine_label([{}]) == "machine not recorded"
    resumed = [{"env": env}, {"env": {**env, "scorer": "taps/shipped/x/scorer"}}]  # one machine, two environments
    assert machine_label(resumed) == machine_label([{"env": env}])
