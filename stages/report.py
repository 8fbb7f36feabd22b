"""report: reports/report.html and reports/report.md, every chart explained with numbers from the data.

Inputs: the statistics (`artifacts/stats/<model>.h5`), evaluation (`artifacts/eval/<model>.h5`,
`metrics/accuracy/<model>.json`), model manifests, timings and the charts in `reports/figures/`.
Every number in the text is read from one of those files at render time and remembers where it came
from: in the HTML each sits in `<span class="num" data-src=FILE data-key=KEY data-op=OP ...>`, so a
reader (and the tests) can trace it back. Sentences are chosen from the numbers, so another run gives
other, still true, sentences. Text that comes from data, models or params is escaped (HTML autoescape;
Markdown code blocks and escaping).

The HTML is one self-contained file (charts embedded as PNG data URIs, no scripts, no network); the
Markdown links the charts beside it (`figures/*.png`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from markupsafe import Markup, escape

from stages import cli, figures
from stages.config import Params
from stages.stats import stats_path
from stages.store import ArtifactError, atomic_path, read_h5

OUT_DIR = Path("reports")
TEMPLATES = Path(__file__).parent / "templates"
NAMES = {"none": "none (no insertion)", "mless": "mless (meaningless tokens)", "mful": "mful (meaningful span)"}


# ---- numbers that know where they come from --------------------------------------------------------

@dataclass(frozen=True)
class Num:
    """A number read from an artifact: `src` file, `key` inside it, reduced by `op`, times `scale`."""
    value: float
    src: str
    key: str
    op: str = "value"
    scale: float = 1.0
    fmt: str = ".3g"

    def __str__(self) -> str:
        return format(round(self.value) if self.fmt == "d" else self.value, self.fmt)

    def __html__(self) -> str:
        attrs = {"src": self.src, "key": self.key, "op": self.op, "scale": repr(self.scale),
                 "fmt": self.fmt, "value": repr(float(self.value))}
        title = f"{self.src}: {self.key}" + ("" if self.op == "value" else f" ({self.op})") + \
            ("" if self.scale == 1 else f" x {self.scale:g}")
        return Markup('<span class="num" title="{}" {}>{}</span>').format(
            title, Markup(" ".join(f'data-{k}="{escape(v)}"' for k, v in attrs.items())), str(self))


# characters that start Markdown markup inline (a bracket escaped makes "(" and "!" inert too)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~$])")


def md_escape(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", str(text))


class Text:
    """A sentence of literal strings and Nums, rendered escaped for HTML (`__html__`) or Markdown (`str`)."""

    def __init__(self, *parts):
        self.parts = parts

    def __html__(self) -> str:
        return Markup("").join(p if isinstance(p, (Num, Text)) else escape(p) for p in self.parts)

    def __str__(self) -> str:
        return "".join(str(p) if isinstance(p, (Num, Text)) else md_escape(p) for p in self.parts)


_INDEX = re.compile(r"^(?P<ds>[^\[]+)(?:\[(?P<idx>[^\]]*)\])?$")


def parse_index(text: str | None) -> tuple:
    if not text:
        return ()
    out = []
    for part in text.split(","):
        if ":" in part:
            a, b = part.split(":")
            out.append(slice(int(a) if a else None, int(b) if b else None))
        else:
            out.append(int(part))
    return tuple(out)


class Sources:
    """Reads numbers from the artifacts under `root`, caching opened arrays."""

    def __init__(self, root: Path):
        self.root = root
        self._arrays: dict[tuple[str, str], np.ndarray] = {}
        self._json: dict[str, dict] = {}

    def h5(self, src: str, key: str, op: str = "value", scale: float = 1.0, fmt: str = ".3g") -> Num:
        m = _INDEX.match(key)
        ds, idx = m["ds"], parse_index(m["idx"])
        if (src, ds) not in self._arrays:
            kind = "stats" if src.startswith("artifacts/stats/") else "eval"
            with read_h5(self.root / src, kind) as f:
                if ds.startswith("@"):  # a root attribute
                    self._arrays[(src, ds)] = np.asarray(f.attrs[ds[1:]])
                elif ds in f:
                    self._arrays[(src, ds)] = f[ds][()]
                else:
                    raise ArtifactError(f"{self.root / src}: missing dataset {ds} (written by another version?)")
        sel = self._arrays[(src, ds)][idx]
        if op == "value":
            value = float(sel)
        elif op == "mean":
            value = float(np.nanmean(sel))
        elif op == "max":
            value = float(np.nanmax(sel))
        elif op == "argmax":  # position on the sliced axis, counted from the start of the array
            start = next((s.start or 0 for s in idx if isinstance(s, slice)), 0)
            value = float(np.nanargmax(sel) + start)
        else:
            raise ValueError(op)
        return Num(value * scale, src, key, op, scale, fmt)

    def js(self, src: str, key: str, scale: float = 1.0, fmt: str = ".3g") -> Num:
        value = self.json(src)
        try:
            for k in key.split("."):
                value = value[k]
        except KeyError:
            raise ArtifactError(f"{self.root / src}: no key {key!r} (written by another version?)") from None
        return Num(float(value) * scale, src, key, "value", scale, fmt)

    def json(self, src: str) -> dict:
        if src not in self._json:
            path = self.root / src
            if not path.is_file():
                raise ArtifactError(f"{path}: missing (run: dvc repro)")
            try:
                self._json[src] = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ArtifactError(f"{path}: not valid JSON ({e})") from None
        return self._json[src]


def interval(lo: Num, hi: Num) -> Text:
    return Text("[", lo, ", ", hi, "]")


def excludes_zero(lo: Num, hi: Num) -> bool:
    return lo.value > 0 or hi.value < 0


# ---- per chart ---------------------------------------------------------------------------------------

@dataclass
class Chart:
    """One chart and its five explanations (lists of Text)."""
    stem: str
    title: str
    overview: list
    axes: list
    analysis: list
    observations: list
    interpretation: list
    png: str = ""          # base64, filled in by run()


class ModelView:
    """Numbers of one model's statistics file, at the layer and heads the charts show."""

    def __init__(self, src: Sources, params: Params, name: str, st: dict):
        self.src, self.name, self.st = src, name, st
        self.file = str(stats_path(name))
        self.disp = st["display_name"]
        self.heads = figures.choose_heads(params, name, st)
        self.layer = params.figures.layer
        self.li = figures._layer_index(params, name, st, self.layer, "figures.layer")
        self.P, self.F = params.figures.original_positions, params.figures.full_positions
        self.conds = st["conditions"]
        self.span = st["span"].get("mless", (-1, -1))

    def hi(self, head: int) -> int:
        return self.st["heads"].index(head)

    def n(self, cond: str, ds: str, idx: str, op: str = "value", fmt: str = ".3g", scale: float = 1.0) -> Num:
        return self.src.h5(self.file, f"{cond}/{ds}[{idx}]", op, scale, fmt)

    def orig_mean(self, cond: str, li: int, hi: int) -> Num:
        return self.n(cond, "orig_mean", f":,{li},{hi}", "mean", ".4f")

    def drop_pct(self, cond: str, li: int, hi: int) -> tuple[Num, Num, Num]:
        return (self.n(cond, "drop_pct", f"{li},{hi}", fmt="+.1f"),
                self.n(cond, "drop_pct_ci", f"0,{li},{hi}", fmt="+.1f"),
                self.n(cond, "drop_pct_ci", f"1,{li},{hi}", fmt="+.1f"))

    def span_mass(self, cond: str, li: int, hi: int) -> tuple[Num, Num, Num]:
        return (self.n(cond, "span_mass", f"{li},{hi}", fmt=".1f", scale=100),
                self.n(cond, "span_mass_ci", f"0,{li},{hi}", fmt=".1f", scale=100),
                self.n(cond, "span_mass_ci", f"1,{li},{hi}", fmt=".1f", scale=100))

    def peak(self, cond: str, li: int, hi: int) -> tuple[Num, Num]:
        """Where the average attention over original positions 1..P-1 is largest (position 0, the
        attention sink, is left out) and its value."""
        rng = f"{li},{hi},1:{self.P}"
        return self.n(cond, "original_avg", rng, "argmax", "d"), self.n(cond, "original_avg", rng, "max", ".4f")


