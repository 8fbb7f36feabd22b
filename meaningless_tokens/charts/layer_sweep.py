"""<model>-layer-sweep: one head across layers (figures.charts.layer-sweep, else figures.sweep_layers and the first
head of figures.heads), none vs mless over original positions."""

from __future__ import annotations

from meaningless_tokens.results.context import Chart, Context, chart_layers, layer_index
from meaningless_tokens.charts.style import Labels, attention_axes, curve
from meaningless_tokens.results.phrases import change, label
from meaningless_tokens.results.prose import say, shared, verdict_drop
from meaningless_tokens.results.trace import excludes_zero

KIND = "layer-sweep"
TEXT = "charts/layer_sweep.j2"
PER_MODEL = True
SECTION = "Attention"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 10  # its place in the report (charts.KINDS: by ORDER)


def draw(plt, ctx: Context, name: str):
    params, st, lab = ctx.params, ctx.stats[name], Labels(ctx.params.figures.labels, KIND)
    P = params.figures.original_positions
    head = ctx.view(name, KIND).heads[0]
    h0 = st["heads"].index(head)
    layers, key = chart_layers(params, KIND)
    sweep = [layer_index(name, st, layer, key) for layer in layers]
    fig, axes = plt.subplots(1, len(sweep), figsize=(4.2 * len(sweep), 3.4), squeeze=False)
    for ax, lj in zip(axes[0], sweep):
        for c in ("none", "mless"):
            curve(ax, st, c, "original", lj, h0, P, label=lab.legend(c))
        ax.set_title(f"{ctx.disp(name)} {label(st['layers'][lj], head)}")
        attention_axes(ax, lab, lab["x"], P)
    axes[0][0].legend(loc="upper right")
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: str) -> Chart:
    v = ctx.view(name, KIND)
    sweep, qs = v.layers, v.st["query_set"]
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
        rows.append(say(TEXT, "layer", where=label(layer, h), base=mn, mless=mm, change=change(pct), low=lo, high=up,
                        peak_none=pn, value_none=vn, peak_mless=pm, value_mless=vm, mass=mass, mass_low=mlo,
                        mass_high=mhi))
    top = max(drops, key=lambda d: d[1].value)
    lower = [d for d in drops if d[5].value < d[4].value]
    obs = [say(TEXT, "lower", k=len(lower), shown=len(drops)),
           say(TEXT, "largest", layer=label(top[0]), drop=top[1], excludes=excludes_zero(top[2], top[3]))]
    first = drops[0]
    later = drops[1:]
    if later:
        obs.append(say(TEXT, "first", layer=label(first[0]),
                       strongest=all(first[1].value >= d[1].value for d in later)))
    return Chart(
        f"{v.name}-{KIND}", f"{v.disp}: Head {h + 1} across layers {layers}",
        [say(TEXT, "overview", disp=v.disp, head=h + 1, layers=layers, count=v.st["mless_span"]["count"], query_set=qs,
             n=n, layer=label(v.layer))],
        [shared("axes_original"), shared("axes_weight"), say(TEXT, "colours", layers=shared("axes_layers"))],
        rows, obs,
        [shared("hypothesis"), verdict_drop(first[1], first[2], first[3], label(first[0], h))])
