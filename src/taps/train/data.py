"""Training data for the drafter: prompts that are not evaluation prompts, and the target's own
answers to them (self-distillation, method.md section 2: DFlash regenerates every response with
the target, so the drafter learns what the target actually says, not what some dataset says).

Prompt sources (`training_prompts(n, seed)` mixes them; counts measured on Python 3.11.7's
standard library and reasoning-gym 0.1.25, see `source_sizes()`):

  code-write    "Write a Python function `name(args)` that does the following: <first docstring
                paragraph>" (and two rewordings), for every public function, class and public
                method of a public class, with a docstring, in the standard library's own .py
                files on this machine (read with `ast`; tests, private modules and `encodings`
                left out). 5,277 distinct prompts.
  code-explain  "Explain what this Python code does: ```python <source>```" (and two rewordings)
                for the same definitions whose source is 3 lines to MAX_SOURCE_CHARS characters.
                4,578 distinct prompts.
  math          reasoning-gym's gsm_symbolic word problems (GSM8K-style templates, new numbers
                and names) drawn with seeds from RG_SEED_BASE upwards, never the evaluation seed
                `taps.datasets.GSM_SYMBOLIC_SEED` (asserted, and the seed ranges of the items are
                kept disjoint from the evaluation's). Unlimited (new instances per seed); the
                few that still equal one of the first GSM_EVAL_CHECKED evaluation items (a
                template with few free values repeats) are dropped. Note that the evaluation
                uses the same ~100 templates (made from GSM8K test problems), only with other
                numbers and names: use mix={"math": 0, ...} for a drafter that never saw them.
  reasoning     other reasoning-gym tasks (REASONING_TASKS: arithmetic, counting, sorting, dates,
                logic, ...), round-robin. Unlimited.
  general       instructions from templates over the standard library's public module names
                ("Summarize what the Python module `json` is for", "Give three tips for using
                ...") and texts from its docstrings (summarize, translate into German/French/
                Spanish, rewrite in plain English). 2,556 distinct prompts.

None of them come from an evaluation set (HumanEval, MT-Bench, Spec-Bench, GSM-Symbolic with
the evaluation seed); `check_no_eval_overlap` checks it by text, and `generate_data` runs it.

The prompt list is deterministic for a given seed, Python version and reasoning-gym version, and
PREFIX-STABLE: `training_prompts(n, seed)` is the first n of `training_prompts(m, seed)` for
every m > n. That is what makes `generate_data` resumable with a larger n.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import random
import sysconfig
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from taps.datasets import GSM_SYMBOLIC_SEED
from taps.train.settings import check_pinned

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SOURCES = ("code-write", "code-explain", "math", "reasoning", "general")
DEFAULT_MIX = {"code-write": 0.25, "code-explain": 0.15, "math": 0.2, "reasoning": 0.1, "general": 0.3}
REASONING_TASKS = (
    "basic_arithmetic", "chain_sum", "leg_counting", "word_sorting", "letter_counting", "family_relationships",
    "calendar_arithmetic", "time_intervals", "syllogism", "simple_equations", "number_sorting",
    "word_sequence_reversal", "spell_backward",
)  # fmt: skip
RG_SEED_BASE = 1_000_000  # reasoning-gym seeds of training data start here (evaluation: GSM_SYMBOLIC_SEED = 1234)
RG_SEED_STRIDE = 1_000_000  # seed ranges per training seed: items of seed s use RG_SEED_BASE + s * stride + 0..stride-1
GSM_EVAL_RESERVED = 100_000  # reasoning-gym item i of the evaluation uses Random(GSM_SYMBOLIC_SEED + i): keep clear of it
RG_CHUNK = 256  # reasoning-gym items made per create_dataset call
FILES_PER_CHUNK = 16  # stdlib files whose definitions are shuffled together (the stream parses lazily)
MAX_SOURCE_CHARS = 2000  # longest definition quoted in an explain prompt
MAX_PARAGRAPH_CHARS = 800  # longest docstring paragraph used in a prompt
MAX_DOC_CHARS = 3000  # longest docstring given to summarize
MIN_PARAGRAPH_CHARS = 20
PRUNED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings"}
# Spec-Bench's questions are not packaged: $TAPS_SPEC_BENCH, else the workspace's shared copy
DEFAULT_SPEC_BENCH = Path(os.environ.get("TAPS_SPEC_BENCH")
                          or Path(__file__).resolve().parents[4] / "shared" / "data" / "spec_bench" / "question.jsonl")
GSM_EVAL_CHECKED = 1000  # evaluation GSM-Symbolic items compared by text (later ones: by the seed ranges)

WRITE_TEMPLATES = (
    "Write a Python {kind} `{signature}` that does the following: {paragraph}",
    "Implement the Python {kind} `{signature}`. Its documentation says: \"{paragraph}\"",
    "In Python, write `{signature}`. Requirements: {paragraph} Include a short usage example.",
)
EXPLAIN_TEMPLATES = (
    "Explain what this Python code does:\n\n```python\n{source}\n```",
    "What does the following Python code do? Walk through it step by step.\n\n```python\n{source}\n```",
    "Review this Python code: explain its purpose and suggest one improvement.\n\n```python\n{source}\n```",
)
MODULE_TEMPLATES = (
    "Summarize what the Python module `{module}` is for.",
    "Give three tips for using the Python module `{module}`.",
    "Write a short tutorial, with a code example, on the Python standard library module `{module}`.",
    "What are common mistakes when using `{module}` in Python, and how can they be avoided?",
    "When should a Python programmer use the `{module}` module, and when is something else a better choice?",
)
TEXT_TEMPLATES = (  # over a docstring paragraph ({paragraph}) or a whole docstring ({doc})
    "Summarize the following text in two sentences:\n\n{doc}",
    "Translate the following text into German:\n\n{paragraph}",
    "Translate the following text into French:\n\n{paragraph}",
    "Translate the following text into Spanish:\n\n{paragraph}",
    "Rewrite the following technical description in plain English for someone who does not program:\n\n{paragraph}",
)


# ---------------------------------------------------------------------------------------------
# The standard library, read with ast
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Definition:
    """A public function, class or method with a docstring, in a stdlib module."""

    module: str  # dotted module name
    name: str  # "func", "Class" or "Class.method"
    kind: str  # "function", "class" or "method"
    signature: str  # "name(args)" as written (self/cls dropped)
    paragraph: str  # first docstring paragraph, whitespace normalized
    doc: str  # the whole docstring, cleaned
    source: str  # the definition's source, dedented


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    paragraph: str  # first docstring paragraph ("" if none)
    doc: str  # whole module docstring ("" if none)
    definitions: tuple[Definition, ...]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=1)
def stdlib_files() -> tuple[Path, ...]:
    """The standard library's public .py files, sorted: no tests, private modules, site-packages,
    `encodings` codecs or build folders."""
    root = stdlib_root()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in PRUNED_DIRS and not d.startswith(("_", ".")) and "-" not in d)
        for f in files:
            if f.endswith(".py") and (f == "__init__.py" or not f.startswith("_")) and "-" not in f:
                found.append(Path(folder) / f)
    return tuple(sorted(found))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(stdlib_root()).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _clean(text: str) -> str:
    return " ".join(text.split())


def _first_paragraph(doc: str, name: str = "") -> str:
    """The first docstring paragraph that is not just a signature line, whitespace normalized."""
    for para in inspect.cleandoc(doc).split("\n\n"):
        para = _clean(para)
        short = name.rsplit(".", 1)[-1]
        if para and not (short and para.startswith(short + "(")):
            return para
    return ""


def _usable(paragraph: str) -> bool:
    return MIN_PARAGRAPH_CHARS <= len(paragraph) <= MAX_PARAGRAPH_CHARS


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> str:
    args = node.args
    if drop_first and args.posonlyargs + args.args and (args.posonlyargs + args.args)[0].arg in ("self", "cls"):
        args = ast.arguments(**{**{f: getattr(args, f) for f in args._fields}})
        if args.posonlyargs:
            args.posonlyargs = args.posonlyargs[1:]
        else:
            args.args = args.args[1:]
        n_pos = len(args.posonlyargs) + len(args.args)
        args.defaults = args.defaults[-n_pos:] if n_pos else []
    return f"{node.name}({ast.unparse(args)})"


def _definition(module: str, lines: list[str], node, qualname: str, kind: str, signature: str) -> Definition | None:
    doc = ast.get_docstring(node)
    if not doc:
        return None
    paragraph = _first_paragraph(doc, qualname)
    if not _usable(paragraph):
        return None
    # whole lines from the def/class line (decorators left out); ast.get_source_segment would
    # split the file again for every definition
    source = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])).strip()
    return Definition(module, qualname, kind, signature, paragraph, inspect.cleandoc(doc), source)


@functools.lru_cache(maxsize=None)
def scan_module(path: Path) -> ModuleInfo | None:
    """A stdlib file's docstring and its public documented definitions (None if unreadable)."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    module = _module_name(path)
    lines = text.splitlines(keepends=True)
    defs: list[Definition | None] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            d = _definition(module, lines, node, node.name, "function", _signature(node, False))
            defs.append(d)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            signature = _signature(init, True).replace("__init__", node.name, 1) if init else node.name
            defs.append(_definition(module, lines, node, node.name, "class", signature))
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                    sig = _signature(sub, True)
                    defs.append(_definition(module, lines, sub, f"{node.name}.{sub.name}", "method", f"{node.name}.{sig}"))
    doc = ast.get_docstring(tree) or ""
    return ModuleInfo(module, _first_paragraph(doc) if doc else "", inspect.cleandoc(doc) if doc else "",
                      tuple(d for d in defs if d is not None))


