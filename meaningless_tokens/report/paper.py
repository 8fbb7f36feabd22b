"""The paper beside this run: each seed chart's claims, checked against this run's numbers.

The seed charts (issue 20) name exact models, layers and heads. A configured model is "the paper's" when its name
in params.yaml's `models` is a key of `PAPER_MODELS` (the GPU profile's names; its display name is free); a claim is
checked when its chart shows that model at the seed's layer and head, and reads "agrees" or "does not agree" with
the number it rests on. The paper's accuracies are read from its bar chart (approximate; its grader counts a substring of the gold answer as
right, so they are not math-verify numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from meaningless_tokens.results.context import Context
from meaningless_tokens.config import yaml12
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.trace import ALL, Num, Text, artifact, excludes_zero, interval

# params model name (profiles/gpu.yaml) -> the paper's name for that model
PAPER_MODELS = {"qwen2_5-math-1_5b": "Qwen2.5-Math-1.5B", "qwen2_5-math-7b": "Qwen2.5-Math-7B",
                "llama3_1-8b-instruct": "Llama-3.1-8B-Instruct", "gemma3-4b-it": "Gemma-3-4b-it"}
NUMBERS = Path(__file__).with_name("paper.yaml")  # the paper's reported numbers, each block with its source


@cache
def numbers() -> dict:
    return yaml12.load(NUMBERS.read_text(encoding="utf-8"))


# MATH-500 accuracy in percent, w/o / w/ Mless / w/ Mful, read from the paper's "Results on Math-500" chart
ACCURACY = numbers()["accuracy"]["values"]
# verdict claim -> (block of paper.yaml, condition): the paper's effect is that condition's accuracy minus none's
EFFECTS = {"f1": ("arm", "arm"), "g1": ("accuracy", "mless"), "g2": ("accuracy", "mful")}


@dataclass(frozen=True)
class Reported:
    """The paper's effect for one claim: per paper model, in points, with where it was read and how surely."""
    values: dict[str, float]
    source: str
    status: str  # figure (read off a chart, approximate) | unchecked (not yet checked against the paper's text)


def reported(key: str) -> Reported | None:
    """The paper's numbers for verdict claim `key`, or None where the paper reports none."""
    if key not in EFFECTS:
        return None
    block, cond = EFFECTS[key]
    b = numbers()[block]
    return Reported({m: round(v[cond] - v["none"], 1) for m, v in b["values"].items()}, b["source"], b["status"])


COLLAPSE = 0.01  # "inside the span the weight collapses to about 0.00-0.01"

# per chart kind: (paper model, 0-based layer, 0-based heads) of each seed panel ("Head 22" is index 21)
SEEDS = {
    "layer-sweep": [("Qwen2.5-Math-7B", 0, [21])],
    "heads": [("Qwen2.5-Math-7B", 0, [0, 1, 7]), ("Llama-3.1-8B-Instruct", 0, [19, 24, 25])],
    "conditions": [("Qwen2.5-Math-7B", 0, [13])],
    "cross-model": [("Qwen2.5-Math-7B", 0, [0]), ("Llama-3.1-8B-Instruct", 0, [26]), ("Gemma-3-4b-it", 0, [7])],
}


def paper_name(ctx: Context, name: str) -> str | None:
    """The paper's name for configured model `name`, or None when the paper did not run it."""
    return PAPER_MODELS.get(name)


def _row(claim: str, number: Text, ok: bool, why: str = "") -> dict:
    return {"claim": claim, "number": number, "verdict": "agrees" if ok else "does not agree", "why": why}


def _drop(v, li: int, hi: int, cond: str = "mless") -> tuple[Text, bool, str]:
    pct, lo, up = v.drop_pct(cond, li, hi)
    ok = pct.value > 0 and excludes_zero(lo, up)
    why = "" if ok else ("the interval includes zero" if pct.value > 0 else "original tokens receive more attention, "
                                                                           "not less")
    return Text(f"drop {'' if cond == 'mless' else cond + ' '}", pct, " % ", interval(lo, up)), ok, why


