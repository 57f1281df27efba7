"""Spec-Bench's own evaluation on taps' answer files: its `evaluation/speed.py` `speed()` and
`evaluation/equal.py` comparison, imported from a user's checkout of Spec-Bench
(github.com/hemingkx/Spec-Bench), never copied here.

    python scripts/spec_bench_eval.py --spec-bench ~/Spec-Bench \\
        --answers results/qwen1.5b-bf16/results.answers --out spec_bench_eval.json

`taps bench` writes the answer files (`<out>.answers/<set>/<method>[-b<B>]-t<T>.jsonl`, see
taps.summary.write_spec_bench_answers). Run as a script, speed.py always reports
`get_mean_speedup()` over paths hard-coded for its authors' machine (`--mean-report` is a
store_true flag that defaults to True), so this calls `speed()` itself: per set, temperature and
method against `ar` at that temperature, for each of Spec-Bench's tasks with rows in the set.

Mind what speed() measures: the mean over questions of tokens/s, the method's over the
baseline's (a ratio of means; taps reports the median of per-prompt ratios), and the baseline's
tokens not as generated but by re-tokenizing its answer texts, minus one per turn for the BOS a
Llama/Vicuna tokenizer prepends. The Qwen and SmolLM2 tokenizers prepend none, so each turn counts
one token too few: on the 1.5B's bfloat16 answers (results/qwen1.5b-bf16) the baseline's tokens/s
comes out 0.8-0.9% low on HumanEval, MT-Bench, math and summaries and 5.8% low on translation (its
answers are about 18 tokens), and every speedup as much too high. Each row therefore has both: `speedup` as speed() returns it, and
`speedup_bos_corrected` from speed() given a tokenizer that does prepend the one token speed()
takes off (the tokenizer itself where it already prepends one).

`equal_to_ar` is equal.py's verdict (`get_content` + `txt_compare`: the answer texts compared line
by line, over as many lines as both files have); at T > 0 outputs differ by design.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace

from transformers import AutoTokenizer

from taps.assets import resolve
from taps.records import read_records

# speed()'s tasks (Spec-Bench's get_single_speedup order): MT-Bench's categories together, Spec-Bench's own categories, all rows
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "overall")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")  # as speed() lists them


def load(checkout: Path) -> tuple[ModuleType, ModuleType]:
    """speed.py and equal.py of a Spec-Bench checkout, imported as modules (their __main__ blocks do not run)."""
    modules = []
    for name in ("speed", "equal"):
        path = checkout / "evaluation" / f"{name}.py"
        if not path.is_file():
            sys.exit(f"error: {checkout} is not a Spec-Bench checkout: {path} is missing")
        spec = importlib.util.spec_from_file_location(f"spec_bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1]


class Tokenizers:
    """Stands in for transformers.AutoTokenizer inside speed(): loads each tokenizer once (speed()
    loads it on every call), and with `bos` gives one that prepends a token when the real one
    prepends none, so that speed()'s "minus one for the BOS" takes off that token, not a real one."""

    def __init__(self, bos: bool):
        self.bos = bos

    @cache  # noqa: B019  two instances for the process's lifetime
    def from_pretrained(self, path: str):
        tokenizer = AutoTokenizer.from_pretrained(path)
        if not self.bos or tokenizer("").input_ids:  # it prepends a BOS itself: speed()'s count is right
            return tokenizer
        return lambda text: SimpleNamespace(input_ids=[None, *tokenizer(text).input_ids])


def tasks(rows: list[dict]) -> list[str]:
    """speed()'s tasks that select rows of a set's baseline file, less any that selects the same
    rows as "overall" (HumanEval's one category, "coding", is one of MT-Bench's)."""

    def selected(task):
        return [i for i, r in enumerate(rows)
                if task == "overall" or r["category"] == task or (task == "mt_bench" and r["category"] in MT_BENCH)]

    everything = selected("overall")
    return [t for t in TASKS if selected(t) and (t == "overall" or selected(t) != everything)]


def evaluate(speed_module: ModuleType, equal_module: ModuleType, answers: Path, tokenizer: str) -> list[dict]:
    """One row per (set, temperature, method, task): speed()'s numbers raw and BOS-corrected, and
    equal.py's verdict against ar at that temperature."""
    raw, corrected = Tokenizers(bos=False), Tokenizers(bos=True)
    out = []
    with tempfile.TemporaryDirectory() as scratch:
        for base in sorted(answers.glob("*/ar-t*.jsonl")):
            temperature = base.stem.removeprefix("ar-t")
            rows = [json.loads(line) for line in base.read_text().splitlines() if line.strip()]
            for path in sorted(base.parent.glob(f"*-t{temperature}.jsonl")):
                if path == base:
                    continue
                texts = [Path(scratch) / f"{p.parent.name}-{p.stem}.txt" for p in (path, base)]
                for p, text in zip((path, base), texts):
                    equal_module.get_content(str(p), str(text))
                equal = equal_module.txt_compare(str(texts[0]), str(texts[1]))
                for task in tasks(rows):
                    values = {}
                    for key, loader in (("", raw), ("_bos_corrected", corrected)):
                        speed_module.AutoTokenizer = loader
                        tps, base_tps, ratio, accepted = speed_module.speed(str(path), str(base), tokenizer, task=task,
                                                                            report=False)
                        values.update({f"baseline_tokens_per_second{key}": float(base_tps), f"speedup{key}": float(ratio)})
                    out.append({"set": base.parent.name, "temperature": float(temperature),
                                "method": path.stem.removesuffix(f"-t{temperature}"), "task": task,
                                "tokens_per_second": float(tps), **values,
                                "mean_accepted_tokens": sum(accepted) / len(accepted) if accepted else None,
                                "equal_to_ar": equal})  # fmt: skip
    return out


def records_target(answers: Path) -> str:
    """The target of the records file the answers were written from (`X.answers` <- `X.jsonl`)."""
    records = read_records(answers.with_suffix(".jsonl"))
    if not records:
        sys.exit(f"error: no records in {answers.with_suffix('.jsonl')} to name the target; pass --tokenizer")
    return records[0]["target"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec-bench", type=Path, required=True, help="a checkout of github.com/hemingkx/Spec-Bench")
    parser.add_argument("--answers", type=Path, required=True, help="the answers folder taps bench wrote (<out>.answers)")
    parser.add_argument("--tokenizer", default=None,
                        help="the target's tokenizer: a folder, packaged model name or hub id (default: the records' target)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args()
    if not any(args.answers.glob("*/ar-t*.jsonl")):
        sys.exit(f"error: {args.answers} holds no <set>/ar-t<T>.jsonl: give the .answers folder of a taps bench run with ar")
    speed_module, equal_module = load(args.spec_bench)
    tokenizer = resolve(args.tokenizer or records_target(args.answers))
    rows = evaluate(speed_module, equal_module, args.answers, tokenizer)
    args.out.write_text(json.dumps({"answers": str(args.answers), "tokenizer": Path(tokenizer).name, "rows": rows},
                                   indent=1) + "\n")
    print(f"{len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
