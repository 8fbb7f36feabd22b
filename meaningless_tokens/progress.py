"""Progress bars that stay readable in a log: live on a terminal, a line every 30 s otherwise.

Every long loop of the library shows a bar, so the bars are also where a loop can be stopped between its steps:
inside `deadline(at)` a bar's update past `at` (time.monotonic()) raises `TimedOut`. A harness that runs stages
in-process with a time limit (benchmarks/gpu_check.py) sets one; nothing else does. The step in flight (a batch,
a prompt, a compile) finishes first, and the stage writes no output: its outputs are written atomically at its end.
"""
from __future__ import annotations

import contextlib
import sys
import time

from tqdm import tqdm

_deadline: list[float] = []  # the innermost deadline's time.monotonic(), a stack (nested limits)


class TimedOut(Exception):
    """A loop reached the deadline `deadline(...)` set (between two of its steps)."""


@contextlib.contextmanager
def deadline(at: float | None):
    """Bars updated inside the block past `at` (time.monotonic() seconds) raise TimedOut; None: no limit."""
    _deadline.append(float("inf") if at is None else at)
    try:
        yield
    finally:
        _deadline.pop()


def check() -> None:
    """Raise TimedOut when past the innermost deadline (a loop without a bar may call this between its steps)."""
    if _deadline and time.monotonic() > min(_deadline):
        raise TimedOut(f"time limit reached ({time.monotonic() - min(_deadline):.1f} s past it)")


class _Bar(tqdm):
    def update(self, n=1):
        out = super().update(n)
        check()
        return out

    def __iter__(self):
        for item in super().__iter__():
            yield item
            check()


def bar(iterable=None, *, desc: str, unit: str, total: int | None = None, initial: int = 0) -> tqdm:
    live = sys.stderr.isatty()
    return _Bar(iterable, desc=desc, unit=unit, total=total, initial=initial, file=sys.stderr,
                mininterval=0.1 if live else 30.0, dynamic_ncols=live)
