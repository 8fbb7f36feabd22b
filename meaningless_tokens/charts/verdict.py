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
from meaningless_tokens.charts.context import Context
from meaningless_tokens.charts.phrases import label
from meaningless_tokens.charts.trace import Num, Text, artifact, interval
from meaningless_tokens.store import read_h5

RULE = ("A claim is reproduced when its 95 % interval excludes zero on the side the paper predicts, contradicted "
        "when it excludes zero on the other side, and inconclusive when it includes zero; not run when this run did "
        "not measure it.")
WORDS = ("reproduced", "contradicted", "inconclusive", "not run")


def word(low: float, high: float, direction: int = +1) -> str:
    """The verdict on one 95 % interval [low, high] of a quantity the paper predicts to be positive (direction +1)
    or negative (-1)."""
    if direction not in (1, -1):
        raise ValueError(f"direction {direction!r}: expected +1 or -1")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"interval [{low}, {high}]: not a finite interval")
    if low > 0 or high < 0:
        return "reproduced" if (low > 0) == (direction > 0) else "contradicted"
    return "inconclusive"


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


@dataclass
class Claim:
    key: str          # (a), (b), ...
    text: str         # the paper's claim, in a sentence
    measure: str      # what the number is
    section: str      # the report section with the evidence (its anchor)
    cells: dict[str, Cell] = field(default_factory=dict)


def _cell(value: Num, low: Num, high: Num, unit: str, direction: int = +1) -> Cell:
    return Cell(word(low.value, high.value, direction), Text(value, unit, " ", interval(low, high)), "", value,
                low.value, high.value)


def _not_run(why: str, run: str = "") -> Cell:
    return Cell("not run", None, why, run=run)


# ---- the claims ------------------------------------------------------------------------------------------

def _stats_layer(ctx: Context, name: str, cond: str, ds: str, index: str, unit: str) -> Cell:
    st, f = ctx.stats[name], artifact("stats", name)
    if cond not in st["conditions"]:
        return _not_run(f"{cond} not extracted")
    if ds not in st[cond]:
        return _not_run("one layer extracted" if ds == "first_layer_lead_pct" else "not in the statistics file")
    return _cell(ctx.src.h5(f, f"{cond}/{ds}[{index}]", fmt="+.1f"), ctx.src.h5(f, f"{cond}/{ds}_ci[0,{index}]",
                 fmt="+.1f"), ctx.src.h5(f, f"{cond}/{ds}_ci[1,{index}]", fmt="+.1f"), unit)


def _layer1(ctx: Context, name: str) -> str | None:
    layers = ctx.stats[name]["layers"]
    return str(layers.index(0)) if 0 in layers else None


def attention_drop(ctx: Context, name: str) -> Cell:
    li = _layer1(ctx, name)
    return _not_run("Layer 1 not extracted") if li is None else \
        _stats_layer(ctx, name, "mless", "layer_drop_pct", li, " %")


def first_layer_lead(ctx: Context, name: str) -> Cell:
    if _layer1(ctx, name) != "0":
        return _not_run("Layer 1 not extracted first")
    return _stats_layer(ctx, name, "mless", "first_layer_lead_pct", "0", " points")


def mful_gap(ctx: Context, name: str) -> Cell:
    li = _layer1(ctx, name)
    if li is None or "mful" not in ctx.stats[name]["conditions"]:
        return _not_run("mful not extracted")
    return _stats_layer(ctx, name, "mless", "mful_gap_pct", li, " points")


def span_growth(ctx: Context, name: str) -> Cell:
    """The drop at the longest span minus at the shortest (first token of the sweep); the interval of the
    difference is the conservative one the two intervals give (their far ends)."""
    sw, f = ctx.sweep[name], artifact("sweep", name)
    counts = sw["counts"]
    nonzero = [i for i, c in enumerate(counts) if c > 0]
    if len(nonzero) < 2:
        return _not_run("fewer than two span lengths")
    a, b = nonzero[0], nonzero[-1]
    n = {(i, j): ctx.src.h5(f, f"token_0/drop_heads_pct_ci[{i},{j}]", fmt="+.1f") for i in (a, b) for j in (0, 1)}
    da = ctx.src.h5(f, f"token_0/drop_heads_pct[{a}]", fmt="+.1f")
    db = ctx.src.h5(f, f"token_0/drop_heads_pct[{b}]", fmt="+.1f")
    low, high = n[b, 0].value - n[a, 1].value, n[b, 1].value - n[a, 0].value
    return Cell(word(low, high), Text(f"{counts[a]}: ", da, " % ", interval(n[a, 0], n[a, 1]), f"; {counts[b]}: ",
                                      db, " % ", interval(n[b, 0], n[b, 1])), "", None, low, high)


