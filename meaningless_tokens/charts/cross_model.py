"""cross-model: one panel per model (figures.charts.cross-model, else figures.models), "Meaningless tokens" vs
"Random sentence" over the full prompt at the model's first head of the chart's layer."""

from __future__ import annotations

from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.charts.style import attention_axes, curve, shade_span
from meaningless_tokens.report.phrases import AXES_LAYERS, AXES_WEIGHT, HYPOTHESIS, change, count_of, label
from meaningless_tokens.report.trace import ALL, Text

KIND = "cross-model"
PER_MODEL = False


def draw(plt, ctx: Context, name: None = None):
    cfg, lab, names = ctx.params.figures, ctx.labels(KIND), ctx.chart_models(KIND)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, n in zip(axes[0], names):
        st, v = ctx.stats[n], ctx.view(n, KIND)
        h = v.heads[0]
        li, hi = v.li, st["heads"].index(h)
        curve(ax, st, "mless", "full", li, hi, cfg.full_positions, label=lab.legend("mless"))
        if "mful" in st["conditions"]:
            curve(ax, st, "mful", "full", li, hi, cfg.full_positions, label=lab.legend("mful"))
        shade_span(ax, st, "mless", cfg.full_positions, label=lab["band"])
        ax.set_title(f"{ctx.disp(n)} {label(v.layer, h)}")
        attention_axes(ax, lab, lab["x"], cfg.full_positions)
        ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    views = [ctx.view(n, KIND) for n in ctx.chart_models(KIND)]
    rows, means = [], []
    for v in views:
        h = v.heads[0]
        li, hi = v.li, v.hi(h)
        mean_drop = v.n("mless", "drop_pct", "mean", "+.1f", layer=li, head=ALL)
        ml = v.span_mass("mless", li, hi)[0]
        parts = [f"{v.disp}, {label(v.layer, h)}: the meaningless span takes ", ml, " % of the original queries' attention"]
        if "mful" in v.conds:
            parts += [", the meaningful span ", v.span_mass("mful", li, hi)[0], " %"]
        parts += [f". Averaged over the heads of {label(v.layer)}, the original tokens' attention ", change(mean_drop),
                  " %."]
        rows.append(Text(*parts))
        means.append((v, mean_drop))
    top = max(means, key=lambda m: m[1].value)
    pos = [v.disp for v, m in means if m.value > 0]
    obs = [Text(f"{top[0].disp} shows the largest change: averaged over its heads of {label(top[0].layer)}, the "
                "original tokens' attention ", change(top[1]), " %."),
           Text(f"The original tokens lose attention on average over the heads for {count_of(pos, len(means))}.")]
    return Chart(
        "cross-model", "All models: meaningless vs meaningful span",
        [Text("For each model, the head of its charts in the chosen layer: what every position of the whole prompt "
              "receives with the meaningless span (\"Meaningless tokens\") and with the meaningful span (\"Random "
              "sentence\").")],
        [Text("x axis: token position in the prompt; the shaded band is the inserted span."), Text(AXES_WEIGHT),
         Text("Red: mless; green: mful. " + AXES_LAYERS)],
        rows, obs,
        [Text(HYPOTHESIS), Text("If the effect is general, every model's original tokens lose attention under mless; "
                                f"here {count_of(pos, len(means))} do on average over the layer's heads.")])
