"""The verdict's power: per outcome and model, the smallest effect the run could detect (`mde`, 80 % power,
two-sided 5 %, the exact paired t-test) and what detecting the paper's effect would take (`needed`: the problems;
`power()`: those and the hours at this run's speed), kept in metrics/verdict.json's `power`.
"""

from __future__ import annotations

import math

import numpy as np

from meaningless_tokens import store
from meaningless_tokens.results.context import Context
from meaningless_tokens.report import paper, pooling
from meaningless_tokens.report.verdict import rounded
from meaningless_tokens.results.trace import artifact
from meaningless_tokens.store import read_h5

PAPER_GAINS = paper.reported("g1").values  # points: the paper's mless − none gains on MATH-500 (report/paper.yaml)
PAPER_GAIN = float(min(PAPER_GAINS.values()))  # the smallest of them


def _sd(diff) -> float:
    diff = np.asarray(diff, dtype=np.float64)
    return float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0


def mde(diff: np.ndarray, at: int | None = None) -> float | None:
    """The minimum detectable mean of paired differences at 80 % power (two-sided 5 %) from their spread: the exact
    paired t-test's (noncentral t, n - 1 degrees of freedom) with n = `at` problems (a design of that size at this
    run's spread), else the run's own."""
    sd, n = _sd(diff), len(diff) if at is None else at
    if len(diff) < 2 or n < 2 or not sd > 0:
        return None
    return pooling.noncentrality(n - 1) * sd / math.sqrt(n)


def needed(diff: np.ndarray, effect: float) -> int | None:
    """The fewest problems whose paired t-test detects a mean difference `effect` at 80 % power (two-sided 5 %),
    the spread held at this run's: the smallest n with exact power (noncentral t, n - 1 degrees of freedom) >= 80 %."""
    if not effect > 0:
        raise ValueError(f"effect {effect!r}: expected a positive size")
    sd = _sd(diff)
    if not sd > 0:
        return None
    d = effect / sd

    def enough(n: int) -> bool:
        return pooling.power(d * math.sqrt(n), n - 1) >= pooling.POWER

    lo, hi = 1, 2  # power rises with n: double until enough, then bisect (lo not enough, 1 having no test; hi enough)
    while not enough(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def power(ctx: Context) -> dict:
    """Per outcome and model: n, the MDE, and (accuracy) the problems and hours the paper's gain would need."""
    out = {"accuracy": {}, "likelihood": {}, "paper_gain_points": PAPER_GAIN, "paper_gains": dict(PAPER_GAINS)}
    limit = 500  # MATH-500's problems
    for n in ctx.names:
        if n not in ctx.metrics:
            continue
        with read_h5(ctx.root / store.path("eval", n), "eval") as f:
            conds = [str(c) for c in f.attrs["conditions"]]
            if "mless" not in conds:
                continue
            diff = 100 * (f["mless/correct"][()].astype(float) - f["none/correct"][()].astype(float))
        timing = ctx.root / artifact("timing/evaluate", n)
        t = ctx.src.json(artifact("timing/evaluate", n)) if timing.is_file() else {}
        per = t["seconds_this_run"] / (len(diff) * len(conds)) if t.get("seconds_this_run") else None
        need = needed(diff, PAPER_GAIN)
        out["accuracy"][n] = {"n": len(diff), "mde_points": rounded(mde(diff)), "needed_for_paper_gain": need,
                              "benchmark_limit": limit, "seconds_per_problem_condition": rounded(per),
                              "hours_needed": rounded(need * len(conds) * per / 3600) if need and per else None,
                              "conditions": len(conds)}
    for n, lk in ctx.likelihood.items():
        res = lk["contrasts"].get("mless-none")
        if res is None:
            continue
        diff = res["solution"]["diff"]
        t = ctx.root / artifact("timing/likelihood", n)
        secs = ctx.src.json(artifact("timing/likelihood", n)).get("seconds") if t.is_file() else None
        m = mde(diff)
        out["likelihood"][n] = {"n": len(diff), "mde_nats_per_token": rounded(m),
                                "mde_at_500": rounded(mde(diff, at=limit)),
                                "seconds_this_run": secs,
                                "hours_at_500": rounded(secs * limit / len(diff) / 3600) if secs else None}
    return out
