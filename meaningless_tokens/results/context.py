"""What every chart kind reads: the `Context` (inputs loaded once, display names and label texts from params),
the models, layers and heads a chart shows, a `ModelView` of one model's numbers there, and the `Chart` a kind
explains itself with.

A chart kind is a module of this package with `KIND` (its file stem, `<model>-KIND` when `PER_MODEL`),
`draw(plt, ctx, name)` -> a matplotlib figure and `explain(ctx, name)` -> a `Chart` (its five report
parts). `figures.py` and `report.py` only loop over `meaningless_tokens.charts.KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from meaningless_tokens.results.load import (load_activations, load_arm_tuning, load_datasets, load_likelihood,
                                             load_metrics, load_stats, load_sweep)
from meaningless_tokens.config import Params, chart_selection, figure_models
from meaningless_tokens.errors import BadParam
from meaningless_tokens.results.trace import ALL, Num, Sources, artifact


def selected_models(params: Params) -> list[str]:
    return figure_models(params)


@dataclass
class Context:
    """Everything the charts read, loaded once per stage run; display names come from params, so a
    renamed model redraws the charts without rerunning any model stage."""
    params: Params
    stats: dict[str, dict]
    metrics: dict[str, dict]
    _src: "Sources | None" = None
    _views: dict = field(default_factory=dict)
    _measures: dict = field(default_factory=dict)  # measure(): {stage: {model: file read whole}}
    _activations: dict | None = None
    _sweep: dict | None = None
    _likelihood: dict | None = None
    _likelihood_link: dict | None = None  # charts.likelihood.problem_links() fills it
    _arm_tuning: dict | None = None

    @property
    def names(self) -> list[str]:
        return list(self.stats)

    @property
    def root(self) -> Path:
        return self.params.project_path(".")

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
            self._activations = {n: load_activations(self.params.project_path(artifact("activations", n))) for n in self.names}
        return self._activations

    @property
    def sweep(self) -> dict[str, dict]:
        """{model: sweep file}, read when a chart first asks for it."""
        if self._sweep is None:
            self._sweep = {n: load_sweep(self.params.project_path(artifact("sweep", n))) for n in self.names}
        return self._sweep

    @property
    def likelihood(self) -> dict[str, dict]:
        """{model: likelihood file}, read when a chart first asks for it."""
        if self._likelihood is None:
            self._likelihood = {n: load_likelihood(self.params.project_path(artifact("likelihood", n))) for n in self.names
                                if n in self.params.scored}  # likelihood.models
        return self._likelihood

    @property
    def arm_tuning(self) -> dict[str, dict]:
        """{model: ARM tuning summary} for the models of arm_tuning.models (a file left by an earlier list is not read)."""
        if self._arm_tuning is None:
            tuned = self.params.arm_tuning.models
            self._arm_tuning = {n: load_arm_tuning(self.params.project_path(artifact("arm_tuning", n)))
                                for n in self.names if n in tuned}
        return self._arm_tuning

    def measure(self, stage: str) -> dict[str, dict]:
        """{model: its `stage` file read whole (load_datasets)}, for every model with one: any measure's numbers,
        read when a chart first asks for them, with no loader of its own."""
        if stage not in self._measures:
            files = {n: self.params.project_path(artifact(stage, n)) for n in self.names}
            self._measures[stage] = {n: load_datasets(f, stage) for n, f in files.items() if f.is_file()}
        return self._measures[stage]

    @property
    def benchmark(self) -> str:
        """The evaluated benchmark's name (metrics/accuracy/<model>.json: dataset), MATH-500 for older metrics."""
        return next((m["dataset"] for m in self.metrics.values() if m.get("dataset")), "MATH-500")

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
    stats = {n: load_stats(params.project_path(artifact("stats", n))) for n in names}
    # accuracy only for the models evaluated (evaluate.models): the others have no evaluation to read
    return Context(params, stats, {n: load_metrics(params.project_path(artifact("metrics/accuracy", n)), n)
                                   for n in names if n in params.evaluated})


# ---- heads and layers ------------------------------------------------------------------------------------

def layer_index(name: str, st: dict, layer: int, key: str) -> int:
    """The index in model `name`'s statistics `st` of 0-based `layer`, which params key `key` names."""
    if layer not in st["layers"]:
        raise BadParam(f"{key}: layer {layer} was not extracted for {name} "
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
    li = layer_index(name, st, layers[0], lkey)
    heads, key = (params.figures.heads, "figures.heads") if kind is None else chart_selection(params, kind)[2:]
    if heads == "auto":
        return [st["heads"][k] for k in st["mless"]["head_rank"][li][: params.figures.n_heads]]
    chosen = heads.get(name)
    if chosen is None:
        raise BadParam(f"{key}.{name}: no heads named for this model (or use 'auto')")
    bad = [h for h in chosen if h not in st["heads"]]
    if bad:
        raise BadParam(f"{key}.{name}: {bad} not among the extracted heads {st['heads']}")
    return chosen


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
        self.file = artifact("stats", name)
        self.disp = ctx.disp(name)
        self.heads = choose_heads(params, name, st, kind)
        self.layers, lkey = chart_layers(params, kind)
        self.layer = self.layers[0]
        self.li = layer_index(name, st, self.layer, lkey)
        self.P, self.F = params.figures.original_positions, params.figures.full_positions
        self.conds = st["conditions"]
        self.span = st["span"].get("mless", (-1, -1))

    def hi(self, head: int) -> int:
        return self.st["heads"].index(head)

    def n(self, cond: str, ds: str, op: str = "value", fmt: str = ".3g", scale: float = 1.0, **at) -> Num:
        """Dataset `ds` of condition `cond` at the element its axes name (indices into the file's layers and heads)."""
        return self.src.h5(self.file, f"{cond}/{ds}", op, scale, fmt, **at)

    def orig_mean(self, cond: str, layer: int, head: int) -> Num:
        return self.n(cond, "orig_mean", "mean", ".4f", sample=ALL, layer=layer, head=head)

    def drop_pct(self, cond: str, layer: int, head: int) -> tuple[Num, Num, Num]:
        return (self.n(cond, "drop_pct", fmt="+.1f", layer=layer, head=head),
                self.n(cond, "drop_pct_ci", fmt="+.1f", bound="low", layer=layer, head=head),
                self.n(cond, "drop_pct_ci", fmt="+.1f", bound="high", layer=layer, head=head))

    def span_mass(self, cond: str, layer: int, head: int) -> tuple[Num, Num, Num]:
        return (self.n(cond, "span_mass", fmt=".1f", scale=100, layer=layer, head=head),
                self.n(cond, "span_mass_ci", fmt=".1f", scale=100, bound="low", layer=layer, head=head),
                self.n(cond, "span_mass_ci", fmt=".1f", scale=100, bound="high", layer=layer, head=head))

    def peak(self, cond: str, layer: int, head: int) -> tuple[Num, Num]:
        """Where the average attention over original positions 1..P-1 is largest (position 0, the
        attention sink, is left out) and its value."""
        at = dict(layer=layer, head=head, position=slice(1, self.P))
        return self.n(cond, "original_avg", "argmax", "d", **at), self.n(cond, "original_avg", "max", ".4f", **at)