def eval_path(name: str) -> Path:
    return Path("artifacts/eval") / f"{name}.h5"


def label(layer: int, head: int | None = None) -> str:
    return f"Layer {layer + 1}" + (f" Head {head}" if head is not None else "")


def verdict_drop(pct: Num, lo: Num, hi: Num, where: str) -> Text:
    """The paper's prediction for attention on original tokens, checked against one drop interval."""
    if excludes_zero(lo, hi):
        agree = "agrees with" if pct.value > 0 else "runs against"
        return Text(f"At {where} the drop is ", pct, " % with interval ", interval(lo, hi),
                    f", which excludes zero: this run {agree} the prediction.")
    return Text(f"At {where} the drop is ", pct, " % but its interval ", interval(lo, hi),
                " includes zero: this run neither confirms nor refutes the prediction there.")


HYPOTHESIS = ("The paper's account: in the first layers the inserted meaningless tokens take part of the "
              "attention that the original tokens would otherwise receive, so the original tokens' weights "
              "drop and the attention outputs shift; a meaningful span of the same length should not act "
              "the same way.")


AXES_ORIGINAL = ("x axis: original token position j, the token's index in the none prompt (0 is the first "
                 "token, the attention sink); under mless and mful the same token sits after the span, and "
                 "the curves compare it with itself.")
