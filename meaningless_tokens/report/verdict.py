"""The verdict's rule: the word a 95 % interval earns against the side the paper predicts (`word`), a claim's
row and cells (`Claim`, `Cell`), each cell judged against its smallest effect of interest (`judge`), the pooled
cell, the Holm marks' sentence and each claim's one-sentence verdict. `summary()` is what `metrics/verdict.json`
keeps, the input of `docs/results.md`.

What each claim reads, and from which measure's artifacts: report/claims.py; the power: report/power.py. The
sentences' words live in templates/verdict.j2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from meaningless_tokens.results.context import Context
from meaningless_tokens.report import paper, pooling
from meaningless_tokens.results.prose import plain
from meaningless_tokens.results.trace import Num, Text

WORDS = ("reproduced", "contradicted", "ruled out", "inconclusive", "not run")
# each word's rule, once, in a researcher's words (the table's footnote, metrics/verdict.json's "rules")
VERDICT = "verdict.j2"  # the sentences; this module decides what they say
RULES = {w: plain(VERDICT, "rule", word=w) for w in WORDS}
RULE = plain(VERDICT, "rules", rules=RULES)
if not all(RULES.values()):
    raise ValueError(f"{VERDICT}: a word's rule is missing")


def _claims(keys: str, cells: str, pooled: str, tau2: str) -> tuple[tuple[str, str, str], ...]:
    """metrics/verdict.json's values of the claims `keys` (claims are named by their key: `claims[b]`): the cells'
    kind of quantity (that of the output they are read from), the pooled estimate's and interval's, tau^2's."""
    return tuple(("verdict", f"claims[{k}].{part}.{value}", kind) for k in keys.split()
                 for part, kind in (("cells.*", cells), ("pooled", pooled)) for value in ("estimate", "low", "high")
                 ) + tuple(("verdict", f"claims[{k}].pooled.tau2", tau2) for k in keys.split())


# How `make verify` compares metrics/verdict.json (meaningless_tokens/verify/kinds.py assembles KINDS from these
# and every measure's): (artifact kind of store.PATHS, key glob, kind of quantity), each key by the quantity it
# holds, first match wins; the derived statistics' kinds follow from those of the cells they read
QUANTITIES = (
    ("verdict", "claims[*].cells.*.p", "p"),
    ("verdict", "claims[*].*sesoi", "exact"),  # params.yaml's verdict.sesoi, or the paper's
    ("verdict", "claims[*].cells.*.paper", "exact"),  # report/paper.yaml's
    ("verdict", "claims[*].pooled.i2", "i2"),
    ("verdict", "claims[*].*md", "printed"),
    ("verdict", "claims[*].*detail", "printed"),
    *_claims("a b c", "percent", "pooled-points", "tau2"),  # stats' `*_pct` values as they are
    *_claims("d", "points", "pooled-points", "tau2"),
    *_claims("e1 e2", "activation-points", "pooled-activation-points", "tau2-activation-points"),
    *_claims("e3 e4", "activation", "pooled-activation", "tau2-activation"),
    *_claims("f1 g1 g2", "exact", "exact", "exact"),  # accuracy: from grades
    *_claims("f2 h1 h2", "loglik", "pooled-loglik", "tau2-loglik"),
    ("verdict", "claims[*]*", "exact"),  # the claim, its measure, the paper's words, reasons, commands, settings
    ("verdict", "power.likelihood.*.mde*", "mde-loglik"),
    ("verdict", "power.accuracy.*", "exact"),  # from grades, 3 significant digits
    ("verdict", "power.paper_gain*", "exact"),  # report/paper.yaml's
    ("verdict", "*", "exact"),  # the rules, model names, counts, the Holm sentence (counts)
)


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


def rounded(x, digits: int = 3):
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
                                  "p": None if c.p is None else rounded(c.p, 4), "holm": c.holm}
                              for n, c in r.cells.items()}}
                   for r in rows],
        "counts": counts(rows),
        "holm": holm_sentence(rows),
        "power": pw,
    }
