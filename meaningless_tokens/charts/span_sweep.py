"""span-sweep: the attention side of the dose-response. For each model and span character, Layer 1's drop of
attention on original tokens (mean over heads, and over the top heads) and the attention mass the span takes,
against the number of repetitions (stages/sweep.py), with bootstrap 95 % bands; with sweep.likelihood_samples > 0
a third panel: the reference solution's likelihood gain over count 0."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.report.phrases import AXES_LAYERS, count_of, label
from meaningless_tokens.report.trace import Num, Text, artifact, interval

KIND = "span-sweep"
PER_MODEL = False
MARKERS = "osD^vP*X"


def model_colors(names: list[str]) -> dict[str, str]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {n: matplotlib.colors.to_hex(cmap(k % 10)) for k, n in enumerate(names)}


def token_label(token: str) -> str:
    return f"'{token}'"


def draw(plt, ctx: Context, name: None = None):
    colors = model_colors(ctx.names)
    with_lik = [n for n in ctx.names if ctx.sweep[n]["likelihood_samples"]]
    fig, axes = plt.subplots(1, 3 if with_lik else 2, figsize=(17 if with_lik else 12, 4.3))
    a1, a2 = axes[:2]
    for n in ctx.names:
        sw = ctx.sweep[n]
        x = np.array(sw["counts"])
        for k, t in enumerate(sw["tokens"]):
            tag = f"{ctx.disp(n)}" + (f", {token_label(t['token'])}" if len(sw["tokens"]) > 1 else "")
            m = MARKERS[k % len(MARKERS)]
            a1.plot(x, t["drop_heads_pct"], color=colors[n], marker=m, ms=4, lw=1.5, label=f"{tag}: all heads")
            a1.fill_between(x, t["drop_heads_pct_ci"][:, 0], t["drop_heads_pct_ci"][:, 1], color=colors[n], alpha=0.15, lw=0)
            a1.plot(x, t["drop_top_pct"], color=colors[n], marker=m, ms=4, lw=1.2, ls="--",
                    label=f"{tag}: top {len(t['top_heads'])} heads")
            a1.fill_between(x, t["drop_top_pct_ci"][:, 0], t["drop_top_pct_ci"][:, 1], color=colors[n], alpha=0.08, lw=0)
            a2.plot(x, 100 * t["span_mass_heads"], color=colors[n], marker=m, ms=4, lw=1.5, label=tag)
            a2.fill_between(x, 100 * t["span_mass_heads_ci"][:, 0], 100 * t["span_mass_heads_ci"][:, 1],
                            color=colors[n], alpha=0.15, lw=0)
    if with_lik:
        a3 = axes[2]
        for n in with_lik:
            sw = ctx.sweep[n]
            x = np.array(sw["counts"])
            for k, t in enumerate(sw["tokens"]):
                tag = f"{ctx.disp(n)}" + (f", {token_label(t['token'])}" if len(sw["tokens"]) > 1 else "")
                a3.plot(x, t["likelihood_delta"], color=colors[n], marker=MARKERS[k % len(MARKERS)], ms=4, lw=1.5,
                        label=f"{tag} ({sw['likelihood_samples']} problems)")
                a3.fill_between(x, t["likelihood_delta_ci"][:, 0], t["likelihood_delta_ci"][:, 1], color=colors[n],
                                alpha=0.15, lw=0)
        a3.set_title("Reference solution: log-prob gain over count 0", fontsize=10)
        a3.set_ylabel("mean paired difference, nats/token")
        a3.legend(fontsize=7.5, loc="best")
    layer = ctx.sweep[ctx.names[0]]["layer"]
    a1.set_title(f"{label(layer)}: drop of attention on original tokens", fontsize=10)
    a1.set_ylabel("drop vs none, % of the none mean")
    a2.set_title(f"{label(layer)}: attention original queries give to the span", fontsize=10)
    a2.set_ylabel("span mass, % of each query's attention")
    for ax in axes:
        ax.set_xlabel("Meaningless characters inserted (repetitions of the span token)")
        ax.set_xticks(sorted({c for n in ctx.names for c in ctx.sweep[n]["counts"]}))
        ax.axhline(0, color="#444", lw=0.7)
        ax.grid(alpha=0.3, lw=0.5)
    a1.legend(fontsize=7.5, loc="upper left")
    a2.legend(fontsize=7.5, loc="upper left")
    fig.suptitle("Span length: attention shift against the number of meaningless characters", fontsize=11)
    fig.tight_layout()
    return fig


def series(ctx: Context, name: str, k: int, ds: str, fmt: str, scale: float = 1.0) -> list[Num]:
    src = artifact("sweep", name)
    return [ctx.src.h5(src, f"token_{k}/{ds}", fmt=fmt, scale=scale, count=i) for i in range(len(ctx.sweep[name]["counts"]))]


def monotone(values: list[Num]) -> tuple[bool, list[int]]:
    """Whether the values rise at every step; the steps (indices i: i -> i + 1) where they do not."""
    falls = [i for i in range(len(values) - 1) if not values[i + 1].value > values[i].value]
    return not falls, falls


def explain(ctx: Context, name: None = None) -> Chart:
    rows, grow, falls_at = [], [], []
    for n in ctx.names:
        sw = ctx.sweep[n]
        counts = sw["counts"]
        src = artifact("sweep", n)
        for k, t in enumerate(sw["tokens"]):
            drop = series(ctx, n, k, "drop_heads_pct", "+.1f")
            lo = [ctx.src.h5(src, f"token_{k}/drop_heads_pct_ci", fmt="+.1f", count=i, bound="low") for i in range(len(counts))]
            hi = [ctx.src.h5(src, f"token_{k}/drop_heads_pct_ci", fmt="+.1f", count=i, bound="high") for i in range(len(counts))]
            top = series(ctx, n, k, "drop_top_pct", "+.1f")
            mass = series(ctx, n, k, "span_mass_heads", ".1f", 100)
            toks = series(ctx, n, k, "span_tokens", "d")
            who = f"{ctx.disp(n)}, token {token_label(t['token'])}"
            parts = [f"{who}: span length in tokens per count "]
            parts += sum(([f"{c} → ", toks[i], ", " if i < len(counts) - 1 else "; "] for i, c in enumerate(counts)), [])
            parts += ["drop over all heads "]
            parts += sum(([f"{c}: ", drop[i], " % ", interval(lo[i], hi[i]), ", " if i < len(counts) - 1 else "; "]
                          for i, c in enumerate(counts)), [])
            heads = ", ".join(str(int(h) + 1) for h in t["top_heads"])
            parts += [f"over the top heads ({heads}, chosen at count {sw['reference_count']}) "]
            parts += sum(([f"{c}: ", top[i], " %", ", " if i < len(counts) - 1 else "; "] for i, c in enumerate(counts)), [])
            parts += ["span mass "]
            parts += sum(([f"{c}: ", mass[i], " %", ", " if i < len(counts) - 1 else "."] for i, c in enumerate(counts)), [])
            rows.append(Text(*parts))
            if sw["likelihood_samples"]:
                lik = series(ctx, n, k, "likelihood_delta", "+.4f")
                llo = [ctx.src.h5(src, f"token_{k}/likelihood_delta_ci", fmt="+.4f", count=i, bound="low") for i in range(len(counts))]
                lhi = [ctx.src.h5(src, f"token_{k}/likelihood_delta_ci", fmt="+.4f", count=i, bound="high") for i in range(len(counts))]
                parts = [f"{who}: reference solution's log-prob gain over count 0 ({sw['likelihood_samples']} problems, "
                         "nats/token) "]
                parts += sum(([f"{c}: ", lik[i], " ", interval(llo[i], lhi[i]), ", " if i < len(counts) - 1 else "."]
                              for i, c in enumerate(counts) if c), [])
                rows.append(Text(*parts))
            ok, falls = monotone(drop)
            (grow if ok else falls_at).append((who, [(counts[i], counts[i + 1]) for i in falls]))
    obs = []
    total = len(grow) + len(falls_at)
    obs.append(Text("The drop over all heads grows at every step of the count for "
                    + count_of([w for w, _ in grow], total, "model/token series", "model/token series") + "."))
    for who, steps in falls_at:
        obs.append(Text(f"{who}: the drop does not grow from " + ", ".join(f"{a} to {b}" for a, b in steps) + "."))
    toks = [(ctx.disp(n), t["token"], t["span_tokens"], sw["counts"]) for n in ctx.names
            for sw in [ctx.sweep[n]] for t in sw["tokens"]]
    nonlinear = [f"{d} ('{tok}')" for d, tok, st, counts in toks
                 if len({int(s) / c for s, c in zip(st, counts) if c}) > 1]
    obs.append(Text("Every tokenizer turns n repetitions into a span of proportionally many tokens." if not nonlinear
                    else f"Not proportional (a tokenizer merges repetitions): {', '.join(nonlinear)}; the spans are "
                         "compared by their token counts above."))
    n0 = ctx.sweep[ctx.names[0]]
    return Chart(
        KIND, "Span length: attention against the number of meaningless characters",
        [Text("How the first layer's attention shift depends on the span's length: the same problems with 0 to "
              f"{max(n0['counts'])} repetitions of the span token inserted between instruction and question "
              f"({n0['n_samples']} problems per model; count 0 is the prompt without insertion). The paper varies "
              "this count (0, 10, 25, 40, 55, 70) and uses 55.")],
        [Text("x axis: number of repetitions of the span token (characters, not tokens; the text gives each "
              "tokenizer's span length in tokens)."),
         Text("Left, y axis: mean over problems of the drop of the attention an original token receives (mean over "
              "original tokens, position 0 excluded as in the statistics), in percent of the none mean; solid: the "
              "mean over all heads, dashed: over the top heads (largest drop at the reference count, the same heads "
              "at every count); bands: bootstrap 95 % intervals over problems."),
         Text("Right, y axis: the share of their attention that original queries after the span give to the span "
              "(1 − λ), mean over heads, with its interval."),
         Text("Third panel (when sweep.likelihood_samples > 0): the mean paired difference of the reference "
              "solution's log-prob per token to count 0, with its bootstrap interval (stages/likelihood.py's outcome "
              "at every count)."),
         Text(AXES_LAYERS)],
        rows, obs,
        [Text("The paper's account predicts that a longer span takes more attention (larger span mass, smaller λ) "
              "and so lowers the original tokens' weights further: the drop should grow with the count, and count 0 "
              "gives none by construction. A rise that flattens means each further character adds less.")])
