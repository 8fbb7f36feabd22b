"""<model>-conditions: one head (the first of figures.charts.conditions, else of figures.heads), none / mless / mful
over original positions (left) and mless vs mful over the full prompt (right); the paper's "Average attention on
Head 14" chart."""

from __future__ import annotations

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import Labels, attention_axes, curve, shade_span
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.prose import say, shared

KIND = "conditions"
TEXT = "charts/conditions.j2"
PER_MODEL = True
SECTION = "Meaningless vs meaningful span"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 30  # its place in the report (charts.KINDS: by ORDER)


def draw(plt, ctx: Context, name: str):
    st, cfg, lab = ctx.stats[name], ctx.params.figures, Labels(ctx.params.figures.labels, KIND)
    v = ctx.view(name, KIND)
    disp, li, head = v.disp, v.li, v.heads[0]
    P, F = cfg.original_positions, cfg.full_positions
    h0 = st["heads"].index(head)
    names = {"disp": disp, "layer": label(v.layer), "layer_head": label(v.layer, head), "head": head + 1}
    fig, axes = plt.subplots(1, 2, figsize=(9.6, lab["height"]))
    for c in st["conditions"]:
        curve(axes[0], st, c, "original", li, h0, P, label=lab.legend(c))
    axes[0].set_title(lab.text("title", **names))
    attention_axes(axes[0], lab, lab["x"], P)
    for c in ("mless", "mful"):
        if c in st["conditions"]:
            curve(axes[1], st, c, "full", li, h0, F, label=lab.legend(c))
    shade_span(axes[1], st, "mless", F, label=lab["band"])
    axes[1].set_title(lab.text("title_full", **names))
    attention_axes(axes[1], lab, lab["x_full"], F)
    axes[0].legend(loc="upper right")
    axes[1].legend(loc="upper right")
    if lab["suptitle"]:
        fig.suptitle(lab.text("suptitle", **names))
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: str) -> Chart:
    v = ctx.view(name, KIND)
    h = v.heads[0]
    li, hi = v.li, v.hi(h)
    means = {c: v.orig_mean(c, li, hi) for c in v.conds}
    rows = [say(TEXT, "means", means=means)]
    drop, mass = {}, {}
    for c in v.conds:
        if c == "none":
            continue
        drop[c], mass[c] = v.drop_pct(c, li, hi), v.span_mass(c, li, hi)
        rows.append(say(TEXT, "drop", cond=c, drop=drop[c][0], low=drop[c][1], high=drop[c][2], mass=mass[c][0],
                        mass_low=mass[c][1], mass_high=mass[c][2]))
    order = sorted(v.conds, key=lambda c: -means[c].value)
    obs = [say(TEXT, "most_least", most=order[0], least=order[-1])]
    interp = [shared("hypothesis")]
    if "mless" in drop and "mful" in drop:
        obs.append(say(TEXT, "span_draws", mless=mass["mless"][0], mful=mass["mful"][0],
                       more=mass["mless"][0].value > mass["mful"][0].value))
        apart = drop["mless"][1].value > drop["mful"][2].value or drop["mful"][1].value > drop["mless"][2].value
        obs.append(say(TEXT, "drops_compared", mless=drop["mless"][0], mful=drop["mful"][0], apart=apart))
        interp.append(say(TEXT, "separates", apart=apart))
    where = label(v.layer, h)
    return Chart(
        f"{v.name}-conditions", f"{v.disp}: {where}, all conditions",
        [say(TEXT, "overview", disp=v.disp, where=where)],
        [say(TEXT, "axes_left", original=shared("axes_original")), say(TEXT, "axes_right"), shared("axes_weight"),
         say(TEXT, "colours", layers=shared("axes_layers"))],
        rows, obs, interp)