# ---------------------------------------------------------------------------------------------
# Prompt streams (each deterministic, lazily produced)
# ---------------------------------------------------------------------------------------------


def _file_chunks(seed: int, stream: str) -> Iterator[list[ModuleInfo]]:
    """Stdlib modules in a seeded order, FILES_PER_CHUNK at a time (parsed only when reached)."""
    files = list(stdlib_files())
    random.Random(f"{seed}:{stream}:files").shuffle(files)
    for start in range(0, len(files), FILES_PER_CHUNK):
        yield [m for m in (scan_module(f) for f in files[start : start + FILES_PER_CHUNK]) if m is not None]


def _code_write(seed: int) -> Iterator[str]:
    rng = random.Random(f"{seed}:code-write")
    for chunk in _file_chunks(seed, "code-write"):
        defs = [d for m in chunk for d in m.definitions]
        rng.shuffle(defs)
        for d in defs:
            yield rng.choice(WRITE_TEMPLATES).format(kind=d.kind, signature=d.signature, paragraph=d.paragraph)


def _code_explain(seed: int) -> Iterator[str]:
    rng = random.Random(f"{seed}:code-explain")
    for chunk in _file_chunks(seed, "code-explain"):
        defs = [d for m in chunk for d in m.definitions if d.source.count("\n") >= 2 and len(d.source) <= MAX_SOURCE_CHARS]
        rng.shuffle(defs)
        for d in defs:
            yield rng.choice(EXPLAIN_TEMPLATES).format(source=d.source)