def _span_rest(v, li: int, hi: int, cond: str) -> Num | None:
    """Mean weight the span's tokens after its first receive in the full prompt (None if the chart's x range cuts it)."""
    s, e = v.st["span"].get(cond, (-1, -1))
    if not (0 <= s < e - 1):
        return None
    return v.n(cond, "full_avg", "mean", ".5f", layer=li, head=hi, position=slice(s + 1, e))


def _missing(kind: str, paper: str, layer: int, heads: list[int]) -> dict:
    return {"claim": f"{paper} {label(layer)}, head(s) {', '.join(str(h + 1) for h in heads)}",
            "number": Text("not drawn: this run's chart does not show that model, layer and head"),
            "verdict": "not compared", "why": ""}


def claims(ctx: Context, kind: str, name: str | None) -> list[dict]:
    """The seed's claims for chart `kind` (of model `name` for per-model charts) with this run's numbers."""
    if kind == "accuracy":
        return _accuracy(ctx)
    rows = []
    for paper, layer, heads in SEEDS.get(kind, []):
        if name is not None and paper_name(ctx, name) != paper:
            continue
        if not any(paper_name(ctx, n) == paper for n in ctx.names):
            continue  # the paper's model is not in this run: nothing to compare
        models = [n for n in ctx.chart_models(kind) if paper_name(ctx, n) == paper and (name is None or n == name)]
        if not models:
            rows.append(_missing(kind, paper, layer, heads))
            continue
        v = ctx.view(models[0], kind)
        shown = v.heads if kind == "heads" else v.heads[:1]
        if layer not in v.layers or any(h not in shown for h in heads):
            rows.append(_missing(kind, paper, layer, heads))
            continue
        li = v.st["layers"].index(layer)
        for h in heads:
            hi = v.hi(h)
            if kind in ("layer-sweep", "heads"):
                number, ok, why = _drop(v, li, hi)
                rows.append(_row(f"{paper} {label(layer, h)}: with meaningless tokens the original tokens receive "
                                 "less attention (Mless lower than None)", number, ok, why))
            if kind == "heads" and paper == "Llama-3.1-8B-Instruct":
                rest = _span_rest(v, li, hi, "mless")
                if rest is not None:
                    rows.append(_row(f"{paper} {label(layer, h)}: inside the span the weight collapses to about "
                                     "0.00-0.01 (after its first token)", Text("mean weight of the span's tokens after "
                                                                              "the first ", rest), rest.value <= COLLAPSE,
                                     "" if rest.value <= COLLAPSE else f"above {COLLAPSE}"))
            if kind == "conditions":
                number, ok, why = _drop(v, li, hi)
                rows.append(_row(f"{paper} {label(layer, h)}: Mless lower than None on the original tokens", number,
                                 ok, why))
                if "mful" in v.conds:
                    dm, df = v.drop_pct("mless", li, hi), v.drop_pct("mful", li, hi)
                    ok = dm[1].value > df[2].value  # mless's interval lies above mful's
                    rows.append(_row(f"{paper} {label(layer, h)}: the meaningless span lowers it more than the "
                                     "meaningful one (Mless below Mful)",
                                     Text("drop mless ", dm[0], " % ", interval(dm[1], dm[2]), " vs mful ", df[0], " % ",
                                          interval(df[1], df[2])), ok, "" if ok else "the intervals overlap or are "
                                                                                    "in the other order"))
            if kind == "cross-model" and "mful" in v.conds:
                rm, rf = _span_rest(v, li, hi, "mless"), _span_rest(v, li, hi, "mful")
                if rm is not None and rf is not None:
                    ok = rm.value < rf.value
                    rows.append(_row(f"{paper} {label(layer, h)}: meaningless tokens receive less attention than the "
                                     "tokens of a random sentence at the same positions",
                                     Text("mean weight of the span's tokens after the first: meaningless ", rm,
                                          ", random sentence ", rf), ok, "" if ok else "not lower"))
    return rows


