"""Names and folders -> drafters: a test drafter by name, a trained one by its folder (any
registered kind), and the drafters and scorers that ship with taps.

Loading needs no feature layers on the Target beforehand: the drafter comes first, then the
target is told which layers to read (`Target.read_features`). A Target serves one drafter at a
time; loading another one re-points its features.
"""

from __future__ import annotations

from pathlib import Path

import torch

from taps.drafters.base import Drafter, drafter_kind, expected_files
from taps.drafters.testing import TEST_DRAFTERS
from taps.quantize import auto_scheme, check_scheme, quantize_linears
from taps.scorer import is_scorer_folder
from taps.target import Target

# trained drafters that ship with taps: NAME/ a packaged target's default, NAME-KIND/ one of another kind
SHIPPED = Path(__file__).parent.parent / "shipped"
SCORER_DIR = "scorer"  # a drafter folder's trained TAPS edge scorer (taps train-scorer), used by default


def load_drafter(name_or_folder: str, target: Target, *, block_len: int | None = None, quantize: str = "none") -> Drafter:
    """A test drafter by name (TEST_DRAFTERS), or a trained drafter from a folder of any registered
    kind, checked against `target`; the target then reads the drafter's feature layers.

    A packaged model name or a folder of a plain causal LM is a sibling drafter
    (taps.drafters.sibling): that model's own greedy path, no training.

    `block_len` sets a test or sibling drafter's L; a trained drafter has its own, and a different
    one is an error. `quantize` (taps.quantize.SCHEMES) runs a trained drafter's linear layers in int8:
    faster drafts, the output unchanged; "auto" picks by kind and device (`resolve_quant`)."""
    quantize = resolve_quant(quantize, name_or_folder, target.device)
    if name_or_folder in TEST_DRAFTERS:
        if check_scheme(quantize) != "none":
            raise ValueError(f"the test drafter {name_or_folder!r} has no weights to quantize; --drafter-quant is for trained drafters")
        drafter = TEST_DRAFTERS[name_or_folder].build(target, **({} if block_len is None else {"block_len": block_len}))
    elif _is_sibling(name_or_folder):
        from taps.drafters.sibling import load_sibling
        from taps.quantize import load_dtype

        drafter = load_sibling(name_or_folder, target, block_len=block_len, dtype=load_dtype(quantize, target.dtype))
        drafter.model = quantize_linears(drafter.model, quantize)
    else:
        folder = Path(name_or_folder)
        if not folder.is_dir():
            raise ValueError(f"unknown drafter {name_or_folder!r}: give a drafter folder or one of {', '.join(TEST_DRAFTERS)}")
        kind = drafter_kind(folder)
        if kind is None:
            raise ValueError(f"{folder} holds no drafter taps knows: {expected_files()}")
        drafter = kind.load(folder, target, quantize)
        if block_len is not None and block_len != drafter.block_len:
            raise ValueError(f"the drafter in {folder} proposes {drafter.block_len} positions, not {block_len}")
        drafter.model = quantize_linears(drafter.model, quantize)
    target.read_features(drafter.feature_layers)  # refuses layers outside the target's
    return drafter


def resolve_quant(quantize: str, name_or_folder: str | None, device: torch.device | str) -> str:
    """`quantize` with "auto" resolved for the drafter `name_or_folder` on `device`
    (taps.quantize.auto_scheme): its kind's choice for a trained drafter folder, int8 for a sibling
    model, none for a test drafter or anything else."""
    if check_scheme(quantize) != "auto":
        return quantize
    if name_or_folder is None or name_or_folder in TEST_DRAFTERS:
        return "none"
    if _is_sibling(name_or_folder):
        return auto_scheme("int8", device)
    kind = drafter_kind(Path(name_or_folder)) if Path(name_or_folder).is_dir() else None
    return "none" if kind is None else auto_scheme(kind.auto_quant, device)


def _is_sibling(name_or_folder: str) -> bool:
    """A packaged model or a folder holding a plain causal LM: a sibling drafter (taps.drafters.sibling)."""
    from taps.assets import MODELS
    from taps.drafters.sibling import is_model_folder

    return name_or_folder in MODELS or is_model_folder(name_or_folder)


def shipped_drafter(target_name: str, kind: str | None = None) -> str | None:
    """The folder of the drafter taps ships for a packaged target (its default: SHIPPED/NAME), or with
    `kind` the one of that kind (the default when it is one, else SHIPPED/NAME-KIND: SmolLM2's DFlash
    drafter, which vLLM's dflash method runs, beside its default grown one); None when taps ships
    none (a folder or hub id is never a packaged target)."""
    from taps.assets import MODELS

    if target_name not in MODELS:
        return None
    folders = [SHIPPED / target_name] + ([SHIPPED / f"{target_name}-{kind}"] if kind else [])
    for folder in folders:
        found = drafter_kind(folder)
        if found is not None and kind in (None, found.name):
            return str(folder)
    return None


def shipped_scorer(drafter: str | None) -> str | None:
    """The edge scorer trained for a drafter folder (its `scorer/`), or None: taps then scores
    edges by the plain marginals."""
    if drafter is None or drafter in TEST_DRAFTERS:
        return None
    folder = Path(drafter) / SCORER_DIR
    return str(folder) if is_scorer_folder(folder) else None
