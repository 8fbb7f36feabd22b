"""<model>-conditions: one head (the first of figures.charts.conditions, else of figures.heads), none / mless / mful
over original positions (left) and mless vs mful over the full prompt (right); the paper's "Average attention on
Head 14" chart."""

from __future__ import annotations

from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.charts.style import attention_axes, curve, shade_span
from meaningless_tokens.report.phrases import AXES_LAYERS, AXES_ORIGINAL, AXES_WEIGHT, HYPOTHESIS, label
from meaningless_tokens.report.trace import Text, interval

KIND = "conditions"
PER_MODEL = True


def draw(plt, ctx: Context, name: str):
    st, cfg, lab = ctx.stats[name], ctx.params.figures, ctx.labels(KIND)
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
