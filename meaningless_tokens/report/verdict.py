"""The verdict: which of the paper's claims this run reproduces, for which model, and with what power.

One row per claim the run tests, one cell per model: a word from `word()` (the one rule, applied to a 95 %
interval and the side the paper predicts), the number with its interval (traced `Num`s) and the report section
that holds the evidence. `power()` states, per outcome, the smallest effect the run could detect and what
detecting the paper's effect would take. `summary()` is what `metrics/verdict.json` keeps, the input of
`docs/results.md`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from meaningless_tokens import store
from meaningless_tokens.results.context import Context
from meaningless_tokens.report import paper, pooling
from meaningless_tokens.results.prose import plain, say
from meaningless_tokens.results.trace import Num, Text, artifact, interval
from meaningless_tokens.store import read_h5

WORDS = ("reproduced", "contradicted", "ruled out", "inconclusive", "not run")
# each word's rule, once, in a researcher's words (the table's footnote, metrics/verdict.json's "rules")
VERDICT = "verdict.j2"  # the sentences; this module decides what they say
RULES = {w: plain(VERDICT, "rule", word=w) for w in WORDS}
RULE = plain(VERDICT, "rules", rules=RULES)


def word(low: float, high: float, direction: int = +1, sesoi: float | None = None) -> str:
    """The verdict on one 95 % interval [low, high] of a quantity the paper predicts to be positive (direction +1)
    or negative (-1), with the claim's smallest effect of interest `sesoi` (> 0, on the predicted side) or None."""
    if direction not in (1, -1):
        raise ValueError(f"direction {direction!r}: expected +1 or -1")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"interval [{low}, {high}]: not a finite interval")
    if sesoi is not None and not sesoi > 0:
        raise ValueError(f"smallest effect of interest {sesoi!r}: expected a positive size")
    if low == high:  # no spread (e.g. no problem changed its grade): the interval decides nothing
        return "inconclusive"
    lo, hi = (low, high) if direction > 0 else (-high, -low)  # the predicted side made positive
    if hi < 0:
        return "contradicted"
    if sesoi is not None and hi < sesoi:
        return "ruled out"
    return "reproduced" if lo > 0 else "inconclusive"


@dataclass
class Cell:
    word: str
    number: Text | None = None   # the value with its interval
    why: str = ""                # not run: the reason
    value: Num | None = None
    low: float | None = None
    high: float | None = None
    run: str = ""                # not run: the command that runs it
    note: str = ""               # what the number was measured with (ARM: the setting and how it was chosen)
    estimate: float | None = None
    n: int | None = None         # the problems the interval is over (its MDE's t has n - 1 degrees of freedom), if one
    unit: str = ""
    fmt: str = "+.3g"
    sesoi: float | None = None   # the smallest effect of interest applied, and where it comes from
    sesoi_from: str = ""
    paper: float | None = None   # the paper's effect for this very model (its own models only)
    p: float | None = None       # two-sided, against zero (report/pooling.py)
    holm: bool | None = None     # a reproduced or contradicted cell: whether its word survives Holm over the table
    detail: str = ""             # what the word rests on, in words (the smallest detectable effect, the paper's)


@dataclass
class Claim:
    key: str          # (a), (b), ...
    text: str         # the paper's claim, in a sentence
    measure: str      # what the number is
    section: str      # the report section with the evidence (its anchor)
    direction: int = +1
    cells: dict[str, Cell] = field(default_factory=dict)
    paper: str = ""   # what the paper reports for the claim, as context beside any model
    pooled: dict | None = None


def _cell(value: Num, low: Num, high: Num, unit: str, n: int | None) -> Cell:
    return Cell("", Text(value, unit, " ", interval(low, high)), "", value, low.value, high.value,
                estimate=value.value, n=n, unit=unit.strip(), fmt=value.fmt)


def _not_run(reason: str, cond: str = "", run: str = "") -> Cell:
    """A cell not run, for `reason` (a key of verdict.j2's `why`), with the command `run` that runs it."""
    why = plain(VERDICT, "why", reason=reason, cond=cond)
    if not why:
        raise ValueError(f"{VERDICT}: why: no sentence for the reason {reason!r}")
    return Cell("not run", None, why, run=run)


# ---- the claims ------------------------------------------------------------------------------------------

