"""cross-model: one panel per model (figures.charts.cross-model, else figures.models), "Meaningless tokens" vs
"Random sentence" over the full prompt at the model's first head of the chart's layer."""

from __future__ import annotations

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import Labels, attention_axes, curve, shade_span
from meaningless_tokens.results.phrases import change, label
from meaningless_tokens.results.prose import say, shared
from meaningless_tokens.results.trace import ALL

KIND = "cross-model"
TEXT = "charts/cross_model.j2"
PER_MODEL = False
SECTION = "Meaningless vs meaningful span"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 40  # its place in the report (charts.KINDS: by ORDER)


def draw(plt, ctx: Context, name: None = None):
    cfg, lab, names = ctx.params.figures, Labels(ctx.params.figures.labels, KIND), ctx.chart_models(KIND)
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
        rows.append(say(TEXT, "model", disp=v.disp, where=label(v.layer, h), mless=v.span_mass("mless", li, hi)[0],
                        mful=v.span_mass("mful", li, hi)[0] if "mful" in v.conds else None, layer=label(v.layer),
                        change=change(mean_drop)))
        means.append((v, mean_drop))
    top = max(means, key=lambda m: m[1].value)
    pos = [v.disp for v, m in means if m.value > 0]
    obs = [say(TEXT, "largest", disp=top[0].disp, layer=label(top[0].layer), change=change(top[1])),
           say(TEXT, "lose", pos=pos, total=len(means))]
    return Chart(
        "cross-model", "All models: meaningless vs meaningful span",
        [say(TEXT, "overview")],
        [say(TEXT, "axes_x"), shared("axes_weight"), say(TEXT, "colours", layers=shared("axes_layers"))],
        rows, obs,
        [shared("hypothesis"), say(TEXT, "general", pos=pos, total=len(means))])