def activation(measure: str, direction: int):
    def cell(ctx: Context, name: str) -> Cell:
        from meaningless_tokens.charts.activations import ActivationView

        if name not in ctx.activations or "mless" not in ctx.activations[name]["conditions"]:
            return _not_run("mless activations not measured")
        d, lo, hi, _ = ActivationView(ctx, name).diff("mless", measure)
        return _cell(d, lo, hi, " points" if measure.startswith("near_zero") else "", direction)
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
            return _not_run("not in evaluate.models",
                            exp_run(*sets, *([] if "arm" in conds else ["prompt.conditions=" + _with_arm(conds)])))
        if f"{cond}-none" not in ctx.src.json(f):
            if cond != "arm":
                return _not_run(f"{cond} not evaluated")
            return _not_run("arm not evaluated", exp_run("prompt.conditions=" + _with_arm(conds)))
        d, lo, hi = (ctx.src.js(f, f"{cond}-none.{k}", 100, "+.1f") for k in ("delta", "ci95_low", "ci95_high"))
        return _cell(d, lo, hi, " points")
    return cell


def likelihood(cond: str, part: str):
    def cell(ctx: Context, name: str) -> Cell:
        if name not in ctx.likelihood:
            if cond != "arm":
                return _not_run("not in likelihood.models")
            return _not_run("not in likelihood.models", exp_run(f"likelihood.models=[{','.join(ctx.params.scored + [name])}]"))
        if f"{cond}-none" not in ctx.likelihood[name]["contrasts"]:
            if cond != "arm":
                return _not_run(f"{cond} not scored")
            conds = ctx.likelihood[name]["conditions"]
            return _not_run("arm not scored", exp_run("likelihood.conditions=" + _with_arm(conds)))
        f, g = artifact("likelihood", name), f"contrasts/{cond}-none/{part}"
        fmt = "+.4f" if part == "solution" else "+.3f"
        out = _cell(ctx.src.h5(f, f"{g}/mean[0]", fmt=fmt), ctx.src.h5(f, f"{g}/ci[0,0]", fmt=fmt),
                    ctx.src.h5(f, f"{g}/ci[0,1]", fmt=fmt), " nats/token" if part == "solution" else " nats")
        if cond == "arm":
            s = ctx.likelihood[name]["arm"]
            out.note = f"{setting(s['variant'], s['c'], s['percentage'])}, {s['origin']['c']}; not tuned"
        return out
    return cell


def setting(variant: str, c: float, percentage: float) -> str:
    """An ARM setting as the report writes it."""
    return f"c {c:g}, {'quantile' if variant == 'gemma' else 'percentile'} {percentage:g}"


def arm_likelihood(ctx: Context, name: str) -> Cell:
    """(f2): the setting chosen on held-out problems (arm_tuning@<model>) where the model was tuned, else the
    likelihood stage's own setting (the paper's, the variant's fallback or params), saying which."""
    tuned = ctx.arm_tuning.get(name)
    if tuned is None:
        return likelihood("arm", "solution")(ctx, name)
    f, s = artifact("arm_tuning", name), tuned
    out = _cell(ctx.src.h5(f, "out_of_sample/mean", fmt="+.4f"), ctx.src.h5(f, "out_of_sample/ci[0]", fmt="+.4f"),
                ctx.src.h5(f, "out_of_sample/ci[1]", fmt="+.4f"), " nats/token")
    c, own = s["chosen"], s["own"]
    out.note = (f"{setting(s['variant'], c['c'], c['percentage'])}, chosen on {s['n_tuning']} other problems among "
                f"{len(s['grid'])} settings (untuned: {setting(s['variant'], own['c'], own['percentage'])}, {own['origin']})")
    return out


# (key, claim, measure, section anchor, the cell's function)
CLAIMS = (
    ("a", f"Meaningless tokens lower the attention the original tokens receive in {label(0)}",
     f"drop under mless, heads of {label(0)} averaged, % of none", "attention", attention_drop),
    ("b", "The drop is largest in the first layer",
     f"{label(0)}'s drop minus the largest later layer's, points", "attention", first_layer_lead),
    ("c", "A meaningful span of the same length lowers it less",
     f"{label(0)} drop under mless minus under mful, points", "meaningless-vs-meaningful-span", mful_gap),
    ("d", "The drop grows with the span's length",
     "drop (all heads) at the shortest and the longest span; verdict on their difference", "span-length",
     span_growth),
    ("e1", f"{label(0)}'s MLP: fewer activations near zero (robust eps)",
     "mless − none, share in points", "activation-shift", activation("near_zero_robust", -1)),
    ("e2", f"{label(0)}'s MLP: fewer activations near zero (fixed eps)",
     "mless − none, share in points", "activation-shift", activation("near_zero_fixed", -1)),
    ("e3", f"{label(0)}'s MLP: larger mean |a| (L1)", "mless − none", "activation-shift", activation("l1", +1)),
    ("e4", f"{label(0)}'s MLP: larger RMS of a (L2)", "mless − none", "activation-shift", activation("l2", +1)),
    ("f1", "ARM on the first MLP raises accuracy", "arm − none, points", "accuracy", accuracy("arm")),
    ("f2", "ARM makes the reference solution more likely", "arm − none, log-prob per token", "likelihood",
     arm_likelihood),
    ("g1", "Meaningless tokens raise accuracy", "mless − none, points", "accuracy", accuracy("mless")),
    ("g2", "A meaningful span raises accuracy", "mful − none, points", "accuracy", accuracy("mful")),
    ("h1", "Meaningless tokens make the reference solution more likely", "mless − none, log-prob per token",
     "likelihood", likelihood("mless", "solution")),
    ("h2", "Meaningless tokens make the gold answer more likely", "mless − none, log-prob of the answer",
     "likelihood", likelihood("mless", "answer")),
)


