"""activation-shift: across models, how much each activation measure changes under mless and mful
(paired difference to none over the same problems, in percent of the none mean, with its bootstrap 95 %
interval), beside lambda, the attention mass original queries keep on original keys in the same layer."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.results.activations import NAMES, views
from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, LABELS
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.prose import say
from meaningless_tokens.results.trace import ALL, excludes_zero

KIND = "activation-shift"
TEXT = "charts/activation_shift.j2"
PER_MODEL = False
SECTION = "Activation shift"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 80  # its place in the report (charts.KINDS: by ORDER)
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
        contrasts = [{"cond": c, "d": v.diff(c, "z_var"), "base": v.mean("none", "z_var")[0]}
                     for c in v.conds if c != "none"]
        shifts += [(v, lam["mless"], *k["d"][:3]) for k in contrasts if k["cond"] == "mless"]
        rows.append(say(TEXT, "model", disp=v.disp, layer=label(v.layer), lam=lam, contrasts=contrasts))
    obs = []
    if shifts:
        grew = [v.disp for v, _, d, lo, hi in shifts if excludes_zero(lo, hi) and d.value > 0]
        obs.append(say(TEXT, "grows", grew=grew, total=len(shifts)))
        top = min(shifts, key=lambda s: s[1].value)
        obs.append(say(TEXT, "most", disp=top[0].disp, lam=top[1]))
    return Chart(
        KIND, "Activation shift across models",
        [say(TEXT, "overview")],
        [say(TEXT, m) for m in ("axes_panels", "axes_lambda", "axes_numbering")],
        rows, obs, [say(TEXT, "interpretation")])