AXES_WEIGHT = ("y axis: average attention weight the token receives, averaged over its queries, then over "
               "problems (rows of attention sum to 1, so small values are normal for long prompts).")
AXES_LAYERS = "Layers are numbered from 1 on charts and in this report (Layer 1 is index 0 in the files); heads from 0."


def chart_layer_sweep(v: ModelView, sweep: list[int], qs: str) -> Chart:
    h = v.heads[0]
    hi = v.hi(h)
    n = v.src.h5(v.file, "@n_samples", fmt="d")
    layers = ", ".join(str(x + 1) for x in sweep)
    rows, drops = [], []
    for layer in sweep:
        li = v.st["layers"].index(layer)
        mn, mm = v.orig_mean("none", li, hi), v.orig_mean("mless", li, hi)
        pct, lo, up = v.drop_pct("mless", li, hi)
        pn, vn = v.peak("none", li, hi)
        pm, vm = v.peak("mless", li, hi)
        mass, mlo, mhi = v.span_mass("mless", li, hi)
        drops.append((layer, pct, lo, up, mn, mm))
        rows.append(Text(f"{label(layer, h)}: mean attention on original tokens (positions 1 on) is ", mn,
                         " without insertion and ", mm, " with meaningless tokens, a drop of ", pct, " % ",
                         interval(lo, up), ". Highest point after the sink: position ", pn, " (", vn,
                         ") for none, position ", pm, " (", vm, ") for mless. The span takes ", mass, " % ",
                         interval(mlo, mhi), " of the original queries' attention."))
    top = max(drops, key=lambda d: d[1].value)
    lower = [d for d in drops if d[5].value < d[4].value]
    obs = [Text(f"Meaningless tokens lower the mean attention on original tokens in {len(lower)} of "
                f"{len(drops)} layers shown."),
           Text(f"The drop is largest in {label(top[0])} (", top[1], " %)",
                "; its interval excludes zero." if excludes_zero(top[2], top[3]) else
                "; its interval includes zero.")]
    first = drops[0]
    later = [d for d in drops[1:]]
    if later:
        strongest_first = all(first[1].value >= d[1].value for d in later)
        obs.append(Text(f"{label(first[0])} shows {'the largest' if strongest_first else 'not the largest'} drop of "
                        "the layers shown, ", "as the paper reports for the first layer." if strongest_first else
                        "unlike the paper, which reports the strongest change in the first layer."))
    return Chart(
        f"{v.name}-layer-sweep", f"{v.disp}: Head {h} across layers {layers}",
        [Text(f"{v.disp}, head {h}, layers {layers}: the attention each original token receives without "
              "insertion (none) and with 55 meaningless tokens (mless), averaged over the "
              f"{qs} queries and over ", n, " problems. The head is the one whose mean attention on "
              f"original tokens drops most in {label(v.layer)}, in absolute terms (or the first one named in "
              "figures.heads).")],
        [Text(AXES_ORIGINAL), Text(AXES_WEIGHT), Text("Blue: none; red: mless. " + AXES_LAYERS)],
        rows, obs,
        [Text(HYPOTHESIS), verdict_drop(first[1], first[2], first[3], label(first[0], h))])