def _stats_layer(ctx: Context, name: str, cond: str, ds: str, layer: int, unit: str) -> Cell:
    st, f = ctx.stats[name], artifact("stats", name)
    if cond not in st["conditions"]:
        return _not_run("not extracted", cond)
    if ds not in st[cond]:
        return _not_run("one layer" if ds == "first_layer_lead_pct" else "not in statistics")
    return _cell(ctx.src.h5(f, f"{cond}/{ds}", fmt="+.1f", layer=layer),
                 ctx.src.h5(f, f"{cond}/{ds}_ci", fmt="+.1f", bound="low", layer=layer),
                 ctx.src.h5(f, f"{cond}/{ds}_ci", fmt="+.1f", bound="high", layer=layer), unit, st.get("n_samples"))


def _layer1(ctx: Context, name: str) -> int | None:
    """Layer 1's index among the statistics file's layers, or None when it was not extracted."""
    layers = ctx.stats[name]["layers"]
    return layers.index(0) if 0 in layers else None


def attention_drop(ctx: Context, name: str) -> Cell:
    li = _layer1(ctx, name)
    return _not_run("layer 1") if li is None else \
        _stats_layer(ctx, name, "mless", "layer_drop_pct", li, " %")


def first_layer_lead(ctx: Context, name: str) -> Cell:
    if _layer1(ctx, name) != 0:
        return _not_run("layer 1 first")
    return _stats_layer(ctx, name, "mless", "first_layer_lead_pct", 0, " points")


def mful_gap(ctx: Context, name: str) -> Cell:
    li = _layer1(ctx, name)
    if li is None or "mful" not in ctx.stats[name]["conditions"]:
        return _not_run("not extracted", "mful")
    return _stats_layer(ctx, name, "mless", "mful_gap_pct", li, " points")


def span_growth(ctx: Context, name: str) -> Cell:
    """The drop at the longest span minus at the shortest (first token of the sweep); the interval of the
    difference is the conservative one the two intervals give (their far ends)."""
    sw, f = ctx.sweep[name], artifact("sweep", name)
    counts = sw["counts"]
    nonzero = [i for i, c in enumerate(counts) if c > 0]
    if len(nonzero) < 2:
        return _not_run("span lengths")
    a, b = nonzero[0], nonzero[-1]
    n = {(i, j): ctx.src.h5(f, "token_0/drop_heads_pct_ci", fmt="+.1f", count=i, bound=j) for i in (a, b)
         for j in ("low", "high")}
    da = ctx.src.h5(f, "token_0/drop_heads_pct", fmt="+.1f", count=a)
    db = ctx.src.h5(f, "token_0/drop_heads_pct", fmt="+.1f", count=b)
    low, high = n[b, "low"].value - n[a, "high"].value, n[b, "high"].value - n[a, "low"].value
    text = say(VERDICT, "span_growth", short=counts[a], short_drop=da, short_low=n[a, "low"], short_high=n[a, "high"],
               long=counts[b], long_drop=db, long_low=n[b, "low"], long_high=n[b, "high"])
    return Cell("", text, "", None, low, high, estimate=db.value - da.value, unit="points", fmt="+.1f")


def activation(measure: str):
    def cell(ctx: Context, name: str) -> Cell:
        from meaningless_tokens.results.activations import ActivationView

        if name not in ctx.activations or "mless" not in ctx.activations[name]["conditions"]:
            return _not_run("not measured", "mless")
        d, lo, hi, _ = ActivationView(ctx, name).diff("mless", measure)
        return _cell(d, lo, hi, " points" if measure.startswith("near_zero") else "", ctx.activations[name]["n_samples"])
    return cell


def exp_run(*sets: str) -> str:
    """The `dvc exp run` that sets the given keys (one -S each)."""
    return "dvc exp run " + " ".join(f"-S '{x}'" for x in sets)


def _with_arm(conditions: list[str]) -> str:
    """The conditions list with `arm` added, as `-S` writes a list."""
    return "[" + ",".join([c for c in conditions if c != "arm"] + ["arm"]) + "]"


def accuracy(cond: str):
    def cell(ctx: Context, name: str) -> Cell:
        f = artifact("metrics/accuracy", name)
        conds = list(ctx.params.prompt.conditions)
        if name not in ctx.metrics:
            if cond != "arm":
                return _not_run("not in evaluate.models")
            sets = [f"evaluate.models=[{','.join(ctx.params.evaluated + [name])}]"]
            return _not_run("not in evaluate.models", run=exp_run(
                *sets, *([] if "arm" in conds else ["prompt.conditions=" + _with_arm(conds)])))
        if f"{cond}-none" not in ctx.src.json(f):
            if cond != "arm":
                return _not_run("not evaluated", cond)
            return _not_run("not evaluated", "arm", exp_run("prompt.conditions=" + _with_arm(conds)))
        d, lo, hi = (ctx.src.js(f, f"{cond}-none.{k}", 100, "+.1f") for k in ("delta", "ci95_low", "ci95_high"))
        return _cell(d, lo, hi, " points", ctx.metrics[name].get("n_problems"))
    return cell


