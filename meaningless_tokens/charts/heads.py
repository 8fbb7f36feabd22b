"""<model>-heads: per head of the chart's layer (figures.charts.heads, else figures.layer and figures.heads), none
vs mless over original positions (top) and the full mless prompt with the span shaded (bottom)."""

from __future__ import annotations

from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.charts.style import attention_axes, curve, shade_span
from meaningless_tokens.report.phrases import (AXES_LAYERS, AXES_ORIGINAL, AXES_WEIGHT, HYPOTHESIS, change, head_list,
                                               label)
from meaningless_tokens.report.trace import Text, excludes_zero, interval

KIND = "heads"
PER_MODEL = True


def draw(plt, ctx: Context, name: str):
    st, cfg, lab = ctx.stats[name], ctx.params.figures, ctx.labels(KIND)
    v = ctx.view(name, KIND)
    disp, heads, li = v.disp, v.heads, v.li
    P, F = cfg.original_positions, cfg.full_positions
    fig, axes = plt.subplots(2, len(heads), figsize=(4.2 * len(heads), 6.4), squeeze=False)
    for k, h in enumerate(heads):
        hi = st["heads"].index(h)
        for c in ("none", "mless"):
            curve(axes[0][k], st, c, "original", li, hi, P, label=lab.legend(c))
        axes[0][k].set_title(f"{disp} {label(v.layer, h)}")
        attention_axes(axes[0][k], lab, lab["x"], P)
        curve(axes[1][k], st, "mless", "full", li, hi, F, label=lab.legend("mless"))
        shade_span(axes[1][k], st, "mless", F, label=lab["band"])
        axes[1][k].set_title(lab.text("title_full", disp=disp, layer_head=label(v.layer, h)))
        attention_axes(axes[1][k], lab, lab["x_full"], F)
    axes[0][0].legend(loc="upper right")
    axes[1][0].legend(loc="upper right")
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: str) -> Chart:
    v = ctx.view(name, KIND)
    li = v.li
    s, e = v.span
    rows, drops, sig, collapse = [], [], 0, []
    for h in v.heads:
        hi = v.hi(h)
        mn, mm = v.orig_mean("none", li, hi), v.orig_mean("mless", li, hi)
        pct, lo, up = v.drop_pct("mless", li, hi)
        mass, mlo, mhi = v.span_mass("mless", li, hi)
        parts = [f"Head {h + 1}: original tokens receive ", mn, " (none) and ", mm, " (mless) on average: their attention ",
                 change(pct), " % (the drop's interval ", interval(lo, up), "); the span takes ", mass, " % ", interval(mlo, mhi),
                 " of the original queries' attention."]
        if 0 <= s < e - 1 and e <= v.F:
            first_tok = v.n("mless", "full_avg", fmt=".4f", layer=li, head=hi, position=s)
            rest = v.n("mless", "full_avg", "mean", ".4f", layer=li, head=hi, position=slice(s + 1, e))
            parts += [" In the full mless prompt the span's first token (position ", str(s), ") receives ", first_tok,
                      ", its other tokens ", rest, " on average."]
            collapse.append((h, rest.value < first_tok.value / 2))
        rows.append(Text(*parts))
        drops.append((h, pct))
        sig += excludes_zero(lo, up) and pct.value > 0
    top = max(drops, key=lambda d: d[1].value)
    obs = [Text(f"Of the {len(v.heads)} heads shown, head {top[0] + 1} has the largest drop in percent (",
                top[1], " %); " + ("none of them has" if sig == 0 else "all of them have" if sig == len(v.heads) else
                             f"{sig} of them have") + " a drop whose interval lies above zero.")]
    if collapse:
        fell = [h for h, c in collapse if c]
        obs.append(Text(
            f"The span's attention collapses after its first token (the other span tokens receive less than half "
            f"of what the first receives) in head{'s' if len(fell) > 1 else ''} {head_list(fell)}." if fell else
            "In none of these heads does the span's attention collapse after its first token: it stays "
            "spread over the span.",
            f" Heads where it stays spread: {head_list(h for h, c in collapse if not c)}." if fell and
            len(fell) < len(collapse) else ""))
    return Chart(
        f"{v.name}-heads", f"{v.disp}: {label(v.layer)}, heads {head_list(v.heads)}",
        [Text(f"{v.disp}, {label(v.layer)}, heads {head_list(v.heads)} (the heads whose mean attention on "
              "original tokens drops most under mless, in absolute terms, unless figures.charts.heads or figures.heads "
              "names them). Top row: attention on original tokens, none vs mless. "
              "Bottom row: what every position of the whole mless prompt receives, the meaningless span shaded.")],
        [Text("Top row: " + AXES_ORIGINAL), Text("Bottom row: x axis is the token position in the mless prompt, "
              f"the span covering positions {s} to {e - 1}."), Text(AXES_WEIGHT),
         Text("Blue: none; red: mless; shaded band: the meaningless tokens. " + AXES_LAYERS)],
        rows, obs,
        [Text(HYPOTHESIS), Text(("No head shown agrees" if sig == 0 else "Every head shown agrees" if sig == len(v.heads) else
                                 f"{sig} of {len(v.heads)} heads shown agree") + ": their drop's interval lies above zero"
                                + ("." if sig == len(v.heads) else "; for the others it includes zero or lies below "
                                   "it, so they do not support the prediction."))])
