"""Uncertainty over samples: seeded percentile bootstrap intervals, the exact McNemar test and the Wilcoxon
signed-rank test."""

from __future__ import annotations

import numpy as np

N_BOOT = 10_000


def bootstrap_mean_ci(values: np.ndarray, seed: int, level: float = 0.95, n_boot: int = N_BOOT,
                      axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of the mean over `axis` (samples), resampling samples with replacement.

    Paired data stay paired: pass per-sample differences, not the two arms.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[axis]
    if n == 0:
        raise ValueError("no samples to bootstrap")
    rng = np.random.default_rng(seed)
    moved = np.moveaxis(values, axis, 0)
    means = np.empty((n_boot,) + moved.shape[1:])
    for b in range(0, n_boot, 1000):  # in blocks, so memory stays at 1000 resamples
        idx = rng.integers(0, n, size=(min(1000, n_boot - b), n))
        means[b:b + len(idx)] = moved[idx].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha], axis=0)
    return lo, hi


def bootstrap_ratio_ci(num: np.ndarray, den: np.ndarray, seed: int, level: float = 0.95,
                       n_boot: int = N_BOOT) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of mean(num) / mean(den) over axis 0, resampling samples jointly."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = num.shape[0]
    rng = np.random.default_rng(seed)
    ratios = np.empty((n_boot,) + num.shape[1:])
    for b in range(0, n_boot, 1000):
        idx = rng.integers(0, n, size=(min(1000, n_boot - b), n))
        ratios[b:b + len(idx)] = num[idx].mean(axis=1) / den[idx].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(ratios, [alpha, 1 - alpha], axis=0)
    return lo, hi


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts b (only the treatment right) and
    c (only the baseline right); 1.0 when there are no discordant pairs."""
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest  # imported here: scipy.stats costs a second at every stage start

    return float(binomtest(b, b + c, 0.5).pvalue)


def wilcoxon_p(diff: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p of paired differences; 1.0 when every difference is zero."""
    from scipy.stats import wilcoxon

    diff = np.asarray(diff, dtype=np.float64)
    if not np.any(diff != 0):
        return 1.0
    return float(wilcoxon(diff, zero_method="wilcox", alternative="two-sided").pvalue)


def paired(treat: np.ndarray, base: np.ndarray, seed: int) -> dict:
    """Paired comparison of two conditions' per-problem correctness."""
    diff = treat.astype(np.float64) - base.astype(np.float64)
    lo, hi = bootstrap_mean_ci(diff, seed)
    b, c = int((treat & ~base).sum()), int((~treat & base).sum())
    return {"delta": float(diff.mean()), "ci95_low": float(lo), "ci95_high": float(hi),
            "mcnemar_p": mcnemar_exact(b, c), "only_this_right": b, "only_none_right": c}
