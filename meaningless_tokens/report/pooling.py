"""The verdict table read as a whole: one answer per claim across models, and the table's many tests said once.

Both start from each cell's 95 % interval, the one its stage's paired bootstrap gives (or, for (d), the
conservative interval of a difference), so every number here comes from the same data as the cell's word:

- a cell's standard error is its interval's width over 2 x 1.96 (the normal approximation of the bootstrap);
- power (`noncentrality`, `mde`, and `pool`'s): a two-sided 5 % t-test's exact power at 80 %, the noncentral t on
  the design's degrees of freedom (n - 1 for n paired differences, k - 1 for k pooled models), not the normal
  approximation (1.96 + 0.84) x the standard error, which at 5 problems states a detectable effect 25 % too small;
- a cell's p-value (two-sided, against zero) uses the half of the interval that faces zero, so p < 0.05 exactly
  when the interval excludes zero: the p-values agree with the words they correct (Altman & Bland 2011, "How to
  obtain the P value from a confidence interval", with the half-width on the side that matters);
- `pool`: a random-effects meta-analysis over the models (statsmodels' `combine_effects`: the Paule-Mandel
  between-model variance tau^2, I^2, and the Hartung-Knapp-Sidik-Jonkman standard error, floored at the plain
  random-effects one, with t on k - 1 degrees of freedom: the interval recommended for a handful of studies);
- `holm`: which cells keep "reproduced" or "contradicted" after a Holm correction over every cell with an interval.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
ALPHA = 0.05


def standard_error(low: float, high: float) -> float:
    return (high - low) / (2 * Z95)


POWER = 0.80


def power(nc: float, df: float | None) -> float:
    """A two-sided 5 % t-test's power when the true mean is `nc` standard errors from zero, on `df` degrees of freedom
    (None: the normal limit); both tails count, as in statsmodels' TTestPower."""
    from scipy.stats import nct, norm, t

    if df is None:
        c = Z95
        return float(norm.sf(c - nc) + norm.cdf(-c - nc))
    c = float(t.ppf(1 - ALPHA / 2, df))
    far = float(nct.cdf(-c, df, nc))  # scipy gives NaN where this tail underflows (1 degree of freedom, nc ~ 20)
    return float(nct.sf(c, df, nc)) + (far if math.isfinite(far) else 0.0)


@functools.lru_cache(maxsize=None)
def noncentrality(df: float | None) -> float:
    """The mean, in standard errors, that a two-sided 5 % t-test on `df` degrees of freedom detects with 80 % power
    (None: the normal limit, 1.96 + 0.84 = 2.80; 4 degrees of freedom, 5 problems: 3.76)."""
    from scipy.optimize import brentq

    if df is not None and not df >= 1:
        raise ValueError(f"degrees of freedom {df!r}: a t-test needs at least 1")
    # power rises with nc from 5 % at 0; 1 degree of freedom needs about 16 standard errors, well inside the bracket
    return float(brentq(lambda nc: power(nc, df) - POWER, 0.0, 60.0, xtol=1e-10))


def mde(low: float, high: float, n: int | None = None) -> float | None:
    """The smallest effect a design with this interval's spread detects at 80 % power (two-sided 5 %): the exact
    paired t-test's on n - 1 degrees of freedom for a cell measured on n problems; n None (a cell with no single n:
    (d), a difference of two intervals) takes the normal limit 1.96 + 0.84, which would understate the effect by 25 %
    at 5 problems. None for an interval of no width (every paired difference the same: nothing to scale)."""
    se = standard_error(low, high)
    if se <= 0:
        return None
    if n is not None and n < 2:
        return None  # one paired difference: no spread to test with
    return noncentrality(None if n is None else n - 1) * se


def p_value(estimate: float, low: float, high: float) -> float:
    """Two-sided p against zero from the estimate and the half of its 95 % interval that faces zero."""
    if high <= low or estimate == 0:
        return 1.0
    side = estimate - low if estimate > 0 else high - estimate
    if side <= 0:  # an estimate outside its own percentile interval (a skewed bootstrap): the symmetric half
        side = (high - low) / 2
    return math.erfc(abs(estimate) / (side / Z95) / math.sqrt(2))


def holm(p_values: list[float]) -> list[bool]:
    """Which of the p-values stay below ALPHA after Holm's step-down correction over all of them."""
    from statsmodels.stats.multitest import multipletests

    if not p_values:
        return []
    return [bool(x) for x in multipletests(p_values, alpha=ALPHA, method="holm")[0]]


@dataclass
class Pooled:
    estimate: float
    low: float
    high: float
    tau2: float
    i2: float     # share of the spread between models that is not sampling error, 0..1
    k: int        # models pooled
    mde: float | None  # the noncentral t's on k - 1 degrees of freedom, as the interval's t


def pool(estimates: list[float], lows: list[float], highs: list[float]) -> Pooled | None:
    """The random-effects pooled estimate of per-model effects given with their 95 % intervals; None with fewer
    than two models whose interval has a width (a zero-width interval has no standard error to weigh it by)."""
    from statsmodels.stats.meta_analysis import combine_effects
    from scipy.stats import t as t_dist
    from statsmodels.tools.sm_exceptions import InvalidTestWarning

    keep = [(e, standard_error(lo, hi)) for e, lo, hi in zip(estimates, lows, highs) if hi > lo]
    if len(keep) < 2:
        return None
    eff = np.array([e for e, _ in keep], dtype=np.float64)
    var = np.array([s for _, s in keep], dtype=np.float64) ** 2
    with warnings.catch_warnings():
        # use_t also asks for t intervals of each model's own effect, which need its sample size; those are not read
        # here (each model's interval is its stage's bootstrap)
        warnings.simplefilter("ignore", InvalidTestWarning)
        res = combine_effects(eff, var, method_re="iterated", use_t=True, alpha=ALPHA)
    # Hartung-Knapp with the ad hoc floor (Roever et al. 2015): never narrower than the plain random-effects interval,
    # which plain HKSJ is when the models agree more closely than their errors predict (zero width at equal estimates)
    sd = max(float(res.sd_eff_w_re), float(res.sd_eff_w_re_hksj))
    crit = float(t_dist.ppf(1 - ALPHA / 2, len(keep) - 1))
    est = float(res.mean_effect_re)
    return Pooled(est, est - crit * sd, est + crit * sd, float(res.tau2), float(max(0.0, res.i2)), len(keep),
                  noncentrality(len(keep) - 1) * sd if sd > 0 else None)
