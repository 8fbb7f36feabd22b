"""activations: the paper's activation figure. One panel per model: the histogram of the first measured
layer's MLP activations a = act_fn(gate_proj(x)) over the original tokens, none vs mless (mful as a third
line; with `arm` configured, the ARM-transformed activations from the same hook as a fourth), log y so the
near-zero peak and the tails both show, with four small bar insets (sparsity, L1, L2, Gini: the mean over
problems per condition and its bootstrap 95 % interval)."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, LABELS, colour_key
from meaningless_tokens.report.phrases import count_of, label
from meaningless_tokens.report.trace import Num, Text, artifact, excludes_zero, interval

KIND = "activations"
PER_MODEL = False
INSETS = (("near_zero_robust", "Sparsity"), ("l1", "L1 norm"), ("l2", "L2 norm"), ("gini", "Gini"))
# the paper's claim for each measure under mless: -1 lower, +1 higher than none
CLAIM = {"near_zero_robust": -1, "near_zero_fixed": -1, "l1": +1, "l2": +1}
NAMES = {"near_zero_robust": "near-zero share (robust eps, %)", "near_zero_fixed": "near-zero share (fixed eps, %)",
         "l1": "mean |a| (L1)", "l2": "RMS of a (L2)", "gini": "Gini of |a|", "z_var": "variance of z over channels"}
SET_NAMES = {"original": "the original tokens", "after_span": "the original tokens after the span"}


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


class ActivationView:
    """Numbers of one model's activations file (first measured layer)."""

    def __init__(self, ctx: Context, name: str):
        self.ctx, self.name, self.act = ctx, name, ctx.activations[name]
        self.file = artifact("activations", name)
        self.disp = ctx.disp(name)
        self.layer = self.act["layers"][0]
        self.conds = self.act["conditions"]
        self.set = ctx.params.figures.activation_set  # the token set the charts show

    def n(self, ds: str, fmt: str = ".4g", op: str = "value", scale: float = 1.0, **at) -> Num:
        return self.ctx.src.h5(self.file, ds, op, scale, fmt, **at)

    def mean(self, c: str, m: str, s: str | None = None) -> tuple[Num, Num, Num]:
        """Mean over problems and its interval; shares in percent."""
        s = s or self.set
        kw = dict(fmt=".2f", scale=100) if m.startswith("near_zero") else dict(fmt=".4g")
        return (self.n(f"{c}/{s}/{m}_mean", layer=0, **kw), self.n(f"{c}/{s}/{m}_ci", bound="low", layer=0, **kw),
                self.n(f"{c}/{s}/{m}_ci", bound="high", layer=0, **kw))

    def diff(self, c: str, m: str, s: str | None = None) -> tuple[Num, Num, Num, Num]:
        """Paired difference to none, its interval (shares in percentage points) and the Wilcoxon p."""
        s = s or self.set
        kw = dict(fmt="+.2f", scale=100) if m.startswith("near_zero") else dict(fmt="+.3g")
        return (self.n(f"{c}/{s}/{m}_diff", layer=0, **kw), self.n(f"{c}/{s}/{m}_diff_ci", bound="low", layer=0, **kw),
                self.n(f"{c}/{s}/{m}_diff_ci", bound="high", layer=0, **kw), self.n(f"{c}/{s}/{m}_diff_p", ".2g", layer=0))

    def verdict(self, c: str, s: str | None = None) -> tuple[list[str], list[str], list[str]]:
        """Measures of CLAIM whose paired interval lies on the claimed side, on the other side, or spans 0."""
        agree, against, unclear = [], [], []
        for m, sign in CLAIM.items():
            d, lo, hi, _ = self.diff(c, m, s)
            if not excludes_zero(lo, hi):
                unclear.append(m)
            elif (d.value > 0) == (sign > 0):
                agree.append(m)
            else:
                against.append(m)
        return agree, against, unclear


def views(ctx: Context) -> list[ActivationView]:
    return [ActivationView(ctx, n) for n in ctx.names]


def _diff_text(v: ActivationView, c: str, m: str, s: str | None = None) -> Text:
    d, lo, hi, p = v.diff(c, m, s)
    return Text(d, " ", interval(lo, hi), ", Wilcoxon p = ", p)


