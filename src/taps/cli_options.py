"""argparse types shared by the `taps` commands: every numeric option is bounded at parse time,
so a bad value is refused before any model loads, naming the option's range."""

from __future__ import annotations

import argparse


def csv_of(kind):
    def parse(text: str) -> tuple:
        return tuple(kind(x) for x in text.split(",") if x)

    return parse


def bounded(kind, low, high=None, what: str = ""):
    """An argparse type: `kind` within [low, high], refused at parse time with the range named."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (value >= low and (high is None or value <= high)):  # NaN fails both
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {bound}{what}")
        return value

    return parse


def temperature(text: str) -> float:
    """0 (greedy) or a finite temperature where softmax(logits / T) stays finite."""
    value = bounded(float, 0.0, MAX_TEMPERATURE)(text)
    if 0 < value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(f"{text} is too small to sample with (logits / T overflow): use 0 for "
                                         f"greedy decoding or a temperature >= {MIN_TEMPERATURE}")
    return value


MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
MAX_BUDGET = 1024  # drafted nodes: a larger tree costs more to verify than any acceptance could repay
SEED = bounded(int, 0, 2**63 - 1)