def chart_heads(v: ModelView) -> Chart:
    li = v.li
    s, e = v.span
    rows, drops, sig, collapse = [], [], 0, []
    for h in v.heads:
        hi = v.hi(h)
        mn, mm = v.orig_mean("none", li, hi), v.orig_mean("mless", li, hi)
        pct, lo, up = v.drop_pct("mless", li, hi)
        mass, mlo, mhi = v.span_mass("mless", li, hi)
        parts = [f"Head {h}: original tokens receive ", mn, " (none) and ", mm, " (mless) on average, a drop of ",
                 pct, " % ", interval(lo, up), "; the span takes ", mass, " % ", interval(mlo, mhi),
                 " of the original queries' attention."]
        if 0 <= s < e - 1 and e <= v.F:
            first_tok = v.n("mless", "full_avg", f"{li},{hi},{s}", fmt=".4f")
            rest = v.n("mless", "full_avg", f"{li},{hi},{s + 1}:{e}", "mean", ".4f")
            parts += [" In the full mless prompt the span's first token (position ", str(s), ") receives ", first_tok,
                      ", its other tokens ", rest, " on average."]
            collapse.append((h, rest.value < first_tok.value / 2))
        rows.append(Text(*parts))
        drops.append((h, pct))
        sig += excludes_zero(lo, up) and pct.value > 0
    top = max(drops, key=lambda d: d[1].value)
    obs = [Text(f"Of the {len(v.heads)} heads shown, head {top[0]} has the largest drop in percent (",
                top[1], f" %); {sig} of them have a drop whose interval lies above zero.")]
    if collapse:
        fell = [h for h, c in collapse if c]
        obs.append(Text(
            f"The span's attention collapses after its first token (the other span tokens receive less than half "
            f"of what the first receives) in head{'s' if len(fell) > 1 else ''} {', '.join(map(str, fell))}." if fell else
            "In none of these heads does the span's attention collapse after its first token: it stays "
            "spread over the span.",
            f" Heads where it stays spread: {', '.join(str(h) for h, c in collapse if not c)}." if fell and
            len(fell) < len(collapse) else ""))
    return Chart(
        f"{v.name}-heads", f"{v.disp}: {label(v.layer)}, heads {', '.join(map(str, v.heads))}",
        [Text(f"{v.disp}, {label(v.layer)}, heads {', '.join(map(str, v.heads))} (the heads whose mean attention on "
              "original tokens drops most under mless, in absolute terms, unless figures.heads names them). Top row: attention on original tokens, none vs mless. "
              "Bottom row: what every position of the whole mless prompt receives, the meaningless span shaded.")],
        [Text("Top row: " + AXES_ORIGINAL), Text("Bottom row: x axis is the token position in the mless prompt, "
              f"the span covering positions {s} to {e - 1}."), Text(AXES_WEIGHT),
         Text("Blue: none; red: mless; shaded band: the meaningless tokens. " + AXES_LAYERS)],
        rows, obs,
        [Text(HYPOTHESIS), Text(f"{sig} of {len(v.heads)} heads shown agree: their drop's interval lies above zero"
                                + ("." if sig == len(v.heads) else "; for the others it includes zero or lies below "
                                   "it, so they do not support the prediction."))])


def chart_conditions(v: ModelView) -> Chart:
    h = v.heads[0]
    li, hi = v.li, v.hi(h)
    means = {c: v.orig_mean(c, li, hi) for c in v.conds}
    rows = [Text("Mean attention on original tokens (positions 1 on): ",
                 *[p for c in v.conds for p in (f"{c} ", means[c], "; " if c != v.conds[-1] else ".")])]
    drop, mass = {}, {}
    for c in v.conds:
        if c == "none":
            continue
        drop[c], mass[c] = v.drop_pct(c, li, hi), v.span_mass(c, li, hi)
        rows.append(Text(f"{c}: drop ", drop[c][0], " % ", interval(*drop[c][1:]), "; the span takes ", mass[c][0],
                         " % ", interval(*mass[c][1:]), " of the original queries' attention."))
    order = sorted(v.conds, key=lambda c: -means[c].value)
    obs = [Text("Original tokens receive the most attention under ", order[0], " and the least under ",
                order[-1], ".")]
    if "mless" in drop and "mful" in drop:
        more = "more" if mass["mless"][0].value > mass["mful"][0].value else "less"
        obs.append(Text(f"The meaningless span draws {more} attention than the meaningful one (", mass["mless"][0],
                        " % vs ", mass["mful"][0], " %)."))
        apart = drop["mless"][1].value > drop["mful"][2].value or drop["mful"][1].value > drop["mless"][2].value
        obs.append(Text("The drop under mless is ", drop["mless"][0], " % against ", drop["mful"][0], " % under mful; ",
                        "their intervals do not overlap." if apart else "their intervals overlap."))
        interp = [Text(HYPOTHESIS), Text("This run separates the two spans: " if apart else
                                         "This run does not separate the two spans at this head: ",
                                         "the drops' intervals ", "do not overlap." if apart else "overlap.")]
    else:
        interp = [Text(HYPOTHESIS)]
    return Chart(
        f"{v.name}-conditions", f"{v.disp}: {label(v.layer, h)}, all conditions",
        [Text(f"{v.disp}, {label(v.layer, h)}: left, the attention original tokens receive under every condition; "
              "right, what each position of the whole prompt receives under mless and mful, whose spans have the "
              "same length and position.")],
        [Text("Left: " + AXES_ORIGINAL), Text("Right: x axis is the token position in the mless / mful prompt."),
         Text(AXES_WEIGHT), Text("Blue: none; red: mless; green: mful; shaded band: the inserted span. " + AXES_LAYERS)],
        rows, obs, interp)


