"""span-sweep: the attention side of the dose-response. For each model and span character, Layer 1's drop of
attention on original tokens (mean over heads, and over the top heads) and the attention mass the span takes,
against the number of repetitions (stages/sweep.py), with bootstrap 95 % bands; with sweep.likelihood_samples > 0
a third panel: the reference solution's likelihood gain over count 0."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.prose import say, shared
from meaningless_tokens.results.trace import Num, artifact

KIND = "span-sweep"
TEXT = "charts/span_sweep.j2"
PER_MODEL = False
SECTION = "Span length"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 50  # its place in the report (charts.KINDS: by ORDER)
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
            who = {"disp": ctx.disp(n), "token": token_label(t["token"])}
            rows.append(say(TEXT, "series", **who, heads=", ".join(str(int(h) + 1) for h in t["top_heads"]),
                            reference=sw["reference_count"], steps=[
                                {"count": c, "tokens": toks[i], "drop": drop[i], "low": lo[i], "high": hi[i],
                                 "top": top[i], "mass": mass[i]} for i, c in enumerate(counts)]))
            if sw["likelihood_samples"]:
                lik = series(ctx, n, k, "likelihood_delta", "+.4f")
                llo = [ctx.src.h5(src, f"token_{k}/likelihood_delta_ci", fmt="+.4f", count=i, bound="low") for i in range(len(counts))]
                lhi = [ctx.src.h5(src, f"token_{k}/likelihood_delta_ci", fmt="+.4f", count=i, bound="high") for i in range(len(counts))]
                rows.append(say(TEXT, "likelihood", **who, n=sw["likelihood_samples"], steps=[
                    {"count": c, "gain": lik[i], "low": llo[i], "high": lhi[i]} for i, c in enumerate(counts) if c]))
            ok, falls = monotone(drop)
            (grow if ok else falls_at).append((who, [(counts[i], counts[i + 1]) for i in falls]))
    total = len(grow) + len(falls_at)
    obs = [say(TEXT, "grows", names=[f"{w['disp']}, token {w['token']}" for w, _ in grow], total=total)]
    for who, steps in falls_at:
        obs.append(say(TEXT, "falls", **who, steps=steps))
    toks = [(ctx.disp(n), t["token"], t["span_tokens"], sw["counts"]) for n in ctx.names
            for sw in [ctx.sweep[n]] for t in sw["tokens"]]
    nonlinear = [{"disp": d, "token": tok} for d, tok, st, counts in toks
                 if len({int(s) / c for s, c in zip(st, counts) if c}) > 1]
    obs.append(say(TEXT, "proportional", nonlinear=nonlinear))
    n0 = ctx.sweep[ctx.names[0]]
    return Chart(
        KIND, "Span length: attention against the number of meaningless characters",
        [say(TEXT, "overview", longest=max(n0["counts"]), n=n0["n_samples"])],
        [say(TEXT, m) for m in ("axes_x", "axes_left", "axes_right", "axes_third")] + [shared("axes_layers")],
        rows, obs, [say(TEXT, "interpretation")])
