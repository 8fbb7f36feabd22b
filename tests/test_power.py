"""The report's power numbers are a paired t-test's exact ones (noncentral t), checked against statsmodels' solver and
a simulation: the normal approximation states a detectable effect 25 % too small at 5 problems."""

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower

from meaningless_tokens.report import pooling, power, verdict


def _solve(n: int) -> float:
    """statsmodels' smallest standardized mean a two-sided 5 % one-sample t-test on n detects at 80 % power."""
    return TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")


def _spread(n: int, sd: float = 1.0, seed: int = 0) -> np.ndarray:
    """n paired differences whose sample sd (ddof 1) is exactly `sd`."""
    x = np.random.default_rng(seed).normal(size=n)
    return (x - x.mean()) / x.std(ddof=1) * sd + 0.3


@pytest.mark.parametrize("n", [5, 20, 100])
def test_mde_is_the_paired_t_tests(n):
    # the normal approximation's (1.96 + 0.84) / sqrt(n) is 25 %, 5 % and 1 % smaller: outside rel 1e-4 at each n
    assert power.mde(_spread(n, 2.5)) == pytest.approx(2.5 * _solve(n), rel=1e-4)
    # a 500-problem design at this run's spread: its own t, not the run's MDE scaled by sqrt(n / 500)
    assert power.mde(_spread(n, 2.5), at=500) == pytest.approx(2.5 * _solve(500), rel=1e-4)


def test_mde_at_five_problems_has_eighty_percent_power_by_simulation():
    m = power.mde(_spread(5))
    assert m == pytest.approx(1.682, abs=1e-3)  # the approximation said 1.25
    reps = 20_000
    x = np.random.default_rng(1).normal(m, 1.0, size=(reps, 5))
    rate = float(np.mean(stats.ttest_1samp(x, 0.0, axis=1).pvalue < 0.05))
    assert abs(rate - 0.8) < 4 * math.sqrt(0.8 * 0.2 / reps), rate  # 4 standard errors: 0.011


@pytest.mark.parametrize("d", [1.0, 0.5, 0.2, 0.05])
def test_needed_is_the_fewest_problems_with_eighty_percent_power(d):
    diff = _spread(12, 3.0)
    n = power.needed(diff, d * 3.0)
    assert n == math.ceil(TTestPower().solve_power(effect_size=d, alpha=0.05, power=0.8, alternative="two-sided"))
    exact = TTestPower().power
    assert exact(d, n, 0.05) >= 0.8 > exact(d, n - 1, 0.05)
    assert power.needed(np.ones(5), 1.0) is None  # no spread: nothing to scale
    with pytest.raises(ValueError):
        power.needed(diff, 0.0)


def test_interval_mde_takes_the_cells_degrees_of_freedom():
    se = 0.7
    low, high = -pooling.Z95 * se, pooling.Z95 * se
    for n in (5, 20, 100):
        assert pooling.mde(low, high, n) == pytest.approx(_solve(n) * math.sqrt(n) * se, rel=1e-4)
    # no n (a difference of two intervals): the normal limit, 1.96 + 0.84 standard errors
    assert pooling.mde(low, high) == pytest.approx((pooling.Z95 + stats.norm.ppf(0.8)) * se, rel=1e-4)
    assert pooling.mde(low, high, 1) is None and pooling.mde(1.0, 1.0, 5) is None


def test_pooled_mde_is_the_noncentral_t_on_k_minus_one_degrees_of_freedom():
    se = 0.5
    half = pooling.Z95 * se
    res = pooling.pool([0.2, 0.9, 1.4], [0.2 - half, 0.9 - half, 1.4 - half], [0.2 + half, 0.9 + half, 1.4 + half])
    sd = (res.high - res.low) / 2 / stats.t.ppf(0.975, res.k - 1)  # the pooled standard error, from its t interval
    # 2 degrees of freedom: 5.65 standard errors, where (t_2 + z_0.80) said 5.14
    assert res.mde == pytest.approx(_solve(res.k) * math.sqrt(res.k) * sd, rel=1e-4)


def test_an_inconclusive_cell_states_the_mde_of_its_own_n():
    c = verdict.Cell("", None, "", None, -1.0, 2.0, estimate=0.5, n=5, unit="points", fmt="+.1f")
    verdict.judge(c, +1, None, "", None)
    # standard error 3 / 3.92 = 0.77: x 3.76 (4 degrees of freedom) = 2.9, where 1.96 + 0.84 said 2.1
    assert c.word == "inconclusive" and "detects 2.9 points or more" in c.detail, c.detail
