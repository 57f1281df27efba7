"""Drafters: anything that turns the committed context into marginals [L, vocab].

- base: the `Drafter` protocol, `TargetInfo`, and the registry of drafter kinds (`KINDS`);
- testing: the test drafters `oracle`, `random`, `noisy` (`TEST_DRAFTERS`);
- dflash (+ dflash_model, dflash_training) and grown: the trained kinds, one module each that
  registers itself; objective: the block loss every kind trains with;
- loading: `load_drafter` by name or folder, and what ships with taps.
"""

from taps.drafters import dflash, grown  # noqa: F401  each registers its kind; a new kind adds one import here
from taps.drafters.base import KINDS, Drafter, DrafterKind, TargetInfo, drafter_kind
from taps.drafters.loading import load_drafter, resolve_quant, shipped_drafter, shipped_scorer
from taps.drafters.testing import TEST_DRAFTERS

__all__ = [
    "KINDS",
    "TEST_DRAFTERS",
    "Drafter",
    "DrafterKind",
    "TargetInfo",
    "drafter_kind",
    "load_drafter",
    "resolve_quant",
    "shipped_drafter",
    "shipped_scorer",
]
