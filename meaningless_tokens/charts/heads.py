"""<model>-heads: per head of the chart's layer (figures.charts.heads, else figures.layer and figures.heads), none
vs mless over original positions (top) and the full mless prompt with the span shaded (bottom)."""

from __future__ import annotations

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import Labels, attention_axes, curve, shade_span
from meaningless_tokens.results.phrases import change, head_list, label
from meaningless_tokens.results.prose import say, shared
from meaningless_tokens.results.trace import excludes_zero

KIND = "heads"
TEXT = "charts/heads.j2"
PER_MODEL = True
SECTION = "Attention"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 20  # its place in the report (charts.KINDS: by ORDER)


def draw(plt, ctx: Context, name: str):
    st, cfg, lab = ctx.stats[name], ctx.params.figures, Labels(ctx.params.figures.labels, KIND)
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
        pct, lo, up = v.drop_pct("mless", li, hi)
        mass, mlo, mhi = v.span_mass("mless", li, hi)
        span = None
        if 0 <= s < e - 1 and e <= v.F:
            span = {"start": s, "first": v.n("mless", "full_avg", fmt=".4f", layer=li, head=hi, position=s),
                    "rest": v.n("mless", "full_avg", "mean", ".4f", layer=li, head=hi, position=slice(s + 1, e))}
            collapse.append((h, span["rest"].value < span["first"].value / 2))
        rows.append(say(TEXT, "head", head=h + 1, base=v.orig_mean("none", li, hi), mless=v.orig_mean("mless", li, hi),
                        change=change(pct), low=lo, high=up, mass=mass, mass_low=mlo, mass_high=mhi, span=span))
        drops.append((h, pct))
        sig += excludes_zero(lo, up) and pct.value > 0
    top = max(drops, key=lambda d: d[1].value)
    obs = [say(TEXT, "largest", shown=len(v.heads), head=top[0] + 1, drop=top[1], sig=sig)]
    if collapse:
        fell = [h + 1 for h, c in collapse if c]
        obs.append(say(TEXT, "collapse", fell=fell,
                       spread=[h + 1 for h, c in collapse if not c] if len(fell) < len(collapse) else []))
    return Chart(
        f"{v.name}-heads", f"{v.disp}: {label(v.layer)}, heads {head_list(v.heads)}",
        [say(TEXT, "overview", disp=v.disp, layer=label(v.layer), heads=[h + 1 for h in v.heads])],
        [say(TEXT, "axes_top", original=shared("axes_original")), say(TEXT, "axes_bottom", start=s, end=e - 1),
         shared("axes_weight"), say(TEXT, "colours", layers=shared("axes_layers"))],
        rows, obs,
        [shared("hypothesis"), say(TEXT, "agree", shown=len(v.heads), sig=sig)])
