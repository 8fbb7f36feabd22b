"""The float noise a count or a rank statistic can carry (meaningless_tokens/noise.py), against brute force: inputs
moved anywhere within their tolerance never move the count, the share or the Wilcoxon p by more than the bound."""

from __future__ import annotations

import numpy as np
import pytest

from meaningless_tokens import noise
from meaningless_tokens.intervals import wilcoxon_p
from meaningless_tokens.tolerances import allowed


def moved(x: np.ndarray, kind: str, rng, edge: bool = False) -> np.ndarray:
    """`x` with each value moved within its tolerance (to either end where `edge`)."""
    r = allowed(kind, x) * 0.999
    u = rng.choice([-1.0, 1.0], size=x.shape) if edge else rng.uniform(-1, 1, size=x.shape)
    return x + u * r


def test_a_known_case_by_hand():
    # |d| 0.0002 lies within loglik's tolerance of zero (its sign may flip; its rank reaches 1), and 0.3 / -0.3003
    # within twice the tolerance of each other (they may swap ranks): 2 steps of W+; n = 4, sigma = sqrt(7.5)
    d = np.array([0.3, -0.3003, 0.0002, 0.5])
    assert noise.wilcoxon(d, "loglik") == pytest.approx(2 * 1.25 * 2 / (np.sqrt(7.5) * np.sqrt(2 * np.pi)))
    assert noise.share(d, "loglik") == 0.25
    assert noise.wilcoxon(np.array([0.5, -0.15, 0.3]), "loglik") == 0.0


# n = 12 takes about 95 s: scipy answers a small sample with ties by a permutation test (131 of its 1,241 p-values,
# about 1.3 s each, in a cProfile); `make test` alone runs it
@pytest.mark.parametrize("n", [6, pytest.param(12, marks=pytest.mark.slow), 40, 100])
def test_the_wilcoxon_p_moves_by_at_most_its_noise(n):
    rng = np.random.default_rng(n)
    for trial in range(30):
        # differences on a coarse grid, so that ties, near ties and near zeros are common
        d = np.round(rng.normal(0.02, 0.05, n), 3) + rng.choice([0, 3e-4], n)
        bound, p = noise.wilcoxon(d, "loglik"), wilcoxon_p(d)
        for k in range(40):
            q = wilcoxon_p(moved(d, "loglik", rng, edge=k % 2 == 0))
            assert abs(q - p) <= bound + 1e-12, (trial, d, p, q, bound)


def test_the_bound_is_not_vacuous():
    """Spread-out differences give a bound far below 1; with near ties it grows."""
    d = np.linspace(0.01, 1, 100) * np.where(np.arange(100) % 3, 1, -1)
    assert noise.wilcoxon(d, "loglik") == 0.0
    # loglik-arm's tolerance (6e-3 at |d| = 1) lets neighbours 0.01 apart swap: about 66 steps of sigma 581
    assert 0.1 < noise.wilcoxon(d, "loglik-arm") < 0.3


def test_a_count_past_thresholds_moves_by_at_most_the_values_near_them():
    rng = np.random.default_rng(0)
    values = np.round(rng.normal(0, 1, 20000), 2).astype(np.float32)  # many values on and near the edges
    edges = np.linspace(-2, 2, 9)
    near = noise.near(values, edges, "activation-f32")
    counts = np.histogram(values, edges)[0]
    bins = near[:-1] + near[1:]
    assert near.sum() > 0
    for k in range(20):
        again = np.histogram(moved(values.astype(np.float64), "activation-f32", rng, edge=k % 2 == 0), edges)[0]
        assert np.all(np.abs(again - counts) <= bins)
    # the same counted on sorted values, as the activations stage does
    assert np.array_equal(noise.near(np.sort(values), edges, "activation-f32", ordered=True), near)


def test_the_improved_share_moves_by_at_most_its_noise():
    rng = np.random.default_rng(1)
    d = np.round(rng.normal(0, 0.01, 200), 3)
    bound, share = noise.share(d, "loglik"), np.mean(d > 0)
    assert bound > 0
    for _ in range(50):
        assert abs(np.mean(moved(d, "loglik", rng) > 0) - share) <= bound + 1e-12
