"""Every example in README.md runs, as a reader would run it: each ```python block in a fresh
interpreter, each ```bash block command by command through the installed `taps` script.

A block is an example to run unless the line before its fence is `<!-- not run: REASON -->`
(the 1.5B model, a server, hours of training). A ```bash block that runs holds only `taps ...`
commands, so what a reader copies is exactly what was run. The examples use SmolLM2-135M and a
few new tokens, so they double as tests; together they take minutes on a busy 2-core machine,
hence `slow`. The parsing checks are fast and run in the lean set: a README whose examples were
all marked away, or a bash example that is not a taps command, fails there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SRC = Path(__file__).resolve().parents[1] / "src"
RUN_LANGUAGES = ("python", "bash")  # the fences this test runs; any other tag (sh, text, ...) is shown only
MIN_RUNNABLE = 3  # the CLI block, the Python tour and the loaded-model check
TIMEOUT_S = 600  # per block: a SmolLM2 load and 16-24 tokens, on a CPU shared with other work
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.*\S) -->")
FENCE = re.compile(r"```(?P<lang>\S*)\s*")
LINK = re.compile(r"\]\((?!https?://|#)([^)\s]+)\)")  # a markdown link to a path in the repository


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence, for messages
    skip: str | None  # why it is not run (from its marker), or None: it runs

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGUAGES and self.skip is None

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, in order, with their not-run markers."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        opening = FENCE.fullmatch(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{i + 1}: a code fence is never closed")
        marker = NOT_RUN.fullmatch(lines[i - 1].strip()) if i > 0 else None
        out.append(Block(opening["lang"], "\n".join(lines[i + 1:end]), i + 1, marker and marker["reason"]))
        i = end + 1
    return out


def commands(code: str) -> list[list[str]]:
    """A shell block's commands as argument lists: backslash continuations joined, comments and
    blank lines dropped, quoting as the shell reads it."""
    joined = re.sub(r"\\\n", " ", code)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


README_BLOCKS = blocks(README.read_text())
RUNNABLE = [b for b in README_BLOCKS if b.runs]


def test_the_readme_has_runnable_examples_and_every_marker_says_why():
    assert len(RUNNABLE) >= MIN_RUNNABLE, f"only {len(RUNNABLE)} runnable examples in README.md"
    assert {b.lang for b in RUNNABLE} == set(RUN_LANGUAGES)
    malformed = [line for line in README.read_text().splitlines()
                 if "<!-- not run" in line and not NOT_RUN.fullmatch(line.strip())]
    assert not malformed, f"write a marker as `<!-- not run: REASON -->`: {malformed}"
    marked = [b for b in README_BLOCKS if b.skip is not None]
    assert all(b.lang in RUN_LANGUAGES for b in marked), "a not-run marker sits on a block that is never run anyway"


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.lang == "bash"], ids=str)
def test_a_bash_example_holds_only_taps_commands(block):
    argvs = commands(block.code)
    assert argvs, f"{block}: no command"
    for argv in argvs:
        assert argv[0] == "taps", f"{block}: {shlex.join(argv)!r} is not a taps command; mark the block not run"


def test_the_relative_links_of_the_readme_and_docs_resolve():
    pages = [README, *sorted((README.parent / "docs").glob("*.md"))]
    missing = [f"{page.name}: {target}" for page in pages for target in LINK.findall(page.read_text())
               if not (page.parent / target.split("#")[0]).exists()]
    assert not missing, missing


def test_the_parser_reads_markers_continuations_and_quotes():
    text = ("x\n<!-- not run: needs a GPU -->\n```python\nprint(1)\n```\n"
            "```bash\ntaps a \\\n  --b 'c d'  # note\n\n```\n")
    first, second = blocks(text)
    assert (first.lang, first.skip, first.line, second.skip) == ("python", "needs a GPU", 3, None)
    assert commands(second.code) == [["taps", "a", "--b", "c d"]]
    with pytest.raises(ValueError, match="never closed"):
        blocks("```python\nprint(1)\n")


def _environment() -> dict[str, str]:
    # the checkout's code, one torch thread (two threads on a shared 2-core CPU run tiny forwards
    # far slower), no tokenizer worker pools
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path,
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(argv: list[str], block: Block, cwd: Path) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, env=_environment(), capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)  # the status is checked below, with the output
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block}: {shlex.join(argv)[:200]} ran past {TIMEOUT_S} s")
    assert done.returncode == 0, (f"{block}: {shlex.join(argv)[:200]} exited {done.returncode}\n"
                                  f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_the_readme_example_runs(block, tmp_path):
    if block.lang == "python":
        _run([sys.executable, "-c", block.code], block, tmp_path)
        return
    taps = Path(sys.executable).with_name("taps")  # the console script `pip install` made
    for argv in commands(block.code):
        out = _run([str(taps), *argv[1:]], block, tmp_path)
        assert out.strip(), f"{block}: {shlex.join(argv)[:200]} printed nothing"