def claims(ctx: Context) -> list[Claim]:
    """Every claim's row, those ARM did not run in too (their cells say how to run it)."""
    return [Claim(key, text, measure, section, {n: fn(ctx, n) for n in ctx.names})
            for key, text, measure, section, fn in CLAIMS]


SECTIONS = {"attention": "Attention", "meaningless-vs-meaningful-span": "Meaningless vs meaningful span",
            "span-length": "Span length", "activation-shift": "Activation shift", "arm": "ARM",
            "likelihood": "Likelihood", "accuracy": "Accuracy", "examples": "Examples"}


def models_phrase(names: list[str], every: list[str]) -> str:
    """"all models", "no model", or the models named: a list that names every model says so instead."""
    if not names:
        return "no model"
    if len(names) == len(every) and len(every) > 1:
        return "all models"
    return ", ".join(names)


def sentence(claim: Claim, disp) -> str:
    """The claim's verdict in one sentence: the models grouped by word, "all models" where it fits."""
    every = list(claim.cells)
    groups = [(w, [disp(n) for n, c in claim.cells.items() if c.word == w]) for w in WORDS]
    groups = [(w, ms) for w, ms in groups if ms]
    if len(groups) == 1:
        return f"({claim.key}) {claim.text}: {groups[0][0]} for {models_phrase(groups[0][1], every)}."
    return f"({claim.key}) {claim.text}: " + "; ".join(f"{w} for {', '.join(ms)}" for w, ms in groups) + "."


def counts(rows: list[Claim]) -> dict[str, int]:
    return {w: sum(c.word == w for r in rows for c in r.cells.values()) for w in WORDS}


# ---- power -----------------------------------------------------------------------------------------------

Z = 1.959963984540054 + 0.8416212335729143  # two-sided 5 % test, 80 % power
PAPER_GAIN = 2.0  # points: the paper's smallest mless − none gain on MATH-500 (charts/paper.py: ACCURACY)


def mde(diff: np.ndarray) -> float | None:
    """The minimum detectable mean of paired differences at 80 % power (two-sided 5 %), from their spread."""
    diff = np.asarray(diff, dtype=np.float64)
    if len(diff) < 2:
        return None
    sd = float(np.std(diff, ddof=1))
    return Z * sd / math.sqrt(len(diff)) if sd > 0 else None


def needed(diff: np.ndarray, effect: float) -> int | None:
    """Problems needed to detect a mean paired difference `effect` at 80 % power, at this run's spread."""
    diff = np.asarray(diff, dtype=np.float64)
    sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
    return math.ceil((Z * sd / effect) ** 2) if sd > 0 else None


def power(ctx: Context) -> dict:
    """Per outcome and model: n, the MDE, and (accuracy) the problems and hours the paper's gain would need."""
    from meaningless_tokens.charts.paper import ACCURACY

    out = {"accuracy": {}, "likelihood": {}, "paper_gain_points": PAPER_GAIN,
           "paper_gains": {k: v["mless"] - v["none"] for k, v in ACCURACY.items()}}
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
                                "mde_at_500": _r(m * math.sqrt(len(diff) / limit)) if m else None,
                                "seconds_this_run": secs,
                                "hours_at_500": _r(secs * limit / len(diff) / 3600) if secs else None}
    return out


def _r(x, digits: int = 3):
    return None if x is None else float(f"{x:.{digits}g}")


def summary(ctx: Context, rows: list[Claim], pw: dict) -> dict:
    """metrics/verdict.json: the table (words, values and intervals as the report shows them) and the power."""
    return {
        "rule": RULE,
        "models": {n: ctx.disp(n) for n in ctx.names},
        "claims": [{"key": r.key, "claim": r.text, "measure": r.measure, "section": r.section,
                    "cells": {n: {"word": c.word, "md": str(c.number) if c.number is not None else "",
                                  "why": c.why, "run": c.run, "note": c.note, "low": c.low, "high": c.high}
                              for n, c in r.cells.items()}}
                   for r in rows],
        "counts": counts(rows),
        "power": pw,
    }