def chart_cross_model(views: list[ModelView]) -> Chart:
    rows, means = [], []
    for v in views:
        h = v.heads[0]
        li, hi = v.li, v.hi(h)
        mean_drop = v.n("mless", "drop_pct", f"{li},:", "mean", "+.1f")
        ml = v.span_mass("mless", li, hi)[0]
        parts = [f"{v.disp}, {label(v.layer, h)}: the meaningless span takes ", ml, " % of the original queries' attention"]
        if "mful" in v.conds:
            parts += [", the meaningful span ", v.span_mass("mful", li, hi)[0], " %"]
        parts += [f". Mean drop over all heads of {label(v.layer)}: ", mean_drop, " %."]
        rows.append(Text(*parts))
        means.append((v, mean_drop))
    top = max(means, key=lambda m: m[1].value)
    pos = [v.disp for v, m in means if m.value > 0]
    obs = [Text(f"{top[0].disp} shows the largest change: a mean drop of ", top[1], " % over its heads of "
                f"{label(top[0].layer)}."),
           Text(f"The mean drop is positive for {len(pos)} of {len(means)} models"
                + (f" ({', '.join(pos)})." if pos else "."))]
    return Chart(
        "cross-model", "All models: meaningless vs meaningful span",
        [Text("For each model, the head of its charts in the chosen layer: what every position of the whole prompt "
              "receives with the meaningless span (\"Meaningless tokens\") and with the meaningful span (\"Random "
              "sentence\").")],
        [Text("x axis: token position in the prompt; the shaded band is the inserted span."), Text(AXES_WEIGHT),
         Text("Red: mless; green: mful. " + AXES_LAYERS)],
        rows, obs,
        [Text(HYPOTHESIS), Text("If the effect is general, every model's original tokens lose attention under mless; "
                                f"here {len(pos)} of {len(means)} do on average over the layer's heads.")])