def _general(seed: int) -> Iterator[str]:
    rng = random.Random(f"{seed}:general")
    for chunk in _file_chunks(seed, "general"):
        prompts = []
        for m in chunk:
            if _usable(m.paragraph):
                prompts += [t.format(module=m.name) for t in MODULE_TEMPLATES]
            texts = [(m.paragraph, m.doc)] + [(d.paragraph, d.doc) for d in m.definitions if len(d.doc) >= 300]
            for paragraph, doc in texts:
                if not _usable(paragraph) or len(paragraph) < 60:
                    continue
                template = rng.choice(TEXT_TEMPLATES)
                if "{doc}" in template and not 200 <= len(doc) <= MAX_DOC_CHARS:
                    template = TEXT_TEMPLATES[1 + rng.randrange(len(TEXT_TEMPLATES) - 1)]
                prompts.append(template.format(paragraph=paragraph, doc=doc))
        rng.shuffle(prompts)
        yield from prompts


def rg_seed(seed: int, chunk: int) -> int:
    """reasoning-gym seed of a training chunk: items use Random(rg_seed + i), i < RG_CHUNK."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if (chunk + 1) * RG_CHUNK > RG_SEED_STRIDE:
        raise ValueError("reasoning-gym stream exhausted for this seed")
    return RG_SEED_BASE + seed * RG_SEED_STRIDE + chunk * RG_CHUNK


def _rg_stream(task: str, seed: int) -> Iterator[str]:
    import reasoning_gym

    chunk = 0
    while True:
        s = rg_seed(seed, chunk)
        if task == "gsm_symbolic":
            # items use Random(s + i): never the evaluation seed, never its items' seeds
            assert s != GSM_SYMBOLIC_SEED
            assert s + RG_CHUNK <= GSM_SYMBOLIC_SEED or s >= GSM_SYMBOLIC_SEED + GSM_EVAL_RESERVED
        for item in reasoning_gym.create_dataset(task, size=RG_CHUNK, seed=s):
            yield item["question"]
        chunk += 1


@functools.lru_cache(maxsize=1)
def _gsm_eval_questions() -> frozenset[str]:
    """The first GSM_EVAL_CHECKED evaluation items (seed GSM_SYMBOLIC_SEED), whitespace normalized."""
    import reasoning_gym

    data = reasoning_gym.create_dataset("gsm_symbolic", size=GSM_EVAL_CHECKED, seed=GSM_SYMBOLIC_SEED)
    return frozenset(_clean(item["question"]) for item in data)


def _math(seed: int) -> Iterator[str]:
    # Disjoint seeds do not make disjoint questions: a template with few free values gives the
    # same text under many seeds (about 1 in 300 training items equals an evaluation item).
    # Those are dropped here; check_no_eval_overlap would refuse them.
    evaluation = _gsm_eval_questions()
    return (q for q in _rg_stream("gsm_symbolic", seed) if _clean(q) not in evaluation)


def _reasoning(seed: int) -> Iterator[str]:
    from reasoning_gym.factory import DATASETS

    missing = [t for t in REASONING_TASKS if t not in DATASETS]
    assert not missing, f"reasoning-gym lacks tasks {missing}"
    streams = [_rg_stream(t, seed) for t in REASONING_TASKS]
    while True:
        for s in streams:
            yield next(s)


STREAMS = {"code-write": _code_write, "code-explain": _code_explain, "math": _math, "reasoning": _reasoning,
           "general": _general}


@dataclass(frozen=True)
class TrainingPrompt:
    source: str  # one of SOURCES
    text: str


def training_prompt_records(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[TrainingPrompt]:
    """The first n prompts of the seeded mix, with their sources (see the module docstring).

    Each position draws a source by the mix weights (a source that runs out leaves the draw);
    each source yields its prompts in its own seeded order; exact duplicates are dropped. So the
    list is a prefix of the list for any larger n."""
    mix = dict(DEFAULT_MIX if mix is None else mix)
    unknown = set(mix) - set(SOURCES)
    if unknown or any(w < 0 for w in mix.values()) or not any(w > 0 for w in mix.values()):
        raise ValueError(f"mix must give non-negative weights to some of {SOURCES}, got {mix}")
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be >= 0, got n={n}, seed={seed}")
    streams = {name: STREAMS[name](seed) for name, w in mix.items() if w > 0}
    rng = random.Random(f"{seed}:mix")
    seen: set[str] = set()
    out: list[TrainingPrompt] = []
    while len(out) < n and streams:
        names = sorted(streams)
        name = rng.choices(names, weights=[mix[k] for k in names])[0]
        try:
            text = next(streams[name])
        except StopIteration:
            del streams[name]
            continue
        key = _clean(text)
        if key not in seen:
            seen.add(key)
            out.append(TrainingPrompt(name, text))
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct training prompts are available with mix {mix}")
    return out


def training_prompts(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[str]:
    """The first n training prompts of the seeded mix (texts only); prefix-stable in n."""
    return [p.text for p in training_prompt_records(n, seed, mix)]


def source_sizes(seed: int = 0, finite_only: bool = True) -> dict[str, int | None]:
    """Distinct prompts each stdlib source can give (parses the whole stdlib: a few seconds);
    the reasoning-gym sources are unlimited (None)."""
    sizes: dict[str, int | None] = {}
    for name in SOURCES:
        if name in ("math", "reasoning"):
            sizes[name] = None
        else:
            sizes[name] = len({_clean(t) for t in STREAMS[name](seed)})
    return sizes


# ---------------------------------------------------------------------------------------------
# The guard: no evaluation prompt inside a training prompt
# ---------------------------------------------------------------------------------------------


class EvalOverlapError(ValueError):
    """A training prompt equals or contains an evaluation prompt."""


def _needles(text: str) -> list[str]:
    """A prompt text, and each fenced code block in it on its own (HumanEval's code without the
    instruction around it), whitespace normalized."""
    out = [_clean(text)]
    parts = text.split("```")
    for block in parts[1:-1:2]:  # inside the fences
        code = block.split("\n", 1)[1] if block.startswith(("python\n", "py\n")) else block
        if len(_clean(code)) >= MIN_PARAGRAPH_CHARS:
            out.append(_clean(code))
    return [s for s in out if s]


def eval_prompt_texts(spec_bench: str | os.PathLike | None = DEFAULT_SPEC_BENCH,
                      gsm_symbolic: int = GSM_EVAL_CHECKED) -> dict[str, list[str]]:
    """The user turns of the evaluation sets, through taps.datasets: HumanEval, MT-Bench,
    Spec-Bench (when its file exists) and the first `gsm_symbolic` GSM-Symbolic evaluation items."""
    from taps.datasets import load_prompts

    sets = {"humaneval": load_prompts("humaneval"), "mt-bench": load_prompts("mt-bench")}
    if spec_bench is not None and Path(spec_bench).is_file():
        sets["spec-bench"] = load_prompts("spec-bench", path=str(spec_bench))
    elif spec_bench is not None:
        warnings.warn(f"Spec-Bench file {spec_bench} not found (set TAPS_SPEC_BENCH): not checked against it",
                      stacklevel=2)
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
        p = _clean(prompt)
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


def check_no_eval_overlap(prompts: Sequence[str], spec_bench: str | os.PathLike | None = DEFAULT_SPEC_BENCH,
                          gsm_symbolic: int = GSM_EVAL_CHECKED) -> None:
    """Raise EvalOverlapError if a training prompt equals or contains an evaluation prompt."""
    hits = find_eval_overlap(prompts, eval_prompt_texts(spec_bench, gsm_symbolic))
    if hits:
        i, name, needle = hits[0]
        raise EvalOverlapError(
            f"{len(hits)} training prompts contain evaluation prompts; first: prompt {i} contains "
            f"{name}'s {needle[:120]!r}"
        )


# ---------------------------------------------------------------------------------------------
# The JSONL file: resumable append
# ---------------------------------------------------------------------------------------------


def read_records(path: str | os.PathLike, repair: bool = False) -> list[dict]:
    """The whole records of a JSONL file. A torn last line (a write cut short) is skipped, and
    with repair=True cut off the file so that appending continues cleanly. A bad line elsewhere
    is an error."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records, good_end, pos = [], 0, 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            record = ...
        if record is ... or (end < 0 and line.strip()):  # torn: unparsable, or no newline yet
            if end >= 0 and data[end + 1 :].strip():
                raise ValueError(f"{path}: unreadable record at byte {pos} (not the last line)")
            break
        if record is not None:
            records.append(record)
        pos = good_end = end + 1 if end >= 0 else len(data)
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return records


