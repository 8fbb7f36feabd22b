"""Paired differences between two conditions on the same problems: the mean with its seeded bootstrap 95 % interval,
the two-sided Wilcoxon signed-rank p and the share of problems that improved, overall and per group."""

from __future__ import annotations

import numpy as np

from meaningless_tokens import noise
from meaningless_tokens.intervals import bootstrap_mean_ci, wilcoxon_p


def paired_stats(diff: np.ndarray, seed: int, n_boot: int, kind: str) -> dict:
    """Mean paired difference, its seeded bootstrap 95 % interval, the Wilcoxon signed-rank p and the share of
    problems that improved (difference > 0), and how far float noise can move those two (`p_noise`,
    `improved_noise`: each difference moved within the tolerance of `kind`, its kind of quantity)."""
    diff = np.asarray(diff, dtype=np.float64)
    lo, hi = bootstrap_mean_ci(diff, seed, n_boot=n_boot)
    return {"n": len(diff), "mean": float(diff.mean()), "ci": (float(lo), float(hi)),
            "p": wilcoxon_p(diff), "improved": float(np.mean(diff > 0)),
            "p_noise": noise.wilcoxon(diff, kind), "improved_noise": noise.share(diff, kind)}


def groups(values: list, diff: np.ndarray, seed: int, n_boot: int, kind: str) -> tuple[list, list[dict]]:
    """The paired statistics per value (level, subject); none when the dataset lacks the field (AIME: no level)."""
    if any(v is None for v in values):
        return [], []
    keys = sorted(set(values))
    return keys, [paired_stats(diff[[v == k for v in values]], seed, n_boot, kind) for k in keys]
