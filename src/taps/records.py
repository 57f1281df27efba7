"""Records: the one resumable JSONL store of taps, and the benchmark's record schema.

A records file holds one JSON object per line. `taps bench` writes its runs there and
`taps gen-data` its training sequences; `taps report` and the trainers read them back. The
rules, the same for every writer:

- Appends are durable: each batch of lines is written, flushed and fsynced before the call
  returns, so an interrupted run loses at most the record it was writing.
- Only the last line may be damaged, and only by a write cut short: it does not parse. A reader
  skips it; `RecordFile.open` cuts it off (and warns) before appending. A line that does not
  parse anywhere else is not an interrupted write but a damaged file: an error naming the file
  and line, never a record silently dropped.
- Settings are pinned: the first line of a file opened for writing is `{"settings": {...}}`,
  the options that shape its records' numbers. Reopening it with other settings is refused,
  naming each differing setting, because a resumed run would take the old records as its own.
  Files written before settings were pinned have no such line: they read as before, but are
  not appended to (their settings cannot be checked).

Nothing here imports torch: reports are made where no model runs.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from taps.files import make_folder, taps_home

PACKAGE = Path(__file__).resolve().parent  # the taps package this code runs from
HEADER_KEY = "settings"  # the first line of a pinned file: {"settings": {...}} and nothing else


def is_header(obj: object) -> bool:
    """Whether a parsed line is a file's settings line rather than a record."""
    return isinstance(obj, dict) and set(obj) == {HEADER_KEY}


@dataclass
class _Contents:
    settings: dict | None  # the pinned settings (None: a file from before pinning, or a new one)
    records: list[dict]
    complete_end: int  # bytes up to the end of the last whole line; a torn tail lies after it
    size: int


def _parse(path: Path, data: bytes, required: Sequence[str]) -> _Contents:
    """A file's settings and records under the module's rules; ValueError at the first damaged
    line that is not the last, or a record without a `required` field."""
    settings, records = None, []
    lines = data.split(b"\n")  # the last item is what follows the final newline (b"" when none)
    start = 0  # of the line in bytes
    for number, line in enumerate(lines, 1):
        last = number == len(lines)
        if line.strip():
            try:
                obj = json.loads(line)  # bytes: a line that is not UTF-8 fails here, alone
            except ValueError as err:
                if last:  # a write cut short: everything before it is whole
                    return _Contents(settings, records, start, len(data))
                raise ValueError(f"{path}:{number}: not a JSON record ({err}); only the last line can be cut "
                                 f"short by an interrupted write, so the file is damaged: repair or delete line "
                                 f"{number}") from None
            if is_header(obj):
                if settings is not None or records:
                    raise ValueError(f"{path}:{number}: a settings line after the first line (two files joined?); "
                                     "keep one file per settings")
                settings = obj[HEADER_KEY]
            elif not isinstance(obj, dict):
                raise ValueError(f"{path}:{number}: a JSON {type(obj).__name__}, not a record (a JSON object)")
            else:
                missing = [k for k in required if k not in obj]
                if missing:
                    raise ValueError(f"{path}:{number}: the record has no {', '.join(missing)}: not a record "
                                     "of this kind of file")
                records.append(obj)
        start += len(line) + 1
    return _Contents(settings, records, len(data), len(data))


def _contents(path: Path, required: Sequence[str]) -> _Contents:
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a records file")
    return _parse(path, path.read_bytes() if path.exists() else b"", required)


def read_records(path: str | os.PathLike, required: Sequence[str] = ()) -> list[dict]:
    """Every whole record of a records file, in file order, without its settings line; a torn
    last line is skipped (the file is not changed) and a missing file has none. `required`:
    fields every record must have (ValueError naming the line otherwise)."""
    return _contents(Path(path), required).records


def read_settings(path: str | os.PathLike) -> dict | None:
    """The settings a records file pins (None: not pinned, or no file)."""
    return _contents(Path(path), ()).settings


def _lines(records: Iterable[dict]) -> bytes:
    """Records as the file holds them: one JSON object a line."""
    return b"".join((json.dumps(r) + "\n").encode() for r in records)