def append_records(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Append records, one JSON line each, and make them durable (flush + fsync)."""
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# Self-distillation
# ---------------------------------------------------------------------------------------------


def chat_ids(tokenizer: "PreTrainedTokenizerBase", prompt: str) -> list[int]:
    """The prompt as a user turn through the chat template, ready for the answer."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def generate_batch(model: "PreTrainedModel", batch: Sequence[Sequence[int]], pad_id: int, eos_ids: set[int],
                   max_new_tokens: int) -> list[list[int]]:
    """Greedy responses to a batch of prompt ids, left-padded into one `generate` call. Each
    response is cut after its first eos (kept: the drafter learns where answers end), so no
    padding is ever returned."""
    import torch
    from transformers import GenerationConfig

    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in batch])  # [B, width]
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])  # [B, width]
    # a clean config: plain greedy, whatever sampling or penalties the model's own config sets
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                              eos_token_id=sorted(eos_ids) or None)
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=mask, generation_config=config)  # [B, width + T]
    responses = []
    for row in out[:, width:].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in eos_ids), len(row))
        responses.append(row[:cut])
    return responses


@dataclass(frozen=True)
class GenDataResult:
    path: Path
    n_prompts: int  # records for prompt indices < n_prompts now in the file
    generated: int  # of them, generated by this call
    tokens: int  # total ids of those records