def _accuracy(ctx: Context) -> list[dict]:
    rows = []
    for n in ctx.chart_models("accuracy"):
        paper = paper_name(ctx, n)
        if paper not in ACCURACY or n not in ctx.metrics:  # a model of the paper not evaluated here
            continue
        f = artifact("metrics/accuracy", n)
        if "mless-none" not in ctx.src.json(f):
            continue
        d, lo, hi = (ctx.src.js(f, f"mless-none.{k}", 100, "+.1f") for k in ("delta", "ci95_low", "ci95_high"))
        ok = d.value > 0 and excludes_zero(lo, hi)
        gain = ACCURACY[paper]["mless"] - ACCURACY[paper]["none"]
        rows.append(_row(f"{paper}: w/ Mless above w/o ({ACCURACY[paper]['none']} → {ACCURACY[paper]['mless']} %, "
                         f"+{gain} points)", Text("mless − none ", d, " points ", interval(lo, hi)), ok,
                         "" if ok else ("the interval includes zero" if d.value > 0 else "not higher")))
    return rows


def accuracy_column(ctx: Context, name: str) -> dict[str, int] | None:
    """The paper's MATH-500 accuracies (percent) for the table's column, where the model is the paper's and the
    benchmark MATH-500."""
    return ACCURACY.get(paper_name(ctx, name) or "") if ctx.benchmark == "MATH-500" else None



# The paper's models' shapes: (layers, query heads, kv heads, hidden size, vocabulary)
SHAPES = {"Qwen2.5-Math-1.5B": (28, 12, 2, 1536, 151936), "Qwen2.5-Math-7B": (28, 28, 4, 3584, 152064),
          "Llama-3.1-8B-Instruct": (32, 32, 8, 4096, 128256), "Gemma-3-4b-it": (34, 8, 4, 2560, 262208)}
SHAPE_KEYS = ("num_layers", "num_heads", "num_kv_heads", "hidden_size", "vocab_size")


def shape_notes(ctx: Context) -> list[Text]:
    """For each model of exactly a paper model's shape (its manifest's facts): what it shows at Layer 1 under
    mless, the paper's measures: the drop of attention on original tokens, λ, the activation shift."""
    from meaningless_tokens.results.activations import ActivationView

    notes = []
    for n in ctx.names:
        f = artifact("manifest", n)
        facts = ctx.src.json(f)["facts"]
        paper = next((p for p, s in SHAPES.items() if tuple(facts.get(k) for k in SHAPE_KEYS) == s), None)
        if paper is None or "mless" not in ctx.stats[n]["conditions"]:
            continue
        shape = [ctx.src.js(f, f"facts.{k}", fmt="d") for k in SHAPE_KEYS]
        v = ctx.view(n)
        li = v.li
        drop = v.n("mless", "drop_pct", "mean", "+.1f", layer=li, head=ALL)
        parts = [f"{ctx.disp(n)} has the shape of the paper's {paper} (", shape[0], " layers, ", shape[1], " query / ",
                 shape[2], " kv heads, hidden ", shape[3], ", vocabulary ", shape[4], f"). At {label(v.layer)} under "
                 "mless its original tokens lose ", drop, " % of their attention on average over heads"]
        if n in ctx.activations and "mless" in ctx.activations[n]["conditions"]:
            a = ActivationView(ctx, n)
            lam = a.n("mless/lambda_mean", ".3f", "mean", layer=0, head=ALL)
            d, lo, hi, _ = a.diff("mless", "z_var")
            nz, nlo, nhi, _ = a.diff("mless", "near_zero_robust")
            parts += [f"; original queries after the span keep λ = ", lam, f" of their attention on original keys; "
                      f"{label(a.layer)}'s gate pre-activation variance changes by ", d, " ", interval(lo, hi),
                      " and the near-zero share of its activations by ", nz, " points ", interval(nlo, nhi)]
        notes.append(Text(*parts, "."))
    return notes