def likelihood(cond: str, part: str):
    def cell(ctx: Context, name: str) -> Cell:
        if name not in ctx.likelihood:
            if cond != "arm":
                return _not_run("not in likelihood.models")
            return _not_run("not in likelihood.models", run=exp_run(f"likelihood.models=[{','.join(ctx.params.scored + [name])}]"))
        if f"{cond}-none" not in ctx.likelihood[name]["contrasts"]:
            if cond != "arm":
                return _not_run("not scored", cond)
            conds = ctx.likelihood[name]["conditions"]
            return _not_run("not scored", "arm", exp_run("likelihood.conditions=" + _with_arm(conds)))
        f, g = artifact("likelihood", name), f"contrasts/{cond}-none/{part}"
        fmt = "+.4f" if part == "solution" else "+.3f"
        out = _cell(ctx.src.h5(f, f"{g}/mean", fmt=fmt, group=0), ctx.src.h5(f, f"{g}/ci", fmt=fmt, group=0, bound="low"),
                    ctx.src.h5(f, f"{g}/ci", fmt=fmt, group=0, bound="high"), " nats/token" if part == "solution" else " nats",
                    ctx.likelihood[name]["n"])
        if cond == "arm":
            s = ctx.likelihood[name]["arm"]
            out.note = plain(VERDICT, "untuned", setting=setting(s["variant"], s["c"], s["percentage"]),
                             origin=s["origin"]["c"])
        return out
    return cell


def setting(variant: str, c: float, percentage: float) -> str:
    """An ARM setting as the report writes it."""
    return plain(VERDICT, "setting", c=f"{c:g}", quantile=variant == "gemma", percentage=f"{percentage:g}")


def arm_likelihood(ctx: Context, name: str) -> Cell:
    """(f2): the setting chosen on held-out problems (arm_tuning@<model>) where the model was tuned, else the
    likelihood stage's own setting (the paper's, the variant's fallback or params), saying which."""
    tuned = ctx.arm_tuning.get(name)
    if tuned is None:
        return likelihood("arm", "solution")(ctx, name)
    f, s = artifact("arm_tuning", name), tuned
    out = _cell(ctx.src.h5(f, "out_of_sample/mean", fmt="+.4f"), ctx.src.h5(f, "out_of_sample/ci", fmt="+.4f", bound="low"),
                ctx.src.h5(f, "out_of_sample/ci", fmt="+.4f", bound="high"), " nats/token", tuned.get("n_tested"))
    c, own = s["chosen"], s["own"]
    out.note = plain(VERDICT, "tuned", setting=setting(s["variant"], c["c"], c["percentage"]), n=s["n_tuning"],
                     grid=len(s["grid"]), own=setting(s["variant"], own["c"], own["percentage"]), origin=own["origin"])
    return out


# (key, section anchor, the side the paper predicts, the cell's function); each claim's sentence and measure are
# verdict.j2's `claim` and `measure`
CLAIMS = tuple((key, plain(VERDICT, "claim", key=key), plain(VERDICT, "measure", key=key), section, direction, fn)
               for key, section, direction, fn in (
    ("a", "attention", +1, attention_drop),
    ("b", "attention", +1, first_layer_lead),
    ("c", "meaningless-vs-meaningful-span", +1, mful_gap),
    ("d", "span-length", +1, span_growth),
    ("e1", "activation-shift", -1, activation("near_zero_robust")),
    ("e2", "activation-shift", -1, activation("near_zero_fixed")),
    ("e3", "activation-shift", +1, activation("l1")),
    ("e4", "activation-shift", +1, activation("l2")),
    ("f1", "accuracy", +1, accuracy("arm")),
    ("f2", "likelihood", +1, arm_likelihood),
    ("g1", "accuracy", +1, accuracy("mless")),
    ("g2", "accuracy", +1, accuracy("mful")),
    ("h1", "likelihood", +1, likelihood("mless", "solution")),
    ("h2", "likelihood", +1, likelihood("mless", "answer"))))
