"""The paper's claims the run tests, and what each reads from which measure's artifacts: one reader per claim
(`attention_drop`, `first_layer_lead`, `mful_gap` from the statistics, `span_growth` from the sweep, `activation`
from the activations, `accuracy` from the evaluation, `likelihood` and `arm_likelihood` from the likelihood and
ARM's tuning) that returns a model's cell with its number and interval, or a cell not run saying why and how to
run it. `CLAIMS` lists them with the report section holding the evidence; `claims()` builds the verdict's rows and
judges each cell by the rule of report/verdict.py.
"""

from __future__ import annotations

from meaningless_tokens.results.context import Context
from meaningless_tokens.report import paper, pooling
from meaningless_tokens.report.verdict import (VERDICT, Cell, Claim, judge, paper_context, pooled, smallest_effect)
from meaningless_tokens.results.prose import plain, say
from meaningless_tokens.results.trace import Num, Text, artifact, interval


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
if not all(text and measure for _, text, measure, *_ in CLAIMS):
    raise ValueError(f"{VERDICT}: a claim's sentence or measure is missing")


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

