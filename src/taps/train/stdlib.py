"""The Python standard library on this machine, read with `ast`: its public modules and their
public documented definitions, the raw material of the code and general training prompts
(taps.train.prompts) and of the raw-text sequences (taps.train.data). Nothing is imported or
run; files are parsed only when asked for.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

MAX_PARAGRAPH_CHARS = 800  # longest docstring paragraph used in a prompt
MIN_PARAGRAPH_CHARS = 20
PRUNED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings"}


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


def normalize_space(text: str) -> str:
    """Text with every run of whitespace made one space: the form in which prompts are compared."""
    return " ".join(text.split())


def _first_paragraph(doc: str, name: str = "") -> str:
    """The first docstring paragraph that is not just a signature line, whitespace normalized."""
    for para in inspect.cleandoc(doc).split("\n\n"):
        para = normalize_space(para)
        short = name.rsplit(".", 1)[-1]
        if para and not (short and para.startswith(short + "(")):
            return para
    return ""


def usable_paragraph(paragraph: str) -> bool:
    return MIN_PARAGRAPH_CHARS <= len(paragraph) <= MAX_PARAGRAPH_CHARS


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> str:
    args = node.args
    if drop_first and args.posonlyargs + args.args and (args.posonlyargs + args.args)[0].arg in ("self", "cls"):
        args = ast.arguments(**{f: getattr(args, f) for f in args._fields})
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
    if not usable_paragraph(paragraph):
        return None
    # whole lines from the def/class line (decorators left out); ast.get_source_segment would
    # split the file again for every definition
    source = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])).strip()
    return Definition(module, qualname, kind, signature, paragraph, inspect.cleandoc(doc), source)


@functools.cache
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