def _header_line(settings: dict) -> bytes:
    return (json.dumps({HEADER_KEY: settings}) + "\n").encode()


def _differences(pinned: dict, settings: dict) -> list[str]:
    """One phrase per setting that differs: its name, the file's value, this run's value."""

    def show(values: dict, key: str) -> str:
        return repr(values[key]) if key in values else "absent"

    return [f"{k}: {show(pinned, k)} in the file, {show(settings, k)} now"
            for k in sorted(set(pinned) | set(settings)) if k not in pinned or k not in settings or pinned[k] != settings[k]]


class RecordFile:
    """A records file opened for appending under pinned settings; `records` holds its records,
    those found on opening and those appended since."""

    def __init__(self, path: Path, settings: dict, records: list[dict]):
        self.path = path
        self.settings = settings
        self.records = records

    @classmethod
    def open(cls, path: str | os.PathLike, settings: dict, required: Sequence[str] = (),
             remedy: str = "write to another --out") -> RecordFile:
        """Open (or create) `path` for appending records made with `settings` (JSON values).

        A torn last line is cut off, with a warning. A file without records takes `settings`
        (a run that stopped before its first record pinned nothing worth keeping); a file with
        records must pin the same settings, or ValueError names each difference and `remedy`.
        The file is created here, so an unwritable location fails now, not after a long run."""
        path = Path(path)
        settings = json.loads(json.dumps(settings))  # as the file will hold them: tuples become lists
        make_folder(path.parent, f"records to {path}", remedy)
        try:
            found = _contents(path, required)
            with open(path, "ab"):  # create it, or prove it writable
                pass
        except OSError as err:
            raise ValueError(f"cannot write records to {path}: {err.strerror or err}; {remedy}") from None
        if found.records and found.settings is None:
            raise ValueError(f"{path} holds records written before taps pinned settings in its records files, so "
                             f"a rerun cannot tell whether they match this one's; {remedy} (if they were made with "
                             f"these settings, make this its first line: {_header_line(settings).decode().strip()})")
        if found.records and found.settings != settings:
            raise ValueError(f"{path} holds records made with other settings ({'; '.join(_differences(found.settings, settings))}): "
                             f"they would be taken as this run's; {remedy}, or rerun with its settings")
        if found.complete_end < found.size:
            warnings.warn(f"{path}: its last line was cut short by an interrupted write; removed it "
                          f"({found.size - found.complete_end} bytes) to resume after the last whole record",
                          stacklevel=2)
        with open(path, "r+b") as f:
            if found.records:
                f.truncate(found.complete_end)  # the torn tail, if any
                f.seek(found.complete_end - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # a whole last record that only lacked its newline
            else:
                f.truncate(0)
                f.write(_header_line(settings))
            f.flush()
            os.fsync(f.fileno())
        return cls(path, settings, found.records)

    def drop(self, unwanted: Callable[[dict], bool]) -> int:
        """Remove the records `unwanted` picks from the file, durably, and return how many went.
        The file is written anew beside itself and then renamed over it (atomic): a crash at any
        point leaves the old file or the new one whole, never a mix."""
        kept = [r for r in self.records if not unwanted(r)]
        if len(kept) == len(self.records):
            return 0
        fresh = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(fresh, "wb") as f:
                f.write(_header_line(self.settings) + _lines(kept))
                f.flush()
                os.fsync(f.fileno())
            os.replace(fresh, self.path)
        finally:
            fresh.unlink(missing_ok=True)
        folder = os.open(self.path.parent, os.O_RDONLY)  # the rename itself made durable
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        dropped, self.records = len(self.records) - len(kept), kept
        return dropped

    def append(self, record: dict) -> None:
        """Append one record durably."""
        self.extend([record])

    def extend(self, records: Iterable[dict]) -> None:
        """Append records, one line each, durably (one fsync for the batch)."""
        records = list(records)
        with open(self.path, "ab") as f:
            f.write(_lines(records))
            f.flush()
            os.fsync(f.fileno())
        self.records += records


# ---------------------------------------------------------------------------------------------
# The benchmark's records: one per (dataset, prompt, method, budget, temperature)
# ---------------------------------------------------------------------------------------------

KEY_FIELDS = ("dataset", "prompt_id", "method", "budget", "temperature")  # what a bench record is of


@dataclass
class Run:
    """What one method produced for one prompt (all turns)."""

    token_ids: list[list[int]]  # generated ids per turn
    texts: list[str]  # decoded answer per turn
    seconds: list[float]  # wall time per turn
    rounds: list[int] | None = None  # target forwards per turn (None for peers that do not expose them)
    accepted_per_round: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    copy_rounds: int = 0  # rounds that verified an n-gram continuation without calling the drafter (taps.copying)


def portable_name(name: str | None) -> str | None:
    """How records and reports name a model, drafter or scorer: never by an absolute path of the
    machine, which says nothing on another one. A packaged model's converted folder becomes its
    name (`qwen2.5-coder-1.5b`); a path inside the taps package becomes
    package-relative (`taps/shipped/smollm2-135m`), and so does one inside any source checkout of
    taps (`.../src/taps/...`: older results name the snapshot a benchmark ran from); a path inside
    the working directory becomes relative to it, one in the home folder `~/...`. Names (packaged
    models, hub ids, test drafters), relative paths and None are returned unchanged."""
    if name is None or not Path(name).is_absolute():
        return name
    path = Path(os.path.normpath(name))
    if path.parent == taps_home().resolve() / "models":  # a packaged model's converted folder, named as it
        return path.name
    if path.resolve().is_relative_to(PACKAGE):
        return (Path(PACKAGE.name) / path.resolve().relative_to(PACKAGE)).as_posix()
    checkouts = [i for i in range(len(path.parts) - 1) if path.parts[i:i + 2] == ("src", "taps")]
    if checkouts:
        return Path(*path.parts[checkouts[-1] + 1:]).as_posix()
    for root, prefix in ((Path.cwd(), Path()), (Path.home(), Path("~"))):
        if path.is_relative_to(root):
            return (prefix / path.relative_to(root)).as_posix()
    return name


def bench_record(*, dataset: str, prompt_id: str, category: str, method: str, budget: int | None,
                 temperature: float, target: str, drafter: str | None, run: Run, peak_rss_mb: float,
                 env: dict, others_cpu: float | None = None) -> dict:
    """The record of one run: its key (KEY_FIELDS), the prompt's category, the models (drafter
    None for methods that draft nothing), every field of `run`, the totals the summaries read
    (new_tokens, total_seconds), the process's peak memory, the share of the CPU other processes
    used meanwhile (taps.cpuload; None where unmeasured, and absent from older records) and the
    environment it ran in. Models are named by `portable_name`."""
    return {
        "dataset": dataset, "prompt_id": prompt_id, "category": category,
        "method": method, "budget": budget, "temperature": temperature,
        "target": portable_name(target), "drafter": portable_name(drafter),
        **asdict(run),
        "new_tokens": sum(len(t) for t in run.token_ids), "total_seconds": sum(run.seconds),
        "peak_rss_mb": peak_rss_mb, "others_cpu": others_cpu, "env": env,
    }  # fmt: skip


def record_key(rec: dict) -> tuple:
    return tuple(rec[k] for k in KEY_FIELDS)


# Peers that run llama.cpp's own model (the packaged GGUF's 4-bit weights), not the target taps
# decodes: their records count for speed, never as lossless ratios to ar (taps.report).
LLAMA_CPP_PEERS = ("llama-cpp", "llama-cpp-lookup", "llama-cpp-draft")


def is_peer(rec: dict) -> bool:
    """A peer (transformers' own generation, run for comparison) exposes no rounds."""
    return rec["rounds"] is None


def group_label(rec: dict) -> str:
    """The row a record is summarized in: its dataset, per category for Spec-Bench."""
    return f"spec-bench/{rec['category']}" if rec["dataset"] == "spec-bench" else rec["dataset"]


def tokens_per_second(rec: dict) -> float | None:
    """A record's new tokens over its wall seconds (all turns); None for a run that took no time."""
    return rec["new_tokens"] / rec["total_seconds"] if rec["total_seconds"] > 0 else None
