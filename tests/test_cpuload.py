"""taps.cpuload: other processes' share of the CPU during a block, counted from the operating
system's own CPU times. Real processes, no mocks: a child that keeps one CPU busy is counted, the
same work in this process is not (the negative control)."""

import subprocess
import sys
import time

import psutil

from taps.cpuload import MIN_SECONDS, OthersCpu

BURN = 1.0  # seconds of work on one CPU


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_child_process_counts_and_this_process_own_work_does_not():
    one_cpu = 1 / psutil.cpu_count()  # a process that keeps one CPU busy takes this share
    with OthersCpu() as own:
        burn(BURN)
    # a child counts as this process's work once waited for (psutil's children times): waited for after the block
    with OthersCpu() as others:
        child = subprocess.Popen([sys.executable, "-c", f"import time\nt = time.perf_counter() + {BURN}\n"
                                  "while time.perf_counter() < t: pass"])
        time.sleep(BURN)
    child.wait()
    assert own.share is not None and others.share is not None
    assert others.share > 0.6 * one_cpu  # the child's busy CPU, less its start-up and the clock's ticks
    assert own.share < others.share - 0.3 * one_cpu  # this process's own busy CPU is not another's


def test_a_block_too_short_for_the_counters_gets_no_share():
    with OthersCpu() as load:
        burn(MIN_SECONDS / 10)
    assert load.share is None
