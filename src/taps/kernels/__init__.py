"""taps' C++ kernels (the .cpp files here), each built at first use by `torch.utils.cpp_extension` (a C++
compiler and ninja; seconds on 2 cores), then loaded from its cache (TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions), where a build's name keeps its instruction set apart."""

from __future__ import annotations

from pathlib import Path


def build(name: str, source: str, flags: list[str]) -> str | None:
    """Build (once per machine) and load the kernel in `source` (a file here) as extension `name`, compiled
    with `flags`: None when it runs here, else why not."""
    from torch.utils.cpp_extension import load

    try:
        load(name=name, sources=[str(Path(__file__).with_name(source))], is_python_module=False,
             extra_cflags=["-O3", *flags, "-fopenmp"], extra_ldflags=["-fopenmp"])
    except (RuntimeError, OSError) as error:  # no compiler, no ninja, a failed build
        return f"its build failed ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    return None
