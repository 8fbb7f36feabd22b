"""activations: the paper's activation figure. One panel per model: the histogram of the first measured
layer's MLP activations a = act_fn(gate_proj(x)) over the original tokens, none vs mless (mful as a third
line; with `arm` configured, the ARM-transformed activations from the same hook as a fourth), log y so the
near-zero peak and the tails both show, with four small bar insets (sparsity, L1, L2, Gini: the mean over
problems per condition and its bootstrap 95 % interval)."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, LABELS, colour_key
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.prose import say
from meaningless_tokens.results.activations import CLAIM, NAMES, views

KIND = "activations"
TEXT = "charts/activations.j2"
PER_MODEL = False
SECTION = "Activation shift"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 70  # its place in the report (charts.KINDS: by ORDER)
INSETS = (("near_zero_robust", "Sparsity"), ("l1", "L1 norm"), ("l2", "L2 norm"), ("gini", "Gini"))


def draw(plt, ctx: Context, name: None = None):
    tokens = ctx.params.figures.activation_set
    fig, axes = plt.subplots(1, len(ctx.names), figsize=(5.2 * len(ctx.names), 4.4), squeeze=False)
    for ax, n in zip(axes[0], ctx.names):
        act = ctx.activations[n]
        edges = act["bin_edges"]
        tops, lows = [], []
        for c in act["conditions"]:
            counts = act[c][f"hist_{tokens}"][0]
            ax.stairs(counts, edges, color=COLORS[c], label=LABELS[c], lw=1.3)
            tops.append(counts.max())
            lows.append(counts[counts > 0].min() if (counts > 0).any() else 1)
        ax.set_yscale("log")
        lo, hi = max(0.5, min(lows)), max(max(tops), 1)
        ax.set_ylim(lo, hi * (hi / lo) ** 0.75)  # headroom above the curves for the insets
        ax.set_xlim(edges[0], edges[-1])
        ax.set_title(f"{ctx.disp(n)} {label(act['layers'][0])} MLP")
        ax.set_xlabel("Activation value a = act_fn(gate_proj(x))")
        ax.set_ylabel(f"Count ({'original' if tokens == 'original' else 'after-span'} tokens x channels)")
        ax.grid(alpha=0.3, lw=0.5)
        ax.legend(loc="lower center", fontsize=7)
        conds = act["conditions"]
        for k, (m, title) in enumerate(INSETS):
            ia = ax.inset_axes([0.04 + 0.24 * k, 0.66, 0.19, 0.26])
            means = [act[c][tokens][f"{m}_mean"][0] for c in conds]
            ci = np.array([act[c][tokens][f"{m}_ci"][:, 0] for c in conds])
            err = np.abs(ci.T - np.array(means))
            ia.bar(np.arange(len(conds)), means, 0.7, color=[COLORS[c] for c in conds], yerr=err,
                   error_kw={"lw": 0.8, "capsize": 1.5})
            ia.set_title(title, fontsize=7, pad=2)
            ia.set_xticks([])
            ia.tick_params(labelsize=5.5, length=2, pad=1)
            ia.set_ylim(0, 1.25 * max(float(ci.max()), 1e-12))
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    rows, obs, interp = [], [], []
    confirmed = {}  # (model, condition) -> measures that moved as the paper says
    shown = list(CLAIM | {"gini": 0})
    for v in views(ctx):
        means = [{"name": NAMES[m], "by_cond": {c: v.mean(c, m)[0] for c in v.conds}} for m in shown]
        pairs = [{"cond": c, "diffs": [(NAMES[m], v.diff(c, m)) for m in shown]} for c in v.conds if c != "none"]
        other = None
        if "mless" in v.conds:
            s = "original" if v.set == "after_span" else "after_span"
            other = {"set": s, "sparsity": v.diff("mless", "near_zero_robust", s), "l1": v.diff("mless", "l1", s)}
        # the count of problems is said, not traced
        rows.append(say(TEXT, "model", disp=v.disp, layer=label(v.layer), n=str(v.n("@n_samples", "d")), means=means,
                        pairs=pairs, other=other))
        for c in [c for c in v.conds if c != "none"]:
            agree, against, unclear = v.verdict(c)
            confirmed[(v.name, c)] = agree
            obs.append(say(TEXT, "moves", disp=v.disp, cond=c, agree=[NAMES[m] for m in agree],
                           against=[NAMES[m] for m in against], unclear=[NAMES[m] for m in unclear]))
    interp.append(say(TEXT, "claim"))
    full = [ctx.disp(n) for (n, c), agree in confirmed.items() if c == "mless" and len(agree) == len(CLAIM)]
    some = [ctx.disp(n) for (n, c), agree in confirmed.items() if c == "mless" and 0 < len(agree) < len(CLAIM)]
    total = len([1 for (n, c) in confirmed if c == "mless"])
    interp.append(say(TEXT, "agrees", full=full, some=some, total=total))
    pairs = [n for (n, c) in confirmed if c == "mful" and (n, "mless") in confirmed]
    if pairs:
        alike = [ctx.disp(n) for n in pairs if confirmed[(n, "mful")] == confirmed[(n, "mless")]]
        interp.append(say(TEXT, "meaningful", alike=alike, total=len(pairs)))
    arms = [n for (n, c) in confirmed if c == "arm"]
    if arms:
        alike = [ctx.disp(n) for n in arms if len(confirmed[(n, "arm")]) == len(CLAIM)]
        interp.append(say(TEXT, "arm", alike=alike, total=len(arms)))
    conds = views(ctx)[0].conds if ctx.names else ["none", "mless", "mful"]
    return Chart(
        KIND, f"Activation shift: {label(views(ctx)[0].layer)} MLP activations",
        [say(TEXT, "overview", set=ctx.params.figures.activation_set, arm="arm" in conds)],
        [say(TEXT, "axes_x"), say(TEXT, "axes_insets", colours=colour_key(conds)), say(TEXT, "axes_numbering")],
        rows, obs, interp)
