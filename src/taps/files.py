"""Files and folders a user names: read and made with errors that name the file and the remedy.

Every check here is cheap (a header, a directory entry), so callers run it before long work:
a damaged weights file is found before a model loads, an unwritable output before a benchmark.
The errors are ValueErrors, which the CLI prints as one line (taps.cli.main).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def taps_home() -> Path:
    """Root of the cache: `$TAPS_HOME`, else `~/.cache/taps` (packaged models in its models/)."""
    return Path(os.environ.get("TAPS_HOME") or Path.home() / ".cache" / "taps").expanduser()


def read_json(path: str | os.PathLike, remedy: str) -> Any:
    """The JSON document in `path`; a file that is not valid JSON (or not UTF-8) is an error naming
    the file, the place and `remedy` (what to do: "fix or regenerate it", ...)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                         f"{remedy}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text, so not a JSON file; {remedy}") from None


def damaged_weights(folder: str | os.PathLike) -> str | None:
    """What is wrong with the first damaged `*.safetensors` file in `folder` ("FILE is damaged
    (reason)"), or None: a file's header must parse and its data must cover the file exactly, which
    is what a truncated or padded copy breaks. safetensors' own `safe_open` checks both from the
    header alone (the tensors are memory-mapped, not read)."""
    from safetensors import safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:  # SafetensorError (not exported by name in every version), OSError
            return f"{path} is damaged ({str(err).removeprefix('Error while deserializing header: ')})"
    return None


def check_weights(folder: str | os.PathLike, remedy: str) -> None:
    """Raise, naming the file and `remedy`, if a weights file in `folder` is damaged (`damaged_weights`)."""
    if damage := damaged_weights(folder):
        raise ValueError(f"{damage}; {remedy}")


def make_folder(path: str | os.PathLike, what: str, remedy: str) -> Path:
    """`mkdir -p path`, proved writable; else an error naming `what` would be written ("records to
    FILE"), why it cannot be (a part of the path that is a file, no permission) and `remedy`."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as err:
        raise ValueError(f"cannot write {what}: {_reason(path, err)}; {remedy}") from None
    return path


@contextmanager
def output_folder(path: str | os.PathLike, what: str, remedy: str) -> Iterator[Path]:
    """`make_folder` for a job's output, removed again if the job fails before writing into it:
    a refused run (a bad option found after loading) leaves no empty folder behind."""
    path = Path(path)
    existed = path.exists()
    make_folder(path, what, remedy)
    try:
        yield path
    except BaseException:
        if not existed and not any(path.iterdir()):
            path.rmdir()
        raise


def _reason(path: Path, err: OSError) -> str:
    for part in reversed((path, *path.parents)):
        if part.exists() and not part.is_dir():
            return f"{part} is a file, not a folder"
    return err.strerror or str(err)