def _meta_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".meta.json")


def generate_data(target_name: str, out_path: str | os.PathLike, n_prompts: int, max_new_tokens: int = 256,
                  batch_size: int = 8, dtype: str = "float32", seed: int = 0, progress: bool = True, *,
                  model: "PreTrainedModel | None" = None, tokenizer: "PreTrainedTokenizerBase | None" = None,
                  check_overlap: bool = True, mix: dict[str, float] | None = None) -> GenDataResult:
    """Self-distillation data: the target's greedy answers to the first n_prompts training prompts,
    appended to out_path as {"prompt_index", "source", "prompt", "ids": prompt ids + response ids,
    "n_prompt"} lines, fsynced per batch. Rerunning resumes: prompts already answered are
    skipped (a torn last line is cut off first); a larger n_prompts adds the next prompts.

    The settings that shape the data (target, seed, mix, max_new_tokens, dtype) are kept in
    `<out_path>.meta.json`; resuming with others is an error. `model`/`tokenizer` replace loading
    `target_name` (tests, notebooks)."""
    import torch
    from tqdm import tqdm

    from taps.assets import DTYPES

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if n_prompts < 0 or max_new_tokens < 1 or batch_size < 1:
        raise ValueError("n_prompts must be >= 0, max_new_tokens and batch_size >= 1")
    out_path = Path(out_path)
    meta = {"target": target_name, "seed": seed, "mix": dict(DEFAULT_MIX if mix is None else mix),
            "max_new_tokens": max_new_tokens, "dtype": dtype}
    meta_path = _meta_path(out_path)
    check_pinned(meta_path, meta, f"{out_path} was generated", "use them or choose a new file")
    prompts = training_prompt_records(n_prompts, seed, mix)
    records = read_records(out_path, repair=True)
    done = set()
    for r in records:
        i = r.get("prompt_index")
        if i is None:
            continue  # another kind of record (e.g. stdlib text)
        if i < n_prompts and r.get("prompt") != prompts[i].text:
            raise ValueError(f"{out_path}: record of prompt {i} holds another prompt than seed {seed} gives; "
                             "it was made with other settings (or another Python/reasoning-gym version)")
        done.add(i)
    pending = [i for i in range(n_prompts) if i not in done]
    if not pending:
        return GenDataResult(out_path, n_prompts, 0, sum(len(r["ids"]) for r in records
                                                         if r.get("prompt_index", n_prompts) < n_prompts))
    if check_overlap:
        check_no_eval_overlap([p.text for p in prompts])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not meta_path.exists():
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")

    if model is None or tokenizer is None:
        from taps.assets import load_model

        model, tokenizer = load_model(target_name, dtype=DTYPES[dtype])
    model = model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos_ids = _eos_ids(model, tokenizer)
    prompt_ids = {i: chat_ids(tokenizer, prompts[i].text) for i in pending}
    # batches of similar length (less padding), within windows so that the file grows in order
    window = 16 * batch_size
    batches = []
    for start in range(0, len(pending), window):
        part = sorted(pending[start : start + window], key=lambda i: (len(prompt_ids[i]), i))
        batches += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    torch.set_flush_denormal(True)
    generated = tokens = 0
    bar = tqdm(total=n_prompts, initial=n_prompts - len(pending), disable=not progress, desc="gen-data", unit="prompt")
    for batch in batches:
        responses = generate_batch(model, [prompt_ids[i] for i in batch], tokenizer.pad_token_id, eos_ids,
                                   max_new_tokens)
        new = [{"prompt_index": i, "source": prompts[i].source, "prompt": prompts[i].text,
                "ids": prompt_ids[i] + resp, "n_prompt": len(prompt_ids[i])} for i, resp in zip(batch, responses)]
        append_records(out_path, new)
        generated += len(new)
        tokens += sum(len(r["ids"]) for r in new)
        bar.update(len(new))
    bar.close()
    tokens += sum(len(r["ids"]) for r in records if r.get("prompt_index", n_prompts) < n_prompts)
    return GenDataResult(out_path, n_prompts, generated, tokens)


