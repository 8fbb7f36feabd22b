"""The conclusions of two runs, judged apart from their last digits: `metrics/verdict.json` here against the revision's.

Equal conclusions: the same claims and cells; every verdict word (each cell's and each claim's pooled one), every
estimate's sign, every Holm decision and the table's counts of words equal; and every estimate (each cell's and each
pooled one) moved by less than MOVE of its own standard error. The file holds estimates with their 95 % intervals, so
the standard error is the interval's half facing the move over the critical value it was made with: 1.96 for a cell
(its stage's bootstrap, read as a normal interval, as report/pooling.py's standard_error does), Student's t on k - 1
degrees of freedom for a claim pooled over k models (pooling.pool's Hartung-Knapp interval).

Why a tenth: float noise moves these estimates by about a millionth of their standard error (docs/sharing.md), while
a move of 0.1 SE turns a two-sided p of 0.05 into 0.039 or 0.063, the least that could change what a reader of the
table takes from it. An estimate without an interval of width has no standard error: its number is compared as any
other number (within its kind's tolerance), not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from meaningless_tokens.report.pooling import ALPHA, Z95

MOVE = 0.1  # the largest move of an estimate, in its own standard errors, that leaves a conclusion equal


@dataclass
class Conclusions:
    moved: list[str] = field(default_factory=list)  # each conclusion that differs, in words
    largest: float = 0.0                            # the largest move of an estimate, in standard errors
    where: str = ""                                 # whose
    problem: str = ""                               # why they could not be judged ("": they were)

    @property
    def equal(self) -> bool:
        return not self.problem and not self.moved


class Unreadable(Exception):
    """A verdict file that lacks a key the conclusions need."""


def _get(d: dict, key: str, where: str):
    if not isinstance(d, dict) or key not in d:
        raise Unreadable(f"{where}: no key '{key}'")
    return d[key]


def _sign(x) -> int:
    return 0 if x is None or x == 0 else (1 if x > 0 else -1)


def _critical(k) -> float:
    from scipy.stats import t

    return float(t.ppf(1 - ALPHA / 2, k - 1)) if isinstance(k, int) and k >= 2 else Z95


def _move(here: dict, theirs: dict, crit: float) -> float | None:
    """How far the estimate moved, in standard errors of the revision's interval (its half facing the move); None
    where there is no interval of width to measure by."""
    mine, est, lo, hi = here.get("estimate"), theirs.get("estimate"), theirs.get("low"), theirs.get("high")
    if not all(isinstance(v, (int, float)) for v in (est, lo, hi, mine)) or hi <= lo:
        return None
    half = (hi - est) if mine > est else (est - lo)
    if half <= 0:
        half = (hi - lo) / 2  # an estimate outside its own percentile interval: the symmetric half
    return abs(mine - est) / (half / crit)


def judge(here: dict, theirs: dict, name: str = "metrics/verdict.json") -> Conclusions:
    """The conclusions of the verdict file `here` against the revision's `theirs`."""
    out = Conclusions()
    try:
        _judge(here, theirs, name, out)
    except Unreadable as e:
        out.problem = f"{e}: the conclusions cannot be judged; the numbers alone are"
    return out


def _judge(here: dict, theirs: dict, name: str, out: Conclusions) -> None:
    mine_claims = {_get(c, "key", f"{name} claims[]"): c for c in _get(here, "claims", name)}
    their_claims = {_get(c, "key", f"{name} at the revision: claims[]"): c
                    for c in _get(theirs, "claims", f"{name} at the revision")}
    for key in sorted(set(mine_claims) ^ set(their_claims)):
        out.moved.append(f"claim ({key}) only {'here' if key in mine_claims else 'in the revision'}")
    if _get(here, "counts", name) != _get(theirs, "counts", f"{name} at the revision"):
        out.moved.append(f"counts of words {here['counts']} here, {theirs['counts']} in the revision")

    def offer(what: str, mine: dict, their: dict, crit: float) -> None:
        m = _move(mine, their, crit)
        if m is not None and m > out.largest:
            out.largest, out.where = m, what
        if m is not None and m >= MOVE:
            out.moved.append(f"{what}: estimate {mine.get('estimate'):.6g} here, {their.get('estimate'):.6g} in the "
                             f"revision ({m:.2f} standard errors; at most {MOVE})")

    for key in sorted(set(mine_claims) & set(their_claims)):
        mc, tc = mine_claims[key], their_claims[key]
        at = f"claims[{key}]"
        mp, tp = mc.get("pooled"), tc.get("pooled")
        if (mp is None) != (tp is None):
            out.moved.append(f"{at}.pooled: {'here only' if mp is not None else 'in the revision only'}")
        elif mp is not None:
            _compare(out, f"{at}.pooled", mp, tp, ("word",), name)
            offer(f"{at}.pooled", mp, tp, _critical(tp.get("k")))
        mcells, tcells = _get(mc, "cells", f"{name} {at}"), _get(tc, "cells", f"{name} at the revision {at}")
        for model in sorted(set(mcells) ^ set(tcells)):
            out.moved.append(f"{at}.cells.{model} only {'here' if model in mcells else 'in the revision'}")
        for model in sorted(set(mcells) & set(tcells)):
            where = f"{at}.cells.{model}"
            _compare(out, where, mcells[model], tcells[model], ("word", "holm"), name)
            offer(where, mcells[model], tcells[model], Z95)


def _compare(out: Conclusions, where: str, mine: dict, their: dict, keys: tuple[str, ...], name: str) -> None:
    """Words and decisions equal, and the estimate's sign."""
    for k in keys:
        a, b = _get(mine, k, f"{name} {where}"), _get(their, k, f"{name} at the revision {where}")
        if a != b:
            out.moved.append(f"{where}.{k}: {a!r} here, {b!r} in the revision")
    a, b = mine.get("estimate"), their.get("estimate")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and _sign(a) != _sign(b) \
            and not (math.isclose(a, 0, abs_tol=1e-12) and math.isclose(b, 0, abs_tol=1e-12)):
        out.moved.append(f"{where}.estimate: sign of {a:.6g} here, of {b:.6g} in the revision")