def chart_accuracy(src: Sources, names: list[str], disp: dict[str, str]) -> tuple[Chart, list[dict]]:
    rows, table, gains = [], [], []
    for name in names:
        f = f"metrics/accuracy/{name}.json"
        n = src.js(f, "n_problems", fmt="d")
        conds = [c for c in ("none", "mless", "mful") if c in src.json(f).get("accuracy", {})]
        acc = {c: src.js(f, f"accuracy.{c}", 100, ".1f") for c in conds}
        cor = {c: src.js(f, f"correct.{c}", fmt="d") for c in conds}
        paper = {c: src.js(f, f"paper_accuracy.{c}", 100, ".1f") for c in conds}
        pairs = {}
        for c in conds:
            if c != "none":
                k = f"{c}-none"
                pairs[c] = (src.js(f, f"{k}.delta", 100, "+.1f"), src.js(f, f"{k}.ci95_low", 100, "+.1f"),
                            src.js(f, f"{k}.ci95_high", 100, "+.1f"), src.js(f, f"{k}.mcnemar_p", fmt=".2f"))
        parts = [f"{disp[name]}: "]
        for c in conds:
            parts += [f"{c} ", acc[c], " % (", cor[c], "/", n, ")", "; " if c != conds[-1] else "."]
        for c, (d, lo, hi, p) in pairs.items():
            parts += [f" {c} − none: ", d, " points ", interval(lo, hi), ", McNemar p = ", p, "."]
        boxed = {c: src.js(f, f"boxed_rate.{c}", 100, ".0f") for c in conds}
        parts += [" Outputs that wrote a complete \\boxed{} answer: "]
        for c in conds:
            parts += [f"{c} ", boxed[c], " %", "; " if c != conds[-1] else
                      " (the others are graded from math-verify's fallback: the last expression in the text)."]
        rows.append(Text(*parts))
        table.append({"model": disp[name], "n": n, "acc": acc, "correct": cor, "paper": paper, "pairs": pairs,
                      "conds": conds})
        if "mless" in pairs:
            gains.append((name, pairs["mless"]))
    obs = []
    for row in table:
        best = max(row["conds"], key=lambda c: row["acc"][c].value)
        ties = [c for c in row["conds"] if row["acc"][c].value == row["acc"][best].value]
        obs.append(Text(f"{row['model']}: " + (f"{', '.join(ties)} tie at " if len(ties) > 1 else f"{best} is highest at "),
                        row["acc"][best], " %."))
    if gains:
        up = [disp[g[0]] for g in gains if g[1][0].value > 0]
        sure = [disp[g[0]] for g in gains if g[1][1].value > 0]
        obs.append(Text(f"Meaningless tokens raise accuracy for {len(up)} of {len(gains)} models"
                        + (f" ({', '.join(up)})" if up else "") + f"; the interval excludes zero for {len(sure)}."))
        interp = [Text("The paper reports higher MATH-500 accuracy with meaningless tokens (mless) than without (none). "),
                  Text(f"This run agrees for {', '.join(sure)}." if sure else
                       "In this run no model's mless − none interval excludes zero, so the run can neither confirm nor "
                       "refute the gain; more problems (evaluate.n_samples) and longer answers (evaluate.max_new_tokens) "
                       "narrow the intervals.")]
    else:
        interp = [Text("The mless condition was not evaluated, so the paper's accuracy claim is not tested here.")]
    n0 = table[0]["n"] if table else None
    return Chart(
        "accuracy", "MATH-500 accuracy by prompt condition",
        [Text("MATH-500 accuracy of each model under each condition, on ", n0, " problems per model, greedy "
              "decoding, graded by math-verify against the gold answer; the same problems under every condition.")
         if n0 is not None else Text("MATH-500 accuracy.")],
        [Text("Bars: models; colours: conditions (blue none, red mless, green mful); y axis: accuracy in percent; the "
              "label on each bar is correct / problems.")],
        rows, obs, interp), table



# ---- examples and provenance -------------------------------------------------------------------------

def example(params: Params, root: Path, name: str, disp: str, limit: int = 700) -> dict:
    """One problem where the conditions' grades differ (else the first), with each condition's output."""
    from stages.prompts import load_math500

    path = root / eval_path(name)
    with read_h5(path, "eval", ("problems/index", "problems/answer")) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        index = f["problems/index"][()]
        answers = [a.decode() if isinstance(a, bytes) else str(a) for a in f["problems/answer"][()]]
        correct = np.stack([f[c]["correct"][()] for c in conds])
        k = next((k for k in range(len(index)) if correct[:, k].min() != correct[:, k].max()), 0)
        rows = []
        for c in conds:
            out = f[c]["output"][k]
            out = out.decode() if isinstance(out, bytes) else str(out)
            ext = f[c]["extracted"][k]
            rows.append({"condition": c, "correct": bool(f[c]["correct"][k]),
                         "extracted": ext.decode() if isinstance(ext, bytes) else str(ext),
                         "n_tokens": int(f[c]["n_tokens"][k]), "stop": (f[c]["stop"][k]).decode()
                         if isinstance(f[c]["stop"][k], bytes) else str(f[c]["stop"][k]),
                         "output": out if len(out) <= limit else out[:limit] + " […]"})
    problems, _ = load_math500(params)
    problem = problems[int(index[k])]
    return {"model": disp, "index": int(index[k]), "level": problem.level, "subject": problem.subject,
            "problem": problem.problem, "answer": answers[k], "rows": rows,
            "differs": bool(correct[:, k].min() != correct[:, k].max())}