# ---------------------------------------------------------------------------------------------
# An optional raw-text mix: stdlib source code
# ---------------------------------------------------------------------------------------------


def stdlib_text_sequences(tokenizer: "PreTrainedTokenizerBase", n_tokens: int, seq_len: int,
                          seed: int = 0) -> list[list[int]]:
    """Raw standard-library source, tokenized (files in a seeded order, each followed by eos),
    cut into sequences of seq_len tokens until n_tokens are collected (the last may be shorter)."""
    if n_tokens < 1 or seq_len < 2:
        raise ValueError("n_tokens must be >= 1 and seq_len >= 2")
    files = list(stdlib_files())
    random.Random(f"{seed}:text").shuffle(files)
    sep = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    for f in files:
        if len(stream) >= n_tokens:
            break
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + sep
    stream = stream[:n_tokens]
    return [stream[i : i + seq_len] for i in range(0, len(stream), seq_len) if len(stream[i : i + seq_len]) >= 2]


def append_text_sequences(out_path: str | os.PathLike, tokenizer: "PreTrainedTokenizerBase", n_tokens: int,
                          seq_len: int, seed: int = 0) -> int:
    """Add stdlib text records {"text_index", "source": "stdlib-text", "ids"} to a data file,
    once: records already there are kept and only the missing ones appended. Returns how many
    were appended."""
    have = {r["text_index"] for r in read_records(out_path, repair=True) if "text_index" in r}
    sequences = stdlib_text_sequences(tokenizer, n_tokens, seq_len, seed)
    new = [{"text_index": i, "source": "stdlib-text", "ids": s} for i, s in enumerate(sequences) if i not in have]
    if new:
        append_records(out_path, new)
    return len(new)
