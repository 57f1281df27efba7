"""Freed memory kept for the decoding loop's next round (glibc's malloc, Linux CPUs).

Every round makes and frees tens of megabytes of [rows, vocab] tensors: the drafter's logits and
probabilities, the target's logits, the scorer's entropies (4.3 MB each for 7 rows of a 151,936-token
vocabulary in float32). glibc serves a block over its mmap threshold from a fresh mapping, and hands
the top of its heap back to the system once more than its trim threshold is free there; with the
default, self-adjusting thresholds the next round's tensors kept landing on fresh pages, each page
faulting on its first touch. `keep_freed_memory` raises both thresholds once the models are loaded
(after handing back what loading freed, `malloc_trim`), so a round reuses the pages of the round
before: the process keeps up to the peak of one round's temporaries (and of a prompt's prefill)
instead of returning them.

Measured (results/quantized-targets/xeon-amx/heap-ab.py, heap-ab.txt: 4 pairs of processes with and
without, alternating, 3 MT-Bench answers each, the w4a8 1.5B beside its shipped drafter, 2-core Intel
Xeon with AMX): taps:32 1.037x the tokens/s (pairs 1.052, 1.049, 1.024, 0.996), plain decoding 1.037x
(1.105, 1.031, 1.042, 0.964); a taps round took 2,412 page faults against 2,705 (the machine's
neighbours move times between processes, so the pairs scatter). Before, one vocabulary-sized
temporary alone cost 2.45 ms a round (taps.scorer.depth_entropy, which now writes in place).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# glibc's malloc.h: mallopt parameters
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP = 1 << 30  # bytes: blocks under this come from the heap, and up to this much free heap is kept


@functools.cache
def keep_freed_memory() -> bool:
    """Hand back what is free now, then keep what the process frees from here on (up to KEEP) and
    serve blocks under KEEP from the heap; once per process. False where the C library is not glibc
    (macOS, musl): nothing is changed there."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim(0)
    return bool(mallopt(M_TRIM_THRESHOLD, KEEP)) and bool(mallopt(M_MMAP_THRESHOLD, KEEP))
