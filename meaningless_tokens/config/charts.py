"""Chart selection: which models, layers and heads each chart kind shows (`figures.charts.<kind>`, its missing keys
from the `figures` defaults). The charts (meaningless_tokens/charts/) draw what it selects; it lives with the params
because it is checked when they load, before any stage works, and the params are the lowest layer."""

from __future__ import annotations

from meaningless_tokens.config.base import duplicated
from meaningless_tokens.config.schema import CHART_KINDS, ONE_LAYER_KINDS, ChartSelection, Params
from meaningless_tokens.errors import ConfigError


def figure_models(params: Params) -> list[str]:
    """The models `figures.models` selects, in its order (all: params order)."""
    chosen = list(params.models) if params.figures.models == "all" else params.figures.models
    unknown = [m for m in chosen if m not in params.models]
    if unknown:
        raise ConfigError(f"{params.file}: figures.models: {unknown} not configured; models: {sorted(params.models)}")
    return list(chosen)


def chart_selection(params: Params, kind: str) -> tuple[list[str], list[int], str | dict, str]:
    """(models, 0-based layers, heads, params key of the heads) one chart kind shows: `figures.charts.<kind>`,
    its missing keys filled from the `figures` defaults."""
    cfg = params.figures
    sel = cfg.charts.get(kind, ChartSelection())
    # a chart's own list keeps its order (the paper's panel order)
    models = figure_models(params) if sel.models == "all" else [m for m in sel.models if m in figure_models(params)]
    layers = sel.layers if sel.layers is not None else (
        list(cfg.sweep_layers) if kind == "layer-sweep" else [cfg.layer])
    if sel.heads is not None:
        return models, layers, sel.heads, f"figures.charts.{kind}.heads"
    return models, layers, cfg.heads, "figures.heads"


def check_charts(params: Params) -> None:
    """`figures.charts` against the configured models, before any work: models configured and among
    figures.models, layers and heads among those each model extracts (models.<name>.layers / heads)."""
    where = f"{params.file}: figures.charts"
    for kind, sel in params.figures.charts.items():
        if sel.models != "all":
            unknown = [m for m in sel.models if m not in params.models]
            if unknown:
                raise ConfigError(f"{where}.{kind}.models: {unknown} not configured; models: {sorted(params.models)}")
            if not sel.models or duplicated(sel.models):
                raise ConfigError(f"{where}.{kind}.models: must be a non-empty list without duplicates (got {sel.models})")
            left_out = [m for m in sel.models if m not in figure_models(params)]
            if left_out:
                raise ConfigError(f"{where}.{kind}.models: {left_out} not among figures.models {params.figures.models}")
        if kind == "accuracy" and (sel.layers is not None or sel.heads is not None):
            raise ConfigError(f"{where}.accuracy: the accuracy chart has no layers or heads (only models)")
        models, layers, heads, hkey = chart_selection(params, kind)
        if kind == "accuracy":
            continue
        if kind in ONE_LAYER_KINDS and len(layers) != 1:
            raise ConfigError(f"{where}.{kind}.layers: this chart shows one layer (got {layers})")
        for m in models:
            spec = params.models[m]
            bad = [layer for layer in layers if layer not in spec.layers]
            if bad:
                raise ConfigError(f"{where}.{kind}.layers: {bad} not extracted for {m} (models.{m}.layers: {spec.layers})")
            if sel.heads is None or heads == "auto":
                continue
            if m not in heads:
                raise ConfigError(f"{where}.{kind}.heads.{m}: no heads named for this model (or use 'auto')")
            if not heads[m]:
                raise ConfigError(f"{where}.{kind}.heads.{m}: must name at least one head")
            if spec.heads != "all":
                bad = [h for h in heads[m] if h not in spec.heads]
                if bad:
                    raise ConfigError(f"{where}.{kind}.heads.{m}: {bad} not extracted (models.{m}.heads: {spec.heads})")
        if isinstance(heads, dict) and sel.heads is not None:
            extra = [m for m in heads if m not in models]
            if extra:
                raise ConfigError(f"{where}.{kind}.heads: {extra} not among this chart's models {models}")


def check_chart_facts(params: Params, name: str, n_layers: int, n_heads: int) -> None:
    """The charts' layers and heads of model `name`, once its config is known (heads 0-based here, "Head 1" is 0 on
    the charts)."""
    for kind in CHART_KINDS:
        if kind == "accuracy" or name not in chart_selection(params, kind)[0]:
            continue
        _, layers, heads, hkey = chart_selection(params, kind)
        # the figures.layer / sweep_layers defaults are checked against the extracted layers when drawing
        given = kind in params.figures.charts and params.figures.charts[kind].layers is not None
        bad = [layer for layer in layers if layer >= n_layers] if given else []
        key = f"figures.charts.{kind}.layers"
        if bad:
            raise ConfigError(f"{params.file}: {key}: {bad} out of range for {name}; the model has {n_layers} layers "
                              f"(allowed 0..{n_layers - 1})")
        if isinstance(heads, dict) and name in heads:
            bad = [h for h in heads[name] if h >= n_heads]
            if bad:
                raise ConfigError(
                    f"{params.file}: {hkey}.{name}: {bad} out of range; the model has {n_heads} query heads "
                    f"(allowed 0..{n_heads - 1}, Head 1..{n_heads} on the charts)")
