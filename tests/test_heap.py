"""taps.heap: after keep_freed_memory a block the process frees is served again from the same pages (no
page faults on its next first touch); without it glibc hands a block that size back to the system."""

import subprocess
import sys
from pathlib import Path

import pytest

from taps import heap

# malloc, touch every page, free, malloc the same size again, touch again: minor faults of the second touch
PROGRAM = """
import ctypes, ctypes.util, resource, sys
sys.path.insert(0, {src!r})
if {keep}:
    from taps.heap import keep_freed_memory
    assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
def touch():
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    return p
libc.free(ctypes.c_void_p(touch()))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(keep: bool) -> int:
    src = str(Path(heap.__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", PROGRAM.format(src=src, keep=keep)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[-1])


def test_freed_blocks_come_back_on_the_same_pages():
    if not sys.platform.startswith("linux") or not heap.keep_freed_memory():
        pytest.skip("not glibc: keep_freed_memory changes nothing here")
    pages = (64 << 20) // 4096
    assert faults(keep=True) < pages // 100
    assert faults(keep=False) > pages // 2  # negative control: glibc's own thresholds map fresh pages
