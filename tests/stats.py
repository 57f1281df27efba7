"""A chi-square goodness-of-fit test, for checking that sampled tokens follow the target."""

from __future__ import annotations

from collections import Counter

import torch


def chi_square_pvalue(samples: list, probs: dict) -> float:
    """p-value of observing `samples` if they were drawn from `probs` (outcome -> probability).

    Outcomes with small expected counts are pooled into one bin so the chi-square
    approximation holds; an observed outcome of probability 0 gives p = 0.
    """
    n = len(samples)
    counts = Counter(samples)
    if any(probs.get(k, 0.0) == 0.0 for k in counts):
        return 0.0
    big = [k for k, p in probs.items() if p * n >= 5]
    observed = [counts.get(k, 0) for k in big]
    expected = [probs[k] * n for k in big]
    rest_p = 1.0 - sum(probs[k] for k in big)
    if rest_p * n >= 1:
        observed.append(n - sum(observed))
        expected.append(rest_p * n)
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
