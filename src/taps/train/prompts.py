"""Training prompts for the drafter: a seeded, deterministic mix of prompts that are not
evaluation prompts, which the target then answers (taps.train.data).

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
                few that still equal one of the first overlap.GSM_EVAL_CHECKED evaluation items (a
                template with few free values repeats) are dropped. Note that the evaluation
                uses the same ~100 templates (made from GSM8K test problems), only with other
                numbers and names: use mix={"math": 0, ...} for a drafter that never saw them.
  reasoning     other reasoning-gym tasks (REASONING_TASKS: arithmetic, counting, sorting, dates,
                logic, ...), round-robin. Unlimited.
  general       instructions from templates over the standard library's public module names
                ("Summarize what the Python module `json` is for", "Give three tips for using
                ...") and texts from its docstrings (summarize, translate into German/French/
                Spanish, rewrite in plain English). 2,556 distinct prompts.
  chat          open-domain requests (writing, role-play, explanations, comparisons, extraction
                from a given list) from templates over word lists (taps.train.chat). Not in
                DEFAULT_MIX, so files made with the default keep their prompts; ask for it with
                a mix (`taps gen-data --mix chat=1`). 7,300 distinct prompts, then extraction
                prompts without end.

None of them come from an evaluation set (HumanEval, MT-Bench, Spec-Bench, GSM-Symbolic with
the evaluation seed); taps.train.overlap checks it by text, and `generate_data` runs that check.

The prompt list is deterministic for a given seed, Python version and reasoning-gym version, and
PREFIX-STABLE: `training_prompts(n, seed)` is the first n of `training_prompts(m, seed)` for
every m > n. That is what makes `generate_data` resumable with a larger n.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from taps.datasets import GSM_SYMBOLIC_SEED
from taps.train import overlap
from taps.train.chat import chat_prompts
from taps.train.stdlib import ModuleInfo, normalize_space, scan_module, stdlib_files, usable_paragraph

SOURCES = ("code-write", "code-explain", "math", "reasoning", "general", "chat")
# chat came later: adding it here would change the prompts of every file made with the default
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
MAX_DOC_CHARS = 3000  # longest docstring given to summarize

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
            if usable_paragraph(m.paragraph):
                prompts += [t.format(module=m.name) for t in MODULE_TEMPLATES]
            texts = [(m.paragraph, m.doc)] + [(d.paragraph, d.doc) for d in m.definitions if len(d.doc) >= 300]
            for paragraph, doc in texts:
                if not usable_paragraph(paragraph) or len(paragraph) < 60:
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


def _math(seed: int) -> Iterator[str]:
    # Disjoint seeds do not make disjoint questions: a template with few free values gives the
    # same text under many seeds (about 1 in 300 training items equals an evaluation item).
    # Those are dropped here; check_no_eval_overlap would refuse them.
    evaluation = overlap.gsm_eval_questions()
    return (q for q in _rg_stream("gsm_symbolic", seed) if normalize_space(q) not in evaluation)


def _reasoning(seed: int) -> Iterator[str]:
    from reasoning_gym.factory import DATASETS

    missing = [t for t in REASONING_TASKS if t not in DATASETS]
    assert not missing, f"reasoning-gym lacks tasks {missing}"
    streams = [_rg_stream(t, seed) for t in REASONING_TASKS]
    while True:
        for s in streams:
            yield next(s)


STREAMS = {"code-write": _code_write, "code-explain": _code_explain, "math": _math, "reasoning": _reasoning,
           "general": _general, "chat": chat_prompts}


@dataclass(frozen=True)
class TrainingPrompt:
    source: str  # one of SOURCES, or taps.train.followup.SOURCE
    text: str  # the user turn to answer
    history: tuple[dict, ...] = ()  # earlier turns, as chat messages (a follow-up's first turn)


def check_mix(mix: dict[str, float]) -> dict[str, float]:
    """A copy of `mix` once its sources are known, its weights >= 0 and one of them above 0."""
    for name, weight in mix.items():
        if name not in SOURCES:
            raise ValueError(f"unknown prompt source {name!r}: use {', '.join(SOURCES)}")
        if not weight >= 0:  # NaN fails too
            raise ValueError(f"{name}={weight}: a weight must be >= 0")
    if not any(w > 0 for w in mix.values()):
        raise ValueError("the mix gives no source a weight above 0")
    return dict(mix)


def parse_mix(text: str) -> dict[str, float]:
    """`chat=1,math=0.5` -> {"chat": 1.0, "math": 0.5}, checked by `check_mix`."""
    mix = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        try:
            mix[name.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"{part!r} has no weight: write SOURCE=WEIGHT, e.g. chat=1") from None
    return check_mix(mix)


def training_prompt_records(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[TrainingPrompt]:
    """The first n prompts of the seeded mix, with their sources (see the module docstring).

    Each position draws a source by the mix weights (a source that runs out leaves the draw);
    each source yields its prompts in its own seeded order; exact duplicates are dropped. So the
    list is a prefix of the list for any larger n."""
    mix = check_mix(DEFAULT_MIX if mix is None else mix)
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
        key = normalize_space(text)
        if key not in seen:
            seen.add(key)
            out.append(TrainingPrompt(name, text))
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct training prompts are available with mix {mix}")
    return out


def training_prompts(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[str]:
    """The first n training prompts of the seeded mix (texts only); prefix-stable in n."""
    return [p.text for p in training_prompt_records(n, seed, mix)]


def source_sizes(seed: int = 0) -> dict[str, int | None]:
    """Distinct prompts each stdlib source can give (parses the whole stdlib: a few seconds);
    the reasoning-gym sources are unlimited (None)."""
    sizes: dict[str, int | None] = {}
    for name in SOURCES:
        if name in ("math", "reasoning", "chat"):  # chat: taps.train.chat.chat_sizes() counts its kinds
            sizes[name] = None
        else:
            sizes[name] = len({normalize_space(t) for t in STREAMS[name](seed)})
    return sizes
