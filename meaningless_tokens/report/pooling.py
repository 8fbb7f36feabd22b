"""The verdict table read as a whole: one answer per claim across models, and the table's many tests said once.

Both start from each cell's 95 % interval, the one its stage's paired bootstrap gives (or, for (d), the
conservative interval of a difference), so every number here comes from the same data as the cell's word:

- a cell's standard error is its interval's width over 2 x 1.96 (the normal approximation of the bootstrap);
- a cell's p-value (two-sided, against zero) uses the half of the interval that faces zero, so p < 0.05 exactly
  when the interval excludes zero: the p-values agree with the words they correct (Altman & Bland 2011, "How to
  obtain the P value from a confidence interval", with the half-width on the side that matters);
- `pool`: a random-effects meta-analysis over the models (statsmodels' `combine_effects`: the Paule-Mandel
  between-model variance tau^2, I^2, and the Hartung-Knapp-Sidik-Jonkman standard error, floored at the plain
  random-effects one, with t on k - 1 degrees of freedom: the interval recommended for a handful of studies);
- `holm`: which cells keep "reproduced" or "contradicted" after a Holm correction over every cell with an interval.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
Z80 = 0.8416212335729143  # 80 % power
ALPHA = 0.05


def standard_error(low: float, high: float) -> float:
    return (high - low) / (2 * Z95)


def mde(low: float, high: float) -> float | None:
    """The smallest effect a design with this interval's spread detects at 80 % power (two-sided 5 %); None for an
    interval of no width (every paired difference the same: nothing to scale)."""
    se = standard_error(low, high)
    return (Z95 + Z80) * se if se > 0 else None


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
    mde: float | None


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
                  (crit + Z80) * sd if sd > 0 else None)
