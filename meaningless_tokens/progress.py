"""Progress bars that stay readable in a log: live on a terminal, a line every 30 s otherwise."""
from __future__ import annotations

import sys

from tqdm import tqdm


def bar(iterable=None, *, desc: str, unit: str, total: int | None = None, initial: int = 0) -> tqdm:
    live = sys.stderr.isatty()
    return tqdm(iterable, desc=desc, unit=unit, total=total, initial=initial, file=sys.stderr,
                mininterval=0.1 if live else 30.0, dynamic_ncols=live)
