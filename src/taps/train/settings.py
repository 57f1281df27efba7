"""Settings pinned beside a resumable job's output, so a rerun cannot mix two configurations."""

from __future__ import annotations

from pathlib import Path

from taps.files import read_json


def check_pinned(meta_path: Path, settings: dict, what: str, remedy: str) -> None:
    """Raise if `meta_path` pins settings that differ from `settings` (a fresh job passes).

    `what` names the existing output ("FILE was generated"), `remedy` says what to do instead."""
    if not meta_path.exists():
        return
    old = read_json(meta_path, "delete it to start the job afresh")
    changed = sorted(k for k in settings if old.get(k) != settings[k])
    if changed:
        raise ValueError(f"{what} with other settings ({', '.join(changed)} differ: "
                         f"{ {k: old.get(k) for k in changed} }); {remedy}")