def provenance_rows(src: Sources, root: Path, name: str, disp: str) -> dict:
    manifest = src.json(f"artifacts/models/{name}.json")
    with read_h5(root / stats_path(name), "stats") as f:
        sp = json.loads(f.attrs["provenance"])
    with read_h5(root / eval_path(name), "eval") as f:
        ep = json.loads(f.attrs["provenance"])
    xp = sp["extract_provenance"]
    source = manifest.get("source", {})
    timing, commits = {}, {}
    for stage, key in (("extract", "seconds"), ("evaluate", "seconds_this_run"), ("stats", None)):
        f = f"metrics/timing/{stage}-{name}.json"  # the run's sidecar: run time and the git commit that ran
        sidecar = src.json(f) if (root / f).is_file() else {}
        if key:
            timing[stage] = src.js(f, key, fmt=".0f") if sidecar else None
        commits[stage] = str(sidecar.get("git_commit", "?")) + ("-dirty" if sidecar.get("git_dirty") else "")
    return {
        "model": disp, "name": name,
        "source": source.get("kind", "?") + ": " + ", ".join(
            str(x) for x in (source.get("packages") or [source.get("repo_id") or source.get("path") or ""])),
        "source_sha256": source.get("gguf_sha256") or source.get("sha256") or "",
        "weights_sha256": manifest.get("weights_sha256", ""),
        "dataset_sha256": xp.get("dataset_sha256", ""),
        "dataset_same": xp.get("dataset_sha256") == ep.get("dataset_sha256"),
        "commits": commits,
        "libraries": ", ".join(f"{k} {v}" for k, v in sorted(ep.get("libraries", {}).items())),
        "timing": timing,
        "params": json.dumps({"extract": xp.get("params", {}), "evaluate": ep.get("params", {}).get("evaluate"),
                              "generation": ep.get("generation"), "stats": sp.get("params", {}).get("stats")},
                             indent=1, sort_keys=True, ensure_ascii=False),
    }


# ---- the stage -----------------------------------------------------------------------------------------

def fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render(context: dict) -> tuple[str, str]:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    loader = FileSystemLoader(str(TEMPLATES))
    html_env = Environment(loader=loader, autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True)
    md_env = Environment(loader=loader, autoescape=False, undefined=StrictUndefined, keep_trailing_newline=True,
                         trim_blocks=True, lstrip_blocks=True)
    md_env.filters["md"] = md_escape
    md_env.filters["fence"] = fence
    return (html_env.get_template("report.html.j2").render(**context),
            md_env.get_template("report.md.j2").render(**context))


def run(params: Params, out: Path | None = None) -> list[Path]:
    root = params.resolve(".")
    out = out or params.resolve(str(OUT_DIR))
    fig_dir = root / figures.OUT_DIR
    stats, _ = figures.load_inputs(params)
    names = list(stats)
    src = Sources(root)
    views = [ModelView(src, params, n, stats[n]) for n in names]
    qs = {n: None for n in names}
    for n in names:
        with read_h5(root / stats_path(n), "stats") as f:
            qs[n] = str(f.attrs["query_set"])
    sweep = params.figures.sweep_layers
    charts_by_model = [{"model": v.disp, "name": v.name,
                        "charts": [chart_layer_sweep(v, sweep, qs[v.name]), chart_heads(v), chart_conditions(v)]}
                       for v in views]
    cross = chart_cross_model(views)
    acc, table = chart_accuracy(src, names, {v.name: v.disp for v in views})
    for chart in [c for m in charts_by_model for c in m["charts"]] + [cross, acc]:
        png = fig_dir / f"{chart.stem}.png"
        if not png.is_file():
            raise ArtifactError(f"{png}: missing chart (run: dvc repro figures)")
        chart.png = base64.b64encode(png.read_bytes()).decode("ascii")
    context = {
        "models": [{"name": v.name, "disp": v.disp, "heads": v.heads} for v in views],
        "query_set": sorted(set(qs.values())),
        "layer": params.figures.layer,
        "per_model": charts_by_model, "cross": cross, "accuracy": acc, "table": table,
        "glance": cross.observations + acc.observations[-1:] + acc.interpretation[-1:],
        "examples": [example(params, root, v.name, v.disp) for v in views],
        "provenance": [provenance_rows(src, root, v.name, v.disp) for v in views],
        "fig_rel": Path(os.path.relpath(fig_dir, out)).as_posix(),
        "names": names,
    }
    html, md = render(context)
    written = []
    for path, text in ((out / "report.html", html), (out / "report.md", md)):
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        written.append(path)
    print(f"report: {len(charts_by_model) * 3 + 2} charts explained -> {written[0]}, {written[1]}")
    return written


def main(argv: list[str] | None = None) -> int:
    return cli.main("report", __doc__, run, argv, per_model=False)


if __name__ == "__main__":
    sys.exit(main())
