"""activation-shift: across models, how much each activation measure changes under mless and mful
(paired difference to none over the same problems, in percent of the none mean, with its bootstrap 95 %
interval), beside lambda, the attention mass original queries keep on original keys in the same layer."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.charts.activations import NAMES, views
from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, LABELS
from meaningless_tokens.report.phrases import count_of, label
from meaningless_tokens.report.trace import ALL, Text, excludes_zero, interval

KIND = "activation-shift"
PER_MODEL = False
MEASURES = ("near_zero_robust", "near_zero_fixed", "l1", "l2", "gini", "z_var")


def relative(act: dict, c: str, m: str, tokens: str) -> tuple[float, float, float]:
    """Paired difference c - none of measure m, first measured layer, in percent of none's mean."""
    base = act["none"][tokens][f"{m}_mean"][0]
    d, ci = act[c][tokens][f"{m}_diff"][0], act[c][tokens][f"{m}_diff_ci"][:, 0]
    scale = 100 / base if base else np.nan
    return d * scale, ci[0] * scale, ci[1] * scale


def draw(plt, ctx: Context, name: None = None):
    names = ctx.names
    conds = [c for c in ("mless", "mful") if all(c in ctx.activations[n]["conditions"] for n in names)]
    fig, axes = plt.subplots(2, 4, figsize=(13.5, 6.2))
    flat = axes.ravel()
    x = np.arange(len(names))
    width = 0.8 / max(1, len(conds))
    for ax, m in zip(flat, MEASURES):
        for k, c in enumerate(conds):
            vals = np.array([relative(ctx.activations[n], c, m, ctx.params.figures.activation_set) for n in names])
            ax.bar(x + (k - (len(conds) - 1) / 2) * width, vals[:, 0], width, color=COLORS[c], label=LABELS[c],
                   yerr=np.abs(vals[:, 1:].T - vals[:, 0]), error_kw={"lw": 0.8, "capsize": 2})
        ax.axhline(0, color="#444", lw=0.7)
        ax.set_title(NAMES[m], fontsize=10)
        ax.set_ylabel("change vs none, %")
    ax = flat[len(MEASURES)]
    allc = ["none"] + conds
    width = 0.8 / len(allc)
    for k, c in enumerate(allc):
        lam = [ctx.activations[n][c]["lambda_mean"][0].mean() for n in names]
        ax.bar(x + (k - (len(allc) - 1) / 2) * width, lam, width, color=COLORS[c], label=LABELS[c])
    ax.set_title("λ: attention kept on original keys", fontsize=10)
    ax.set_ylabel("mean over heads")
    ax.set_ylim(0, 1.05)
    for ax in flat[:-1]:
        ax.set_xticks(x, [ctx.disp(n) for n in names], rotation=20, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3, lw=0.5)
    handles, labels = flat[len(MEASURES)].get_legend_handles_labels()
    flat[-1].axis("off")  # the free slot holds the legend
    flat[-1].legend(handles, labels, loc="center", fontsize=9)
    layer = ctx.activations[names[0]]["layers"][0]
    fig.suptitle(f"{label(layer)}: attention kept on original tokens and the MLP activation shift", fontsize=11)
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    rows, shifts = [], []
    for v in views(ctx):
        lam = {c: v.n(f"{c}/lambda_mean", ".3f", "mean", layer=0, head=ALL) for c in v.conds}
        parts = [f"{v.disp}, {label(v.layer)}: original queries after the span keep λ = "]
        for c in v.conds:
            parts += [lam[c], f" ({c})", ", " if c != v.conds[-1] else ""]
        parts += [" of their attention on original keys, averaged over heads."]
        for c in [c for c in v.conds if c != "none"]:
            d, lo, hi, p = v.diff(c, "z_var")
            base = v.mean("none", "z_var")[0]
            parts += [f" Variance of z over channels, {c} − none: ", d, " ", interval(lo, hi), " (none: ", base,
                      "), Wilcoxon p = ", p, "."]
            if c == "mless":
                shifts.append((v, lam["mless"], d, lo, hi))
        rows.append(Text(*parts))
    obs = []
    if shifts:
        grew = [v.disp for v, _, d, lo, hi in shifts if excludes_zero(lo, hi) and d.value > 0]
        obs.append(Text(f"The variance of the gate pre-activation grows under mless, with an interval above zero, for "
                        f"{count_of(grew, len(shifts))}."))
        top = min(shifts, key=lambda s: s[1].value)
        obs.append(Text(f"{top[0].disp} moves the most attention to the span: its original queries keep λ = ",
                        top[1], " under mless."))
    return Chart(
        KIND, "Activation shift across models",
        [Text("Each model's change of every activation measure under mless and mful, relative to none (paired over "
              "the same problems), next to λ, the share of attention that original queries keep on original keys in "
              "the same layer: the first link of the paper's chain (attention on the span → affine shift of the "
              "attention output → spread of the MLP activations).")],
        [Text("Panels 1-6: x axis models; y axis: mean paired difference to none in percent of the none mean; "
              "whiskers: its bootstrap 95 % interval, scaled the same way. Red mless, green mful."),
         Text("Last panel: λ averaged over heads (1 for none by definition: no span)."),
         Text("Layers are numbered from 1 (Layer 1 is index 0 in the files).")],
        rows, obs,
        [Text("The paper's account predicts λ < 1 under mless and a larger variance of the gate pre-activations, "
              "hence a wider activation distribution; a model whose λ stays near 1 should show little shift.")])