if not all(RULES.values()) or not all(text and measure for _, text, measure, *_ in CLAIMS):
    raise ValueError(f"{VERDICT}: a word's rule, or a claim's sentence or measure, is missing")


def claims(ctx: Context) -> list[Claim]:
    """Every claim's row, those ARM did not run in too (their cells say how to run it): each cell judged by `word`
    against its smallest effect of interest, beside the paper's number where the paper ran that model; the Holm
    marks over the table; the pooled cell where more than one model ran."""
    rows = []
    for key, text, measure, section, direction, fn in CLAIMS:
        rep = paper.reported(key) if ctx.benchmark == "MATH-500" else None
        row = Claim(key, text, measure, section, direction, paper=paper_context(rep))
        for n in ctx.names:
            row.cells[n] = cell = fn(ctx, n)
            if cell.word != "not run":
                judge(cell, direction, *smallest_effect(ctx, key, n, rep))
        rows.append(row)
    tested = [c for r in rows for c in r.cells.values() if c.p is not None]
    for c, keeps in zip(tested, pooling.holm([c.p for c in tested])):
        if c.word in ("reproduced", "contradicted"):
            c.holm = keeps
    if len(ctx.names) > 1:
        for r in rows:
            r.pooled = pooled(r, ctx.params.verdict.sesoi.get(r.key))
    return rows


def smallest_effect(ctx: Context, key: str, name: str, rep) -> tuple[float | None, str, float | None]:
    """(the smallest effect of interest, where it comes from, the paper's effect) for claim `key` on model `name`:
    the paper's effect where the paper reports one for this very model (and it lies on the predicted side), else
    params.yaml's verdict.sesoi.<key>, else none."""
    own = rep.values.get(paper.paper_name(ctx, name) or "") if rep else None
    if own is not None and own > 0:
        return own, "the paper's effect for this model", own
    declared = ctx.params.verdict.sesoi.get(key)
    return declared, f"verdict.sesoi.{key}" if declared is not None else "", own


def judge(c: Cell, direction: int, sesoi: float | None, sesoi_from: str, paper_value: float | None) -> None:
    """The cell's word, p-value and what the word rests on, from its interval (the one rule: `word`)."""
    c.word = word(c.low, c.high, direction, sesoi)
    c.sesoi, c.sesoi_from, c.paper = sesoi, sesoi_from, paper_value
    c.p = pooling.p_value(c.estimate, c.low, c.high)
    basis = (("grade" if c.unit == "points" and c.estimate == 0 else "spread") if c.low == c.high else
             c.word if c.word in ("ruled out", "inconclusive") else None)
    where = ratio = None
    if paper_value is not None:
        where = ("inside" if c.low <= paper_value <= c.high else "above" if paper_value > c.high else "below")
        ratio = f"{c.estimate / paper_value:.2g}" if paper_value else None
    c.detail = plain(VERDICT, "detail", basis=basis, unit=f" {c.unit}" if c.unit else "",
                     sesoi=None if sesoi is None else f"{direction * sesoi:{c.fmt}}",
                     mde=f"{pooling.mde(c.low, c.high, c.n):.2g}" if basis == "inconclusive" else None,
                     paper=None if paper_value is None else f"{paper_value:+g}", where=where, ratio=ratio)


def paper_context(rep) -> str:
    """What the paper reports for a claim, across its models (context for any model, never this run's model)."""
    if rep is None:
        return ""
    vals = sorted(rep.values.values())
    return plain(VERDICT, "paper_context", low=f"{vals[0]:+g}", high=None if vals[0] == vals[-1] else f"{vals[-1]:+g}",
                 models=len(vals), source=rep.source, figure=rep.status == "figure")


def pooled(r: Claim, sesoi: float | None) -> dict | None:
    """The claim's random-effects pooled cell over the models it was measured on (report/pooling.py)."""
    cells = [c for c in r.cells.values() if c.low is not None]
    res = pooling.pool([c.estimate for c in cells], [c.low for c in cells], [c.high for c in cells])
    if res is None:
        return None
    fmt, unit = cells[0].fmt, (f" {cells[0].unit}" if cells[0].unit else "")
    w = word(res.low, res.high, r.direction, sesoi)
    text = f"{res.estimate:{fmt}}{unit} [{res.low:{fmt}}, {res.high:{fmt}}]"
    spread = plain(VERDICT, "pooled", k=res.k, tau2=f"{res.tau2:.2g}", i2=f"{100 * res.i2:.0f}", unit=unit,
                   basis=w if w == "ruled out" or w == "inconclusive" and res.mde is not None else None,
                   sesoi=f"{r.direction * sesoi:{fmt}}" if w == "ruled out" else None,
                   mde=f"{res.mde:.2g}" if res.mde is not None else None)
    return {"word": w, "md": text, "detail": spread, "estimate": res.estimate, "low": res.low, "high": res.high,
            "tau2": res.tau2, "i2": res.i2, "k": res.k, "sesoi": sesoi}


