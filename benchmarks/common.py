"""Helpers the benchmark scripts share: project imports, params, tables, memory, machine line."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/bench_x.py` puts only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))


def load_params():
    """The project's params.yaml, validated by meaningless_tokens.config (the only reader of params)."""
    from meaningless_tokens.config import load_params as load

    return load(ROOT / "params.yaml")


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (getrusage ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Current resident set size of this process."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def machine(threads: int) -> str:
    import torch

    return (f"machine: {os.cpu_count()} CPU cores, torch {torch.__version__} ({threads} threads), float32; "
            f"load average {os.getloadavg()[0]:.2f} at start")


def _cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / ticks  # all but idle and iowait
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return busy, own


class OtherLoad:
    """How much CPU other processes took while a benchmark ran (from /proc/stat minus our own usage):
    timings taken beside other work are slower, and small batches suffer more than large ones."""

    def __init__(self):
        self.start, self.t0 = _cpu_seconds(), time.monotonic()

    def __str__(self) -> str:
        (busy0, own0), (busy1, own1) = self.start, _cpu_seconds()
        capacity = (time.monotonic() - self.t0) * os.cpu_count()
        other = max(0.0, (busy1 - busy0) - (own1 - own0)) / capacity
        return f"other processes used {100 * other:.0f}% of the {os.cpu_count()} cores' time during this run"


def table(headers: list[str], rows: list[list]) -> None:
    """A Markdown table (pastes into the README as is)."""
    cells = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(fmt(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print(fmt(r))
