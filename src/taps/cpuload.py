"""How much of the machine other processes took while a benchmark run was timed.

Why: a timed run shares the CPU with whatever else runs, and on a small machine the damage is
far larger than the other process's share. Two jobs that each start one thread per core
oversubscribe the cores, and every parallel operation then waits for its preempted thread: on a
2-core Intel Xeon, a w8a8 1.5B draft took 3.2 s instead of 65 ms beside a drafter training run
(session 39), and the training itself slowed 4x. Such a run's time says nothing about the
method, yet nothing in the record showed it. `OthersCpu` measures it from the operating system's
own counters, so every benchmark record and latency profile says how quiet its machine was
(`others_cpu`), the benchmark and `taps profile` warn as they go, `taps report` counts the
suspect runs, and loading a profile measured on a busy machine warns.

others' share = (machine's busy CPU time - this process's, children included) / (wall time x
logical CPUs), over the block: 0 on a quiet machine, 1 when other processes kept every CPU busy.
Busy time is user + nice + system + irq + softirq + steal (another guest of the hypervisor);
psutil reads it (/proc/stat on Linux, whose counters tick every 10 ms: a block of a second reads
to about 0.01, one of a millisecond to nothing useful). The share is None for a block shorter than
MIN_SECONDS and where the system's times cannot be read.

What it cannot see: a virtual machine's host slowing every CPU without taking CPU time from it
(other guests' memory traffic, a lower clock). In session 39 the same machine decoded a llama.cpp
token in 67.5 ms, then an hour later in 115 ms with nothing else running and no steal time
counted. Only runs interleaved in one file, under the same host, compare (taps.bench).
"""

from __future__ import annotations

import time

import psutil

BUSY = 0.1  # others' share above which a timed run is suspect: warn, and count it in reports
MIN_SECONDS = 0.5  # shorter blocks get no share: a 10 ms tick would be 1% of the machine's time over it

_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # guest time is inside user already


def is_busy(share: float | None) -> bool:
    """Whether a measured share says the machine was shared (above BUSY)."""
    return share is not None and share > BUSY


def _machine_busy() -> float:
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in _BUSY_FIELDS)


def _own() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system


class OthersCpu:
    """`with OthersCpu() as load: ...`, then `load.share`: the share of the machine's CPU time
    that other processes used during the block (module docstring), or None (too short, unreadable)."""

    share: float | None = None

    def __enter__(self) -> OthersCpu:
        try:
            self._start = (time.perf_counter(), _machine_busy(), _own())
        except (psutil.Error, OSError, AttributeError):  # no system CPU times here: share stays None
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        wall, busy, own = self._start
        wall = time.perf_counter() - wall
        if wall >= MIN_SECONDS:
            others = (_machine_busy() - busy) - (_own() - own)
            self.share = max(0.0, others) / (wall * (psutil.cpu_count() or 1))
