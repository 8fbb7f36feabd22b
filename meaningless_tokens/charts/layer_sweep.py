"""<model>-layer-sweep: one head across layers (figures.charts.layer-sweep, else figures.sweep_layers and the first
head of figures.heads), none vs mless over original positions."""

from __future__ import annotations

from meaningless_tokens.charts.context import Chart, Context, chart_layers, layer_index
from meaningless_tokens.charts.style import attention_axes, curve
from meaningless_tokens.report.phrases import (AXES_LAYERS, AXES_ORIGINAL, AXES_WEIGHT, HYPOTHESIS, change, label,
                                               verdict_drop)
from meaningless_tokens.report.trace import Text, excludes_zero, interval

KIND = "layer-sweep"
PER_MODEL = True


def draw(plt, ctx: Context, name: str):
    params, st, lab = ctx.params, ctx.stats[name], ctx.labels(KIND)
    P = params.figures.original_positions
    head = ctx.view(name, KIND).heads[0]
    h0 = st["heads"].index(head)
    layers, key = chart_layers(params, KIND)
    sweep = [layer_index(params, name, st, layer, key) for layer in layers]
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
        rows.append(Text(f"{label(layer, h)}: mean attention on original tokens (positions 1 on) is ", mn,
                         " without insertion and ", mm, " with meaningless tokens: it ", change(pct), " % (the drop's interval ",
                         interval(lo, up), "). Highest point after the sink: position ", pn, " (", vn,
                         ") for none, position ", pm, " (", vm, ") for mless. The span takes ", mass, " % ",
                         interval(mlo, mhi), " of the original queries' attention."))
    top = max(drops, key=lambda d: d[1].value)
    lower = [d for d in drops if d[5].value < d[4].value]
    k = len(lower)
    obs = [Text("Meaningless tokens lower the mean attention on original tokens in " + (
                "no layer shown." if k == 0 else f"all {k} layers shown." if k == len(drops) > 1 else
                f"{k} of {len(drops)} layers shown.")),
           Text(f"The drop is largest in {label(top[0])} (", top[1], " %)",
                "; its interval excludes zero." if excludes_zero(top[2], top[3]) else
                "; its interval includes zero.")]
    first = drops[0]
    later = drops[1:]
    if later:
        strongest_first = all(first[1].value >= d[1].value for d in later)
        obs.append(Text(f"{label(first[0])} shows {'the largest' if strongest_first else 'not the largest'} drop of "
                        "the layers shown, ", "as the paper reports for the first layer." if strongest_first else
                        "unlike the paper, which reports the strongest change in the first layer."))
    return Chart(
        f"{v.name}-{KIND}", f"{v.disp}: Head {h + 1} across layers {layers}",
        [Text(f"{v.disp}, head {h + 1}, layers {layers}: the attention each original token receives without "
              f"insertion (none) and with {v.st['mless_span']['count']} meaningless tokens (mless), averaged over the "
              f"{qs} queries and over ", n, " problems. The head is the one whose mean attention on "
              f"original tokens drops most in {label(v.layer)}, in absolute terms (or the first one named in "
              "figures.charts.layer-sweep or figures.heads).")],
        [Text(AXES_ORIGINAL), Text(AXES_WEIGHT), Text("Blue: none; red: mless. " + AXES_LAYERS)],
        rows, obs,
        [Text(HYPOTHESIS), verdict_drop(first[1], first[2], first[3], label(first[0], h))])