def explain(ctx: Context, name: None = None) -> Chart:
    rows, obs, interp = [], [], []
    confirmed = {}  # (model, condition) -> measures that moved as the paper says
    for v in views(ctx):
        n = v.n("@n_samples", "d")
        parts = [f"{v.disp}, {label(v.layer)} MLP ({n} problems), means over problems: "]
        for m in CLAIM | {"gini": 0}:
            parts += [f"{NAMES[m]} ", *[p for c in v.conds for p in (f"{c} ", v.mean(c, m)[0], ", ")]]
            parts[-1] = "; "
        parts[-1] = ". "
        for c in [c for c in v.conds if c != "none"]:
            parts += [f"Paired {c} − none (shares in percentage points): "]
            for m in CLAIM | {"gini": 0}:
                parts += [f"{NAMES[m]} ", _diff_text(v, c, m), "; "]
            parts[-1] = ". "
        if "mless" in v.conds:
            other = "original" if v.set == "after_span" else "after_span"
            parts += [("On all original tokens" if other == "original" else
                       "On the after-span tokens alone (the ones the span can change)") + ", mless − none: near-zero "
                      "share (robust eps) ", _diff_text(v, "mless", "near_zero_robust", other), "; L1 ",
                      _diff_text(v, "mless", "l1", other), "."]
        rows.append(Text(*parts))
        for c in [c for c in v.conds if c != "none"]:
            agree, against, unclear = v.verdict(c)
            confirmed[(v.name, c)] = agree
            obs.append(Text(f"{v.disp}, {c}: " + (
                f"{', '.join(NAMES[m] for m in agree)} move as the paper says" if agree else
                "no measure moves as the paper says with an interval that excludes zero") +
                (f"; {', '.join(NAMES[m] for m in against)} move the other way" if against else "") +
                (f"; {', '.join(NAMES[m] for m in unclear)} have intervals that include zero" if unclear else "") + "."))
    interp.append(Text("The paper's claim: with meaningless tokens the first layer's MLP activations spread, so fewer "
                       "sit near zero (sparsity down) and their magnitude grows (L1 and L2 up); ARM imitates this "
                       "by moving near-zero activations outward."))
    full = [ctx.disp(n) for (n, c), agree in confirmed.items() if c == "mless" and len(agree) == len(CLAIM)]
    some = [ctx.disp(n) for (n, c), agree in confirmed.items() if c == "mless" and 0 < len(agree) < len(CLAIM)]
    total = len([1 for (n, c) in confirmed if c == "mless"])
    interp.append(Text(f"This run agrees on all four measures (both near-zero shares down, L1 and L2 up, each "
                       f"interval excluding zero) for {count_of(full, total)}"
                       + (f", and on some of them for {count_of(some, total)}." if some else ".")))
    pairs = [n for (n, c) in confirmed if c == "mful" and (n, "mless") in confirmed]
    if pairs:
        alike = [ctx.disp(n) for n in pairs if confirmed[(n, "mful")] == confirmed[(n, "mless")]]
        interp.append(Text(f"The meaningful span confirms the same measures as the meaningless one for "
                           f"{count_of(alike, len(pairs))}" +
                           "; where the two differ, the shift is not just an effect of inserting tokens."))
    arms = [n for (n, c) in confirmed if c == "arm"]
    if arms:
        alike = [ctx.disp(n) for n in arms if len(confirmed[(n, "arm")]) == len(CLAIM)]
        interp.append(Text("ARM (arm) edits these activations directly, so its measures show what the edit does by "
                           f"construction: all four move the paper's way for {count_of(alike, len(arms))}"
                           "; compare their size with mless's."))
    conds = views(ctx)[0].conds if ctx.names else ["none", "mless", "mful"]
    return Chart(
        KIND, f"Activation shift: {label(views(ctx)[0].layer)} MLP activations",
        [Text("For each model, the distribution of a = act_fn(gate_proj(x)) in the first measured layer's MLP (the "
              f"tensor ARM edits), pooled over {SET_NAMES[ctx.params.figures.activation_set]} "
              "(figures.activation_set) and all channels of every problem, without "
              "insertion (none), with meaningless tokens (mless) and with a meaningful span (mful)"
              + (", and with the paper's ARM applied to them (arm, the none prompt)" if "arm" in conds else "")
              + ". The insets give "
              "four summaries of the same activations per problem, averaged over problems.")],
        [Text("x axis: activation value on fixed bins (activations.range, activations.bins); values outside the "
              "range are counted apart in the file. y axis: count, log scale."),
         Text(f"Insets ({colour_key(conds)}): Sparsity = share of |a| below eps = 1.4826 · MAD(|a|) · "
              "activations.mad_c, the paper's robust radius; L1 = mean |a|; L2 = root mean square of a; Gini of |a|. "
              "Bars start at 0; whiskers are bootstrap 95 % intervals over problems."),
         Text("Layers are numbered from 1 (Layer 1 is index 0 in the files).")],
        rows, obs, interp)
