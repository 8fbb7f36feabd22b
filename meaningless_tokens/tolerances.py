"""Every kind of quantity an output's values belong to, and the float noise each may carry between two runs of the
same code on other float kernels: TOLERANCES, `numpy.isclose`'s atol and rtol per kind. `make verify` compares each
value within its kind's tolerance (meaningless_tokens/verify/kinds.py says which kind a value is); the stages that record
how far a count or a rank statistic can move (meaningless_tokens/noise.py) read the tolerance of what they count or
rank. Set from a measured spread with a stated margin (`python -m meaningless_tokens.verify.calibrate`,
docs/sharing.md#tolerances-and-their-basis); a change here reruns those stages, whose bounds follow from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    covers: str


# One place for every tolerance: the kind of quantity -> numpy.isclose's atol and rtol. Chosen from measured
# cross-CPU and cross-instruction-set differences with a margin; a derived statistic's follows from its inputs'
# (docs/sharing.md#tolerances-and-their-basis).
TOLERANCES = {
    "exact": Tolerance(0.0, 0.0, "counts, token ids, indices, grades and accuracies, generated text, any non-float"),
    # measured by the calibration (docs/calibration.md): under MKL_CBWR=COMPATIBLE qwen2.5-coder-1.5b's weights moved
    # by up to 8.8e-04, element by element, and 2.6e-5 + 4e-3 x |w| covers every one: twice that, a margin of 2. Mostly
    # relative: softmax turns a logit's absolute error into its weight's relative one
    "attention": Tolerance(6e-5, 8e-3, "attention weights and what is averaged from them: means, drops, span mass, "
                                       "lambda, their intervals (fractions, 0..1)"),
    # measured on another vendor's CPU (docs/calibration.md): an interval's end moved by 1.4e-03, 1.42x 1e-3: 3x that
    "percent": Tolerance(3e-3, 0.0, "the same measures in percent (`*_pct`)"),
    # measured by the calibration (docs/calibration.md): under MKL_CBWR=COMPATIBLE qwen2.5-coder-1.5b's recv sums moved
    # by up to 7.1e-03 (on 19.6), element by element, and 4e-3 x |r| covers every one: twice that, a margin of 2, beside
    # the atol of before (their weights' error is relative, as attention's)
    "attention-received": Tolerance(4e-4, 8e-3, "the attention each position receives, summed over the queries "
                                               "(`recv_*`: up to a few hundred)"),
    "activation": Tolerance(1e-3, 5e-3, "layer 0's MLP activations (float16) and the measures and intervals "
                                        "computed from them"),
    # the float32 activations the activations stage counts (never stored: its showcase is float16, `activation`): the
    # radius of its counts' noise. Measured 1.0e-05 (gemma3-270m's layer 0, MKL_CBWR=COMPATIBLE against the default
    # kernels; benchmarks/activation_noise.py); margin 10 for other CPUs' kernels
    "activation-f32": Tolerance(1e-4, 1e-4, "layer 0's float32 MLP activations as the activations stage counts them "
                                            "(not stored; the radius of its histogram counts' noise)"),
    # counts and rank statistics: their float noise is recorded beside them (NOISE), from their inputs' tolerance
    "count": Tolerance(1e-6, 0.0, "counts of float values past a threshold (histogram bins, the activations outside "
                                  "the histogram's range) and shares of such counts (`improved`): within the number "
                                  "of counted values that lie within their own tolerance of the threshold, recorded "
                                  "beside it (`<name>_noise`)"),
    "rank-p": Tolerance(1e-6, 0.0, "p-values of rank statistics (Wilcoxon signed-rank): the decision at 0.05 exactly, "
                                   "the value within how far the ranks that can swap move it, recorded beside it "
                                   "(`<name>_noise`)"),
    "noise": Tolerance(0.0, 0.0, "how far a count or a rank statistic can move (`<name>_noise`): not a result, "
                                 "not compared as one; the tolerance of the value it names"),
    "loglik": Tolerance(5e-4, 1e-4, "log-likelihoods, their sums and means, paired differences, intervals, "
                                    "p-values and shares"),
    # measured AVX2 against AVX-512 (docs/sharing.md): 8.0e-03 on a sum of -25.2 nats, beyond `loglik`
    "loglik-arm": Tolerance(5e-3, 1e-3, "log-likelihoods under ARM (`arm/*`, `showcase/*/arm/*`): ARM's edit picks layer 0's "
                                        "activations by a threshold, and one on it goes the other way on other "
                                        "float kernels"),
    "residual": Tolerance(1e-3, 0.0, "a numerical check's residual recorded in provenance (the likelihood's "
                                     "`head_check_max_abs_diff`, which the stage requires below 1e-3)"),
    # the verdict's derived statistics (metrics/verdict.json): each from the tolerance t of the cells it reads
    "points": Tolerance(6e-3, 0.0, "the difference of two `percent` values in percentage points: the verdict's span "
                                   "growth (d)"),
    "pooled-points": Tolerance(1.5e-2, 0.0, "pooled estimates and intervals of the claims in percent or points (a)-(d)"),
    "tau2": Tolerance(0.03, 3e-3, "the between-model variance tau^2 of the claims in percent or points (a)-(d), "
                                  "points^2"),
    # I^2 of (f2) at fff1819 moves by up to 0.032 when each cell moves within `loglik` (all 512 corners); margin 1.5
    "i2": Tolerance(0.05, 0.0, "I^2, the share of the spread between models that is not sampling error (0..1)"),
    "p": Tolerance(1e-3, 0.05, "the verdict's p-values, each from its cell's estimate and interval"),
    "activation-points": Tolerance(0.1, 5e-3, "`activation` shares in percentage points (x 100): the verdict's "
                                              "near-zero shares (e1), (e2)"),
    "pooled-activation-points": Tolerance(0.25, 0.0125, "pooled estimates and intervals of (e1), (e2)"),
    "pooled-activation": Tolerance(2.5e-3, 0.0125, "pooled estimates and intervals of (e3), (e4)"),
    "pooled-loglik": Tolerance(2e-3, 4e-4, "pooled estimates and intervals of the likelihood claims (f2), "
                                                "(h1), (h2), nats"),
    "tau2-activation-points": Tolerance(0.15, 0.0, "tau^2 of (e1), (e2), points^2"),
    "tau2-activation": Tolerance(5e-5, 0.0, "tau^2 of (e3), (e4)"),
    "tau2-loglik": Tolerance(5e-5, 0.01, "tau^2 of (f2), (h1), (h2), nats^2"),
    "mde-loglik": Tolerance(3e-4, 0.0, "the power section's minimum detectable effects in nats per token (3 "
                                       "significant digits)"),
    # a string that prints numbers of a result: its text equal, each number within one unit of its last printed digit
    "printed": Tolerance(0.0, 0.0, "sentences and cells that print a result's numbers (the verdict's `md`, "
                                   "`detail`): the text equal, each number within one unit of its last digit"),
}
NOISE = "_noise"  # `<name>_noise` beside a value of kind count or rank-p: how far float noise can move it
ALPHA = 0.05      # the study's alpha: a rank statistic's p-value is compared by its decision at it, exactly


def allowed(kind: str, values) -> np.ndarray:
    """How far each value of `kind` may move between two runs on other float kernels: atol + rtol x |value|."""
    tol = TOLERANCES[kind]
    return tol.atol + tol.rtol * np.abs(np.asarray(values, dtype=np.float64))
