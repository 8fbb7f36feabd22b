"""What every chart kind shares: the inputs (loaded once), drawing style, and the report's traced numbers.

A chart kind is a module of this package with `KIND` (its file stem, `<model>-KIND` when `PER_MODEL`),
`draw(plt, ctx, name)` -> a matplotlib figure and `explain(ctx, name)` -> a `Chart` (its five report
parts). `figures.py` and `report.py` only loop over `meaningless_tokens.charts.KINDS`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from markupsafe import Markup, escape

from meaningless_tokens.config import ConfigError, Params, chart_selection, figure_models
from meaningless_tokens.store import ArtifactError, activations_path, likelihood_path, read_h5, stats_path, sweep_path

COLORS = {"none": "#1f77b4", "mless": "#d62728", "mful": "#2ca02c", "arm": "#9467bd"}
LABELS = {"none": "No insertion (none)", "mless": "Meaningless tokens (mless)", "mful": "Random sentence (mful)",
          "arm": "ARM on Layer 1's MLP (arm)"}
COLOR_NAMES = {"none": "blue", "mless": "red", "mful": "green", "arm": "purple"}


def colour_key(conds) -> str:
    """'blue none, red mless, ...' for the conditions a chart shows."""
    return ", ".join(f"{COLOR_NAMES[c]} {c}" for c in conds)


# `figures.labels: paper`: the seed charts' own texts (legends per chart kind, axis title, band label)
PAPER_Y = "Average Attention Weight"
PAPER_BAND = "Meaningless tokens"


# ---- inputs ----------------------------------------------------------------------------------------------

def selected_models(params: Params) -> list[str]:
    return figure_models(params)


def load_stats(path: Path) -> dict:
    need = ("none/original_avg", "none/full_avg", "mless/head_rank")
    with read_h5(path, "stats", need) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        data = {"layers": [int(x) for x in f.attrs["layers"]], "heads": [int(x) for x in f.attrs["heads"]],
                "conditions": conds, "query_set": str(f.attrs["query_set"]), "span": {},
                "mless_span": mless_span(path, f.attrs["provenance"])}
        for c in conds:
            data[c] = {k: f[c][k][()] for k in f[c]}
            data["span"][c] = tuple(int(x) for x in f[c].attrs["span"])
    return data


def mless_span(path: Path, provenance: str) -> dict:
    """The meaningless span the extraction inserted (its params' prompt.mless: token, count, placement), as the
    statistics file's provenance carries it: the report states it from there, never from a template."""
    try:
        span = json.loads(provenance)["extract_provenance"]["params"]["prompt"]["mless"]
        return {"token": str(span["token"]), "count": int(span["count"]), "placement": str(span["placement"])}
    except (KeyError, TypeError, ValueError):
        raise ArtifactError(f"{path}: provenance: extract_provenance.params.prompt.mless: missing or incomplete "
                            "(written by another version? run: dvc repro)") from None


def load_metrics(params: Params, name: str) -> dict:
    path = params.resolve(f"metrics/accuracy/{name}.json")
    if not path.is_file():
        raise ArtifactError(f"{path}: missing evaluation metrics (run: dvc repro evaluate@{name})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None


def load_likelihood(file: Path) -> dict:
    """A likelihood file: problems, conditions, per contrast and continuation the per-problem differences and
    the summaries, and the seed / n_boot it was made with."""
    with read_h5(file, "likelihood", ("problems/index", "none/solution/mean")) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        data = {"conditions": conds, "index": f["problems/index"][()], "level": f["problems/level"][()],
                "n": int(f.attrs["n_samples"]), "contrasts": {},
                "params": json.loads(f.attrs["provenance"])["params"]["likelihood"],
                "tokens": float(f["none/solution/tokens"][()].mean())}
        for c in conds:
            if c == "none":
                continue
            data["contrasts"][f"{c}-none"] = {k: {ds: g[ds][()] for ds in g} for k in ("solution", "answer")
                                              for g in [f[f"contrasts/{c}-none/{k}"]]}
    return data


def load_activations(path: Path) -> dict:
    """An activations file (stages/activations.py) as nested dicts of arrays."""
    with read_h5(path, "activations", ("bin_edges", "none/hist_original", "none/original/l1_mean")) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        data = {"layers": [int(x) for x in f.attrs["layers"]], "conditions": conds,
                "n_samples": int(f.attrs["n_samples"]), "bin_edges": f["bin_edges"][()]}
        for c in conds:
            g = f[c]
            data[c] = {k: (g[k][()] if hasattr(g[k], "shape") else {m: g[k][m][()] for m in g[k]}) for k in g}
    return data


def load_sweep(path: Path) -> dict:
    """A sweep file (stages/sweep.py): per token group its per-count arrays, plus the grid."""
    with read_h5(path, "sweep", ("token_0/drop_heads_pct", "token_0/span_mass_heads")) as f:
        data = {"layer": int(f.attrs["layer"]), "counts": [int(c) for c in f.attrs["counts"]],
                "reference_count": int(f.attrs["reference_count"]), "n_samples": int(f.attrs["n_samples"]),
                "accuracy_samples": int(f.attrs["accuracy_samples"]),
                "likelihood_samples": int(f.attrs.get("likelihood_samples", 0)), "tokens": [],
                "correct_none": f["correct_none"][()] if "correct_none" in f else None}
        for k in range(len(f.attrs["tokens"])):
            g = f[f"token_{k}"]
            data["tokens"].append({"token": str(g.attrs["token"]), "group": f"token_{k}",
                                   **{ds: g[ds][()] for ds in g}})
    return data


@dataclass
class Context:
    """Everything the charts read, loaded once per stage run; display names come from params, so a
    renamed model redraws the charts without rerunning any model stage."""
    params: Params
    stats: dict[str, dict]
    metrics: dict[str, dict]
    _src: "Sources | None" = None
    _views: dict = field(default_factory=dict)
    _activations: dict | None = None
    _sweep: dict | None = None
    _likelihood: dict | None = None
    _likelihood_link: dict | None = None  # charts.likelihood.problem_links() fills it

    @property
    def names(self) -> list[str]:
        return list(self.stats)

    @property
    def root(self) -> Path:
        return self.params.resolve(".")

    def disp(self, name: str) -> str:
        return self.params.models[name].display_name

    @property
    def src(self) -> "Sources":
        if self._src is None:
            self._src = Sources(self.root)
        return self._src

    @property
    def activations(self) -> dict[str, dict]:
        """{model: activations file}, read when a chart first asks for it."""
        if self._activations is None:
            self._activations = {n: load_activations(self.params.resolve(str(activations_path(n)))) for n in self.names}
        return self._activations

    @property
    def sweep(self) -> dict[str, dict]:
        """{model: sweep file}, read when a chart first asks for it."""
        if self._sweep is None:
            self._sweep = {n: load_sweep(self.params.resolve(str(sweep_path(n)))) for n in self.names}
        return self._sweep

    @property
    def likelihood(self) -> dict[str, dict]:
        """{model: likelihood file}, read when a chart first asks for it."""
        if self._likelihood is None:
            self._likelihood = {n: load_likelihood(self.params.resolve(str(likelihood_path(n)))) for n in self.names
                                if n in self.params.scored}  # likelihood.models
        return self._likelihood

    @property
    def benchmark(self) -> str:
        """The evaluated benchmark's name (metrics/accuracy/<model>.json: dataset), MATH-500 for older metrics."""
        return next((m["dataset"] for m in self.metrics.values() if m.get("dataset")), "MATH-500")

    @property
    def paper_labels(self) -> bool:
        return self.params.figures.labels == "paper"

    def chart_models(self, kind: str) -> list[str]:
        """The models chart `kind` shows (figures.charts.<kind>.models, else figures.models), loaded ones only."""
        return [m for m in chart_selection(self.params, kind)[0] if m in self.stats]

    def view(self, name: str, kind: str | None = None) -> "ModelView":
        """One model's numbers at the layer and heads chart `kind` shows (None: the `figures` defaults)."""
        if (name, kind) not in self._views:
            self._views[(name, kind)] = ModelView(self, name, kind)
        return self._views[(name, kind)]


def load_context(params: Params) -> Context:
    names = selected_models(params)
    stats = {n: load_stats(params.resolve(str(stats_path(n)))) for n in names}
    # accuracy only for the models evaluated (evaluate.models): the others have no evaluation to read
    return Context(params, stats, {n: load_metrics(params, n) for n in names if n in params.evaluated})


# ---- heads and layers ------------------------------------------------------------------------------------

def layer_index(params: Params, name: str, st: dict, layer: int, key: str) -> int:
    if layer not in st["layers"]:
        raise ConfigError(f"{params.file}: {key}: layer {layer} was not extracted for {name} "
                          f"(extracted: {st['layers']}; see models.{name}.layers)")
    return st["layers"].index(layer)


def chart_layers(params: Params, kind: str | None) -> tuple[list[int], str]:
    """0-based layers chart `kind` shows and their params key (None: the per-head charts' default, figures.layer)."""
    if kind is None:
        return [params.figures.layer], "figures.layer"
    layers = chart_selection(params, kind)[1]
    given = kind in params.figures.charts and params.figures.charts[kind].layers is not None
    return layers, (f"figures.charts.{kind}.layers" if given else
                    "figures.sweep_layers" if kind == "layer-sweep" else "figures.layer")


def choose_heads(params: Params, name: str, st: dict, kind: str | None = None) -> list[int]:
    """The 0-based heads chart `kind` shows (None: the `figures` defaults). `auto`: the `figures.n_heads` heads of
    the chart's (first) layer with the largest mless drop (stats head_rank); or the heads named per model."""
    layers, lkey = chart_layers(params, kind)
    li = layer_index(params, name, st, layers[0], lkey)
    heads, key = (params.figures.heads, "figures.heads") if kind is None else chart_selection(params, kind)[2:]
    if heads == "auto":
        return [st["heads"][k] for k in st["mless"]["head_rank"][li][: params.figures.n_heads]]
    chosen = heads.get(name)
    if chosen is None:
        raise ConfigError(f"{params.file}: {key}.{name}: no heads named for this model (or use 'auto')")
    bad = [h for h in chosen if h not in st["heads"]]
    if bad:
        raise ConfigError(f"{params.file}: {key}.{name}: {bad} not among the extracted heads {st['heads']}")
    return chosen


# ---- drawing ---------------------------------------------------------------------------------------------

def curve(ax, st, cond, kind, li, hi, limit, **kw):
    y = st[cond][f"{kind}_avg"][li, hi][:limit]
    ax.plot(np.arange(len(y)), y, color=COLORS[cond], label=kw.pop("label", LABELS[cond]), lw=1.4, **kw)
    return y


def shade_span(ax, st, cond, limit, label="Meaningless tokens"):
    start, end = st["span"][cond]
    if 0 <= start < end:
        ax.axvspan(start - 0.5, min(end, limit) - 0.5, color=COLORS[cond], alpha=0.12, label=label)


def attention_axes(ax, xlabel, limit, paper: bool = False):
    """Axis titles and x range; `paper` (figures.labels: paper): the seeds' y title and their x range 0..limit."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(PAPER_Y if paper else "Average attention weight")
    ax.set_xlim(*((0, limit) if paper else (-0.5, limit - 0.5)))
    ax.grid(alpha=0.3, lw=0.5)


# ---- numbers that know where they come from --------------------------------------------------------------

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
# the artifact kind of each folder a number can come from
H5_KINDS = {"artifacts/stats/": "stats", "artifacts/eval/": "eval", "artifacts/activations/": "activations",
            "artifacts/sweep/": "sweep", "artifacts/likelihood/": "likelihood"}


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
            kind = next(k for prefix, k in H5_KINDS.items() if src.startswith(prefix))
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


@dataclass
class Chart:
    """One chart and its five explanations (lists of Text); `extra` holds what a template shows beside it."""
    stem: str
    title: str
    overview: list
    axes: list
    analysis: list
    observations: list
    interpretation: list
    png: str = ""          # base64, filled in by the report stage
    extra: dict = field(default_factory=dict)


class ModelView:
    """Numbers of one model's statistics file, at the layer and heads the charts show."""

    def __init__(self, ctx: Context, name: str, kind: str | None = None):
        params, st = ctx.params, ctx.stats[name]
        self.src, self.name, self.st = ctx.src, name, st
        self.file = str(stats_path(name))
        self.disp = ctx.disp(name)
        self.heads = choose_heads(params, name, st, kind)
        self.layers, lkey = chart_layers(params, kind)
        self.layer = self.layers[0]
        self.li = layer_index(params, name, st, self.layer, lkey)
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


# ---- phrases several charts use ----------------------------------------------------------------------------

def label(layer: int, head: int | None = None) -> str:
    """"Layer 1 Head 1" for 0-based layer 0, head 0: charts and report count both from 1, as the paper does."""
    return f"Layer {layer + 1}" + (f" Head {head + 1}" if head is not None else "")


def head_list(heads) -> str:
    """0-based heads as the charts number them: "1, 2, 8"."""
    return ", ".join(str(h + 1) for h in heads)


def verdict_drop(pct: Num, lo: Num, hi: Num, where: str) -> Text:
    """The paper's prediction for attention on original tokens, checked against one drop interval."""
    if excludes_zero(lo, hi):
        agree = "agrees with" if pct.value > 0 else "runs against"
        return Text(f"At {where} the original tokens' attention ", change(pct), " %; the drop's interval ",
                    interval(lo, hi),
                    f", which excludes zero: this run {agree} the prediction.")
    return Text(f"At {where} the original tokens' attention ", change(pct), " %, but the drop's interval ",
                interval(lo, hi),
                " includes zero: this run neither confirms nor refutes the prediction there.")


def count_of(names: list[str], total: int, noun: str = "models", one: str = "model") -> str:
    """"no model", "both models", "all 3 models", "the one model", or "2 of 3 models (A, B)": no zero counts,
    no list that names every model."""
    k = len(names)
    if k == 0:
        return f"no {one}"
    if k == total:
        return f"both {noun}" if total == 2 else f"all {total} {noun}" if total > 1 else f"the one {one}"
    return f"{k} of {total} {noun} ({', '.join(names)})"


def change(n: Num, down: str = "drops by", up: str = "rises by") -> Text:
    """A signed change said with words: "drops by 28.2" for +28.2 as a drop, "rises by 3.1" for -3.1; the number
    keeps its trace (a negative one is read with scale -1)."""
    sign = -1.0 if n.value < 0 else 1.0
    return Text(down if sign > 0 else up, " ", Num(abs(n.value), n.src, n.key, n.op, n.scale * sign,
                                                   n.fmt.replace("+", "")))


HYPOTHESIS = ("The paper's account: in the first layers the inserted meaningless tokens take part of the "
              "attention that the original tokens would otherwise receive, so the original tokens' weights "
              "drop and the attention outputs shift; a meaningful span of the same length should not act "
              "the same way.")
AXES_ORIGINAL = ("x axis: original token position j, the token's index in the none prompt (0 is the first "
                 "token, the attention sink); under mless and mful the same token sits after the span, and "
                 "the curves compare it with itself.")
AXES_WEIGHT = ("y axis: average attention weight the token receives, averaged over its queries, then over "
               "problems (rows of attention sum to 1, so small values are normal for long prompts).")
AXES_LAYERS = "Layers and heads are numbered from 1 (see Conventions)."
