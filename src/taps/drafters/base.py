"""What a drafter is, and the registry of drafter kinds.

A drafter turns the committed context into marginals [L, vocab]. It is called once per round
with every committed token (the root last) and the target features of the committed tokens it
has not seen yet (the root's features arrive next round, since they come out of this round's
verification). Row d of its output is the marginal q_{d+1} of the token d + 1 places after the
root (docs/method.md section 1).

A *kind* is a family of trained drafters stored in folders: DFlash (taps.drafters.dflash),
grown (taps.drafters.grown). Each kind owns its network, its checkpoint layout (and the marker
file that tells its folders apart), the target features it reads and its training objective,
and describes itself in one `DrafterKind` that its module registers on import. taps.drafters
imports every kind module, so the registry is complete whenever any part of the package is in
use. A new kind is one module that calls `register(DrafterKind(...))` plus one import line in
taps/drafters/__init__.py; loading (`load_drafter`), `taps train-drafter` and its `--kind`
choices then find it here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from taps.drafters.objective import BlockLoss
    from taps.target import Target
    from taps.train.drafter import TrainDrafterConfig


class Drafter(Protocol):
    block_len: int  # L: positions proposed per draft (block_size - 1)
    vocab_size: int  # must equal the target's output vocabulary
    feature_layers: tuple[int, ...]  # target layers whose hidden states the drafter reads

    def start(self, prompt_ids: Sequence[int], reused: int = 0) -> None:
        """A new sequence begins; forget the previous one, except what a drafter may keep of its first
        `reused` tokens: those the target kept in its own cache from the previous call (a chat's next
        turn, taps.target.Target.prefill's reuse), so the drafter may skip them too."""

    def draft(self, ids: Sequence[int], features: torch.Tensor | None) -> torch.Tensor:
        """Committed ids (root last) + new features [k, F] -> marginals [L, vocab] (float32, rows sum to 1).

        A drafter whose position k depends on positions before it alone (a grown drafter's masks attend
        causally) says so with a class attribute `prefix_drafts = True` and takes `slots` too:
        `draft(ids, features, slots)` -> the same first `slots` rows [slots, vocab], at the cost of
        that many (taps.rounds.DraftProposer drafts as deep as its trees go)."""


@dataclass(frozen=True)
class TargetInfo:
    """The target a drafter was trained for: recorded in its folder by every kind, checked on load."""

    name: str  # what the user called it: packaged model name, folder or hub id
    vocab_size: int  # rows of its LM head
    hidden_size: int  # its hidden size
    num_hidden_layers: int  # its decoder layers

    @classmethod
    def of(cls, model: PreTrainedModel, name: str) -> TargetInfo:
        return cls(name, model.get_output_embeddings().out_features, model.config.hidden_size,
                   model.config.num_hidden_layers)


class Trainee(Protocol):
    """One kind's drafter while it trains (taps.train.drafter runs the loop around it)."""

    module: torch.nn.Module  # what trains: its parameters with requires_grad go to the optimizer and state.pt
    spec: Any  # the kind's frozen config dataclass: a resumed run must rebuild an equal one

    def block_loss(self, ids: Sequence[int], anchors: torch.Tensor, autocast) -> BlockLoss:
        """The slot-weighted loss (taps.drafters.objective) of the blocks rooted at `anchors` [N] of one
        training sequence, their logits computed under `autocast`."""


@dataclass(frozen=True)
class KindTraining:
    """How `taps train-drafter` trains a kind: the kind-specific part of TrainDrafterConfig and
    the hooks the generic loop (optimizer, schedule, resume, evaluation, logging) calls."""

    options: tuple[str, ...]  # TrainDrafterConfig fields only this kind reads; other kinds refuse them unless at their default
    required: Mapping[str, str]  # of those, the ones that must be given: field -> what to give (for the error)
    runs: Callable[[TrainDrafterConfig], str]  # the model loaded to run while training: the target, or a base
    trainee: Callable[[TrainDrafterConfig, PreTrainedModel, list[list[int]]], Trainee]  # (cfg, model, training ids) -> a new seeded trainee
    save: Callable[[Trainee, Path], None]  # writes the trainee as a folder of this kind
    # loads a saved folder of this kind (the shipped drafter, a run's drafter/) into a new trainee of the
    # same settings, refusing others: a warm start that needs no state.pt, which no checkout carries
    warm_start: Callable[[Trainee, Path], None]


@dataclass(frozen=True)
class DrafterKind:
    name: str  # the --kind value
    doc: str  # one line for --help: what this kind of drafter is
    marker: str  # the file whose presence marks a folder of this kind; no two kinds share one
    files: str  # what a folder of this kind holds, named in errors
    load: Callable[[Path, Target, str], Drafter]  # (folder, target, quantization scheme) -> the drafter, checked against the target; its network is `.model`
    training: KindTraining
    auto_quant: str = "none"  # what --drafter-quant auto runs for this kind on the CPU (taps.quantize.auto_scheme)

    def __post_init__(self):
        if not self.name or not self.marker or os.sep in self.marker:
            raise ValueError(f"a drafter kind needs a name and a marker file name, got {self.name!r} and {self.marker!r}")


KINDS: dict[str, DrafterKind] = {}  # the registered kinds by name, in registration order


def register(kind: DrafterKind) -> DrafterKind:
    """Add a kind to KINDS (a kind module calls this once, on import)."""
    for other in KINDS.values():
        if kind.name == other.name or kind.marker == other.marker:
            raise ValueError(f"drafter kind {kind.name!r} (marker {kind.marker}) clashes with {other.name!r} "
                             f"(marker {other.marker}): give it its own name and marker file")
    KINDS[kind.name] = kind
    return kind


def drafter_kind(folder: str | os.PathLike) -> DrafterKind | None:
    """The kind whose marker file the folder holds, or None (no folder, or no kind's marker)."""
    found = [kind for kind in KINDS.values() if (Path(folder) / kind.marker).is_file()]
    if len(found) > 1:
        raise ValueError(f"{folder} holds the marker files of several drafter kinds "
                         f"({', '.join(k.marker for k in found)}); keep one drafter per folder")
    return found[0] if found else None


def expected_files() -> str:
    """What a drafter folder holds, kind by kind: for errors about a folder taps does not recognise."""
    return "; ".join(f"a {kind.name} drafter has {kind.files}" for kind in KINDS.values())
