"""pass-at-k: the paper's ARM figure under sampling (`evaluate.sampling.n` > 0): pass@k bars with intervals and
the 2-gram diversity, per model and condition (none as the paper's Baseline, arm as its ARM, mless and mful beside
them), from metrics/accuracy/<model>.json `sampling`."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, LABELS, colour_key
from meaningless_tokens.config import CONDITIONS
from meaningless_tokens.results.prose import plain, say
from meaningless_tokens.results.trace import Text, artifact

KIND = "pass-at-k"
TEXT = "charts/pass_at_k.j2"
PER_MODEL = False
SECTION = "Accuracy"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 110  # its place in the report (charts.KINDS: by ORDER)
ENABLE = "dvc exp run -S evaluate.sampling.n=3"


def _models(ctx: Context) -> list[str]:
    return [n for n in ctx.chart_models(KIND) if "sampling" in ctx.metrics.get(n, {})]  # evaluated models only


def unavailable(ctx: Context) -> str | None:
    """Why the chart is not drawn (None: it is)."""
    if _models(ctx):
        return None
    return plain(TEXT, "unavailable", command=ENABLE)


def k_shown(ctx: Context) -> int:
    """The paper's pass@3, or pass@n where fewer than 3 samples were drawn."""
    return min(3, min(ctx.metrics[n]["sampling"]["n"] for n in _models(ctx)))


def draw(plt, ctx: Context, name: None = None):
    names = _models(ctx)
    k = k_shown(ctx)
    conds = [c for c in CONDITIONS if all(c in ctx.metrics[n]["sampling"][f"pass@{k}"] for n in names)]
    width = 0.8 / len(conds)
    fig, axes = plt.subplots(1, 2, figsize=(4.0 + 3.2 * len(names), 3.8))
    for ax, metric, scale, ylabel in ((axes[0], f"pass@{k}", 100, f"pass@{k} (%, math-verify)"),
                                      (axes[1], "distinct-2", 1, "2-gram diversity (distinct-2)")):
        for j, c in enumerate(conds):
            x = np.arange(len(names)) + (j - (len(conds) - 1) / 2) * width
            s = [ctx.metrics[n]["sampling"] for n in names]
            v = np.array([scale * m[metric][c] for m in s])
            err = np.array([[v[i] - scale * m["ci95_low"][metric][c], scale * m["ci95_high"][metric][c] - v[i]]
                            for i, m in enumerate(s)]).T
            ax.bar(x, v, width, color=COLORS[c], label=LABELS[c], yerr=err, capsize=3,
                   error_kw={"lw": 0.8, "ecolor": "0.25"})
        ax.set_xticks(np.arange(len(names)), [ctx.disp(n) for n in names], rotation=10)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3, lw=0.5)
    axes[0].set_ylim(0, 100)
    axes[1].set_ylim(0, 1)
    axes[0].set_title(f"pass@{k} under sampling")
    axes[1].set_title("Diversity of the samples")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    reason = unavailable(ctx)
    title = "Sampling: pass@k and 2-gram diversity"
    if reason is not None:
        return Chart(KIND, title, [], [], [Text(reason)], [], [], extra={"unavailable": reason})
    k = k_shown(ctx)
    rows, obs = [], []
    for n in _models(ctx):
        f = artifact("metrics/accuracy", n)
        s = ctx.metrics[n]["sampling"]
        conds = [c for c in CONDITIONS if c in s[f"pass@{k}"]]
        shown = [{"cond": c, "pass": ctx.src.js(f, f"sampling.pass@{k}.{c}", 100, ".1f"),
                  "low": ctx.src.js(f, f"sampling.ci95_low.pass@{k}.{c}", 100, ".1f"),
                  "high": ctx.src.js(f, f"sampling.ci95_high.pass@{k}.{c}", 100, ".1f"),
                  "distinct": ctx.src.js(f, f"sampling.distinct-2.{c}", 1, ".3f")} for c in conds]
        contrasts = []
        for c in conds:
            if c == "none":
                continue
            key = f"sampling.{c}-none"
            contrasts.append({"cond": c, "d": ctx.src.js(f, f"{key}.pass@{k}.delta", 100, "+.1f"),
                              "low": ctx.src.js(f, f"{key}.pass@{k}.ci95_low", 100, "+.1f"),
                              "high": ctx.src.js(f, f"{key}.pass@{k}.ci95_high", 100, "+.1f"),
                              "dd": ctx.src.js(f, f"{key}.distinct-2.delta", 1, "+.3f"),
                              "dlow": ctx.src.js(f, f"{key}.distinct-2.ci95_low", 1, "+.3f"),
                              "dhigh": ctx.src.js(f, f"{key}.distinct-2.ci95_high", 1, "+.3f")})
            x = contrasts[-1]
            obs.append(say(TEXT, "contrast", disp=ctx.disp(n), cond=c, k=k, d=x["d"],
                           sure=x["low"].value > 0 or x["high"].value < 0))
        rows.append(say(TEXT, "model", disp=ctx.disp(n), problems=ctx.src.js(f, "sampling.n_problems", fmt="d"),
                        samples=ctx.src.js(f, "sampling.n", fmt="d"), k=k, conds=shown, contrasts=contrasts))
    conds_all = [c for c in CONDITIONS if any(c in ctx.metrics[n]["sampling"][f"pass@{k}"] for n in _models(ctx))]
    return Chart(
        KIND, title,
        [say(TEXT, "overview", k=k)],
        [say(TEXT, "axes", k=k, colours=colour_key(conds_all))],
        rows, obs,
        [say(TEXT, "interpretation")])
