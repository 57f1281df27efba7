"""How long a resumable training job will take on this machine, said once it has timed its first unit.

Data generation and drafter training run for hours on a CPU and resume when rerun; the user
decides from the first measured batch or step whether to let them run, shrink them, or leave
them for a bigger machine (issue 22: `taps train-drafter --target X` says its time before the
long work). The estimate is the first unit's time times the units left: the first unit is
slower than later ones (allocation, kernel selection), so it errs long.
"""

from __future__ import annotations

from tqdm import tqdm


def duration(seconds: float) -> str:
    """`3 h 05 min`, `12 min`, `40 s`."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    if hours:
        return f"{hours} h {rest // 60:02d} min"
    return f"{rest // 60} min" if rest >= 60 else f"{rest} s"


def say_estimate(job: str, seconds: float, left: int, unit: str) -> None:
    """Print, above any progress bar, the estimate for `left` more units after the first took `seconds`."""
    tqdm.write(f"{job}: {seconds:.1f} s per {unit} on this machine, {left} more to go: about "
               f"{duration(seconds * left)} (rerun the same command to resume after a stop)")