def holm_sentence(rows: list[Claim]) -> str:
    """The table's many tests, said once."""
    tested = [c for r in rows for c in r.cells.values() if c.p is not None]
    decided = [c for c in tested if c.holm is not None]
    lost = [c for c in decided if not c.holm]
    return plain(VERDICT, "holm", tested=len(tested), decided=len(decided), lost=len(lost))


SECTIONS = {"attention": "Attention", "meaningless-vs-meaningful-span": "Meaningless vs meaningful span",
            "span-length": "Span length", "activation-shift": "Activation shift", "arm": "ARM",
            "likelihood": "Likelihood", "accuracy": "Accuracy", "examples": "Examples"}


def models_phrase(names: list[str], every: list[str]) -> str:
    """"all models", "no model", or the models named: a list that names every model says so instead."""
    return plain(VERDICT, "models_phrase", names=names, every=bool(names) and len(names) == len(every) and len(every) > 1)


def sentence(claim: Claim, disp) -> str:
    """The claim's verdict in one sentence: the models grouped by word, "all models" where it fits."""
    every = list(claim.cells)
    groups = [(w, [disp(n) for n, c in claim.cells.items() if c.word == w]) for w in WORDS]
    groups = [(w, ms) for w, ms in groups if ms]
    return plain(VERDICT, "sentence", key=claim.key, claim=claim.text, groups=groups,
                 phrase=models_phrase(groups[0][1], every) if len(groups) == 1 else None)


def counts(rows: list[Claim]) -> dict[str, int]:
    return {w: sum(c.word == w for r in rows for c in r.cells.values()) for w in WORDS}


# ---- power -----------------------------------------------------------------------------------------------

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
        out["accuracy"][n] = {"n": len(diff), "mde_points": _r(mde(diff)), "needed_for_paper_gain": need,
                              "benchmark_limit": limit, "seconds_per_problem_condition": _r(per),
                              "hours_needed": _r(need * len(conds) * per / 3600) if need and per else None,
                              "conditions": len(conds)}
    for n, lk in ctx.likelihood.items():
        res = lk["contrasts"].get("mless-none")
        if res is None:
            continue
        diff = res["solution"]["diff"]
        t = ctx.root / artifact("timing/likelihood", n)
        secs = ctx.src.json(artifact("timing/likelihood", n)).get("seconds") if t.is_file() else None
        m = mde(diff)
        out["likelihood"][n] = {"n": len(diff), "mde_nats_per_token": _r(m),
                                "mde_at_500": _r(mde(diff, at=limit)),
                                "seconds_this_run": secs,
                                "hours_at_500": _r(secs * limit / len(diff) / 3600) if secs else None}
    return out


def _r(x, digits: int = 3):
    return None if x is None else float(f"{x:.{digits}g}")


def summary(ctx: Context, rows: list[Claim], pw: dict) -> dict:
    """metrics/verdict.json: the table (words, values and intervals as the report shows them, what each word rests
    on, the pooled cells) and the power."""
    return {
        "rule": RULE,
        "rules": RULES,
        "models": {n: ctx.disp(n) for n in ctx.names},
        "claims": [{"key": r.key, "claim": r.text, "measure": r.measure, "section": r.section,
                    "direction": r.direction, "paper": r.paper, "pooled": r.pooled,
                    "cells": {n: {"word": c.word, "md": str(c.number) if c.number is not None else "",
                                  "why": c.why, "run": c.run, "note": c.note, "detail": c.detail,
                                  "estimate": c.estimate, "low": c.low, "high": c.high, "sesoi": c.sesoi,
                                  "sesoi_from": c.sesoi_from, "paper": c.paper,
                                  "p": None if c.p is None else _r(c.p, 4), "holm": c.holm}
                              for n, c in r.cells.items()}}
                   for r in rows],
        "counts": counts(rows),
        "holm": holm_sentence(rows),
        "power": pw,
    }
