"""The guard that keeps evaluation prompts out of training data: a training prompt that equals or
contains a user turn of HumanEval, MT-Bench, Spec-Bench (the copy taps ships) or the first
GSM_EVAL_CHECKED GSM-Symbolic evaluation items is refused, compared by text after whitespace
normalization (and each fenced code block on its own: HumanEval's code without its instruction).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from taps.datasets import GSM_SYMBOLIC_SEED, SPEC_BENCH_FILE, load_prompts
from taps.train.stdlib import MIN_PARAGRAPH_CHARS, normalize_space

GSM_EVAL_CHECKED = 1000  # evaluation GSM-Symbolic items compared by text (later ones: by the seed ranges)


@functools.lru_cache(maxsize=1)
def gsm_eval_questions() -> frozenset[str]:
    """The first GSM_EVAL_CHECKED evaluation items (seed GSM_SYMBOLIC_SEED), whitespace normalized."""
    import reasoning_gym

    data = reasoning_gym.create_dataset("gsm_symbolic", size=GSM_EVAL_CHECKED, seed=GSM_SYMBOLIC_SEED)
    return frozenset(normalize_space(item["question"]) for item in data)


class EvalOverlapError(ValueError):
    """A training prompt equals or contains an evaluation prompt."""


def _needles(text: str) -> list[str]:
    """A prompt text, and each fenced code block in it on its own (HumanEval's code without the
    instruction around it), whitespace normalized."""
    out = [normalize_space(text)]
    parts = text.split("```")
    for block in parts[1:-1:2]:  # inside the fences
        code = block.split("\n", 1)[1] if block.startswith(("python\n", "py\n")) else block
        if len(normalize_space(code)) >= MIN_PARAGRAPH_CHARS:
            out.append(normalize_space(code))
    return [s for s in out if s]


def eval_prompt_texts(spec_bench: str | os.PathLike | None = SPEC_BENCH_FILE,
                      gsm_symbolic: int = GSM_EVAL_CHECKED) -> dict[str, list[str]]:
    """The user turns of the evaluation sets, through taps.datasets: HumanEval, MT-Bench,
    Spec-Bench (when its file exists) and the first `gsm_symbolic` GSM-Symbolic evaluation items."""
    sets = {"humaneval": load_prompts("humaneval"), "mt-bench": load_prompts("mt-bench")}
    if spec_bench is not None and Path(spec_bench).is_file():
        sets["spec-bench"] = load_prompts("spec-bench", path=str(spec_bench))
    elif spec_bench is not None:
        warnings.warn(f"Spec-Bench file {spec_bench} not found: not checked against it", stacklevel=2)
    if gsm_symbolic:
        sets["gsm-symbolic"] = load_prompts("gsm-symbolic", limit=gsm_symbolic)
    return {name: [turn for p in prompts for turn in p.turns] for name, prompts in sets.items()}


def find_eval_overlap(prompts: Sequence[str], eval_texts: dict[str, list[str]]) -> list[tuple[int, str, str]]:
    """(prompt index, eval set, eval text) for every training prompt that equals or contains an
    evaluation text (exact substring after whitespace normalization)."""
    anchors: dict[int, dict[str, list[tuple[str, str]]]] = {}  # anchor length -> anchor -> [(set, needle)]
    for name, texts in eval_texts.items():
        for text in texts:
            for needle in _needles(text):
                k = min(len(needle), 32)
                anchors.setdefault(k, {}).setdefault(needle[:k], []).append((name, needle))
    hits = []
    for i, prompt in enumerate(prompts):
        p = normalize_space(prompt)
        found = None
        for k, table in anchors.items():
            for pos in range(len(p) - k + 1):
                for name, needle in table.get(p[pos : pos + k], ()):
                    if p.startswith(needle, pos):
                        found = (i, name, needle)
                        break
                if found:
                    break
            if found:
                break
        if found:
            hits.append(found)
    return hits


def check_no_eval_overlap(prompts: Sequence[str], spec_bench: str | os.PathLike | None = SPEC_BENCH_FILE,
                          gsm_symbolic: int = GSM_EVAL_CHECKED) -> None:
    """Raise EvalOverlapError if a training prompt equals or contains an evaluation prompt."""
    hits = find_eval_overlap(prompts, eval_prompt_texts(spec_bench, gsm_symbolic))
    if hits:
        i, name, needle = hits[0]
        raise EvalOverlapError(
            f"{len(hits)} training prompts contain evaluation prompts; first: prompt {i} contains "
            f"{name}'s {needle[:120]!r}"
        )
