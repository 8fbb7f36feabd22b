"""<model>-conditions: one head (the first of figures.charts.conditions, else of figures.heads), none / mless / mful
over original positions (left) and mless vs mful over the full prompt (right); the paper's "Average attention on
Head 14" chart."""

from __future__ import annotations

from meaningless_tokens.charts.common import (AXES_LAYERS, AXES_ORIGINAL, AXES_WEIGHT, HYPOTHESIS, PAPER_BAND, Chart, Context,
                                  Text, attention_axes, curve, interval, label, shade_span)

KIND = "conditions"
PER_MODEL = True


# the seed's legend and title (figures.labels: paper)
PAPER_LEGEND = {"none": "None", "mless": "Mless", "mful": "Mful"}


def paper_title(head: int) -> str:
    return f"Average attention on Head {head + 1}"


def draw(plt, ctx: Context, name: str):
    st, cfg, paper = ctx.stats[name], ctx.params.figures, ctx.paper_labels
    v = ctx.view(name, KIND)
    disp, li, head = v.disp, v.li, v.heads[0]
    P, F = cfg.original_positions, cfg.full_positions
    h0 = st["heads"].index(head)
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6 if not paper else 3.9))
    for c in st["conditions"]:
        curve(axes[0], st, c, "original", li, h0, P, **({"label": PAPER_LEGEND[c]} if paper else {}))
    axes[0].set_title(f"{disp} {label(v.layer, head)}" if not paper else f"{disp} {label(v.layer)}: original tokens")
    attention_axes(axes[0], "Token position" if paper else "Original token position", P, paper)
    for c in ("mless", "mful"):
        if c in st["conditions"]:
            curve(axes[1], st, c, "full", li, h0, F, **({"label": PAPER_LEGEND[c]} if paper else {}))
    shade_span(axes[1], st, "mless", F, label=PAPER_BAND if paper else "Inserted span")
    axes[1].set_title(f"{disp} {label(v.layer, head)}: full prompt" if not paper else f"{disp} {label(v.layer)}: full prompt")
    attention_axes(axes[1], "Token position", F, paper)
    axes[0].legend(loc="upper right")
    axes[1].legend(loc="upper right")
    if paper:
        fig.suptitle(paper_title(head))
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
