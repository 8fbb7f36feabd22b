"""span-accuracy: the paper's dose-response chart, MATH-500 accuracy against the number of meaningless
characters, one line per model (and span token), from the sweep's accuracy (`sweep.accuracy_samples` > 0)."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.span_sweep import MARKERS, model_colors, token_label
from meaningless_tokens.results.prose import plain, say
from meaningless_tokens.results.trace import Text, artifact

KIND = "span-accuracy"
TEXT = "charts/span_accuracy.j2"
PER_MODEL = False
SECTION = "Span length"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 60  # its place in the report (charts.KINDS: by ORDER)
ENABLE = "dvc exp run -S sweep.accuracy_samples=10"


def unavailable(ctx: Context) -> str | None:
    """Why the chart is not drawn (None: it is)."""
    off = [ctx.disp(n) for n in ctx.names if not ctx.sweep[n]["accuracy_samples"]]
    if off:
        return plain(TEXT, "unavailable", models=off, command=ENABLE)
    return None


def draw(plt, ctx: Context, name: None = None):
    colors = model_colors(ctx.names)
    fig, ax = plt.subplots(figsize=(7, 4.3))
    for n in ctx.names:
        sw = ctx.sweep[n]
        x = np.array(sw["counts"])
        for k, t in enumerate(sw["tokens"]):
            acc = 100 * t["correct"].mean(axis=1)
            base = 100 * sw["correct_none"].mean()
            lo, hi = base + 100 * t["accuracy_delta_ci"][:, 0], base + 100 * t["accuracy_delta_ci"][:, 1]
            tag = ctx.disp(n) + (f", {token_label(t['token'])}" if len(sw["tokens"]) > 1 else "")
            ax.plot(x, acc, color=colors[n], marker=MARKERS[k % len(MARKERS)], ms=5, lw=1.6, label=tag)
            ax.fill_between(x, lo, hi, color=colors[n], alpha=0.12, lw=0)
    ax.set_xlabel("Meaningless characters inserted (repetitions of the span token)")
    ax.set_ylabel("MATH-500 accuracy (%, math-verify)")
    ax.set_xticks(sorted({c for n in ctx.names for c in ctx.sweep[n]["counts"]}))
    ax.set_title("Accuracy against the number of meaningless characters")
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    rows, obs = [], []
    reason = unavailable(ctx)
    if reason is None:
        for n in ctx.names:
            sw = ctx.sweep[n]
            counts, f = sw["counts"], artifact("sweep", n)
            for t in sw["tokens"]:
                g = t["group"]
                who = {"disp": ctx.disp(n), "token": token_label(t["token"])}
                acc = [ctx.src.h5(f, f"{g}/accuracy", fmt=".1f", scale=100, count=i) for i in range(len(counts))]
                steps = []
                for i, c in enumerate(counts):
                    steps.append({"count": c, "acc": acc[i], "d": None})
                    if c:
                        steps[-1].update(
                            d=ctx.src.h5(f, f"{g}/accuracy_delta", fmt="+.1f", scale=100, count=i),
                            low=ctx.src.h5(f, f"{g}/accuracy_delta_ci", fmt="+.1f", scale=100, count=i, bound="low"),
                            high=ctx.src.h5(f, f"{g}/accuracy_delta_ci", fmt="+.1f", scale=100, count=i, bound="high"),
                            p=ctx.src.h5(f, f"{g}/mcnemar_p", fmt=".2f", count=i))
                rows.append(say(TEXT, "series", **who, n=sw["accuracy_samples"], steps=steps))
                best = max(a.value for a in acc)
                peaks = [c for c, a in zip(counts, acc) if a.value == best]
                obs.append(say(TEXT, "peak", **who, peaks=peaks, acc=acc[counts.index(peaks[0])], longest=counts[-1],
                               last=acc[-1], below=acc[-1].value < best))
    else:
        rows.append(Text(reason))
    return Chart(
        KIND, "Span length: accuracy against the number of meaningless characters",
        [say(TEXT, "overview")], [say(TEXT, "axes")], rows, obs, [say(TEXT, "interpretation")])
