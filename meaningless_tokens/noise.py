"""How far a count or a rank statistic can move when every value it is computed from moves within its kind's tolerance
(meaningless_tokens/tolerances.py): the bound `make verify` compares it with, recorded beside it as `<name>_noise`.

A float moves by a little between runs on other float kernels; a count of floats past a threshold, or a rank, moves
by a whole step when one value crosses, however small its move. So such a value is compared within the number of
steps its inputs allow, not within a float tolerance (docs/sharing.md#counts-and-rank-statistics):

- a count past a threshold: each value within its tolerance of the threshold may lie on either side of it in another
  run, so the count moves by at most how many such values there are (`near`);
- a share of paired differences above zero (`improved`): each difference within its tolerance of zero (`share`);
- a Wilcoxon signed-rank p-value: W+, the sum of the ranks of the positive differences, moves by one for each pair of
  differences of opposite sign whose |d| lie within the two tolerances of each other (they may swap ranks) and by at
  most a difference's largest reachable rank where its sign may flip; the p-value moves by at most that many steps of
  W+ times the largest probability of one step, plus the gap between scipy's exact and normal p where a broken tie
  or a difference crossing zero can switch its method (`wilcoxon`).
"""

from __future__ import annotations

import math

import numpy as np

from meaningless_tokens.tolerances import NOISE, allowed  # noqa: F401 - NOISE: the suffix of what this bounds

# the largest probability of one value of W+ over the normal density's peak 1 / (sigma sqrt(2 pi)), by the exact
# distribution: 1.17 at n = 3, under 1 from n = 4 on (0.99 at 50, where scipy turns to the normal approximation, whose
# slope is at most the peak): 1.25 bounds one step of either p
STEP_MARGIN = 1.25
EXACT_UP_TO = 50  # scipy.stats.wilcoxon's method="auto": the exact distribution up to this many nonzero differences


def near(values: np.ndarray, thresholds: np.ndarray, kind: str, ordered: bool = False) -> np.ndarray:
    """How many of `values` lie within their tolerance (`kind`'s) of each threshold. `ordered`: already ascending."""
    v = np.asarray(values).ravel() if ordered else np.sort(np.asarray(values).ravel())
    t = np.asarray(thresholds, dtype=np.float64)
    r = allowed(kind, np.abs(t) + allowed(kind, t))  # a value that near has |v| up to |t| + r: its own tolerance
    return np.searchsorted(v, t + r, side="right") - np.searchsorted(v, t - r, side="left")


def share(diff: np.ndarray, kind: str) -> float:
    """How far the share of `diff` above zero can move: the share of differences within their tolerance of zero."""
    d = np.asarray(diff, dtype=np.float64)
    return float(np.mean(np.abs(d) <= allowed(kind, d))) if d.size else 0.0


def wilcoxon(diff: np.ndarray, kind: str) -> float:
    """How far the two-sided Wilcoxon signed-rank p of paired differences `diff` can move (at most 1)."""
    d = np.asarray(diff, dtype=np.float64)
    n = d.size
    if n == 0:
        return 0.0
    order = np.argsort(np.abs(d), kind="stable")
    a, sign = np.abs(d)[order], np.sign(d)[order]
    reach = 2 * float(allowed(kind, d).max())  # two differences this close may swap ranks
    flips = a <= allowed(kind, a)
    hi = np.searchsorted(a, a + reach, side="right")  # a difference's rank reaches at most hi (1-based)
    steps = float(hi[flips].sum())
    pos, neg = (sign > 0) & ~flips, (sign < 0) & ~flips
    cum_pos = np.concatenate([[0], np.cumsum(pos)])
    cum_neg = np.concatenate([[0], np.cumsum(neg)])
    after = np.arange(1, n + 1)
    # each pair (i < j) of opposite signs within `reach`: counted once, from its smaller |d|
    steps += float(np.sum(np.where(pos, cum_neg[hi] - cum_neg[after], 0))
                   + np.sum(np.where(neg, cum_pos[hi] - cum_pos[after], 0)))
    sigma = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return min(1.0, 2 * STEP_MARGIN * steps / (sigma * math.sqrt(2 * math.pi)) + _method_gap(d, int(flips.sum())))


def _method_gap(d: np.ndarray, flips: int) -> float:
    """How far the p-value jumps where scipy's choice of method can change between runs: it takes the exact
    distribution for at most EXACT_UP_TO nonzero differences without ties, else the normal approximation (with ties,
    a tie-aware one), so a tie that float noise breaks, or a difference near zero that joins or leaves the count
    across that limit, switches method; the gap between the methods' p-values bounds that jump."""
    nonzero = d[d != 0]
    m = nonzero.size
    ties = np.unique(np.abs(nonzero)).size < m
    if m == 0 or not ((ties and m <= EXACT_UP_TO) or m - flips <= EXACT_UP_TO < m + flips):
        return 0.0
    from scipy.stats import wilcoxon as scipy_wilcoxon

    from meaningless_tokens.intervals import wilcoxon_p

    ps = [wilcoxon_p(d)] + [float(scipy_wilcoxon(d, zero_method="wilcox", method=how).pvalue)
                            for how in ("exact", "approx")]
    return max(ps) - min(ps)
