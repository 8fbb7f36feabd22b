"""accuracy: accuracy on the evaluated benchmark (MATH-500 by default) per model and condition, from the evaluation metrics only; its report section
also carries the accuracy table (`Chart.extra["table"]`)."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, Labels, colour_key
from meaningless_tokens.config import CONDITIONS
from meaningless_tokens.results.prose import say
from meaningless_tokens.results.trace import artifact

KIND = "accuracy"
TEXT = "charts/accuracy.j2"
PER_MODEL = False
SECTION = "Accuracy"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 100  # its place in the report (charts.KINDS: by ORDER)


def draw(plt, ctx: Context, name: None = None):
    # the models figures.charts.accuracy names (else figures.models), in its order
    metrics = {n: ctx.metrics[n] for n in ctx.chart_models(KIND) if n in ctx.metrics}
    names = list(metrics)
    lab = Labels(ctx.params.figures.labels, KIND)
    conds = [c for c in CONDITIONS if all(c in m["accuracy"] for m in metrics.values())]
    width = 0.8 / len(conds)
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(names), 3.6))
    for k, c in enumerate(conds):
        x = np.arange(len(names)) + (k - (len(conds) - 1) / 2) * width
        acc = [100 * metrics[n]["accuracy"][c] for n in names]
        bars = ax.bar(x, acc, width, color=COLORS[c], label=lab.legend(c))
        for b, n in zip(bars, names):
            ax.annotate(f"{metrics[n]['correct'][c]}/{metrics[n]['n_problems']}", (b.get_x() + b.get_width() / 2,
                        b.get_height()), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(np.arange(len(names)), [ctx.disp(n) for n in names], rotation=10)
    ax.set_ylabel(lab.text("y", benchmark=ctx.benchmark))
    ax.set_title(lab.get(f"title@{ctx.benchmark}", lab["title"]))
    ax.set_ylim(0, max(5.0, 1.25 * max(100 * v for m in metrics.values() for v in m["accuracy"].values())))
    ax.legend(loc="upper left")
    ax.grid(axis="y", alpha=0.3, lw=0.5)
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    names = [n for n in ctx.names if n in ctx.metrics]  # the models evaluated (evaluate.models)
    src, disp = ctx.src, {n: ctx.disp(n) for n in ctx.names}
    skipped = [disp[n] for n in ctx.names if n not in ctx.metrics]
    rows, table, gains, arm_gains = [], [], [], []
    for name in names:
        f = artifact("metrics/accuracy", name)
        n = src.js(f, "n_problems", fmt="d")
        conds = [c for c in CONDITIONS if c in src.json(f).get("accuracy", {})]
        acc = {c: src.js(f, f"accuracy.{c}", 100, ".1f") for c in conds}
        cor = {c: src.js(f, f"correct.{c}", fmt="d") for c in conds}
        paper = {c: src.js(f, f"paper_accuracy.{c}", 100, ".1f") for c in conds}
        pairs = {}
        for c in conds:
            if c != "none":
                k = f"{c}-none"
                pairs[c] = (src.js(f, f"{k}.delta", 100, "+.1f"), src.js(f, f"{k}.ci95_low", 100, "+.1f"),
                            src.js(f, f"{k}.ci95_high", 100, "+.1f"), src.js(f, f"{k}.mcnemar_p", fmt=".2f"))
        row = {"model": disp[name], "n": n, "acc": acc, "correct": cor, "paper": paper, "pairs": pairs, "conds": conds}
        rows.append(say(TEXT, "model", row=row, boxed={c: src.js(f, f"boxed_rate.{c}", 100, ".0f") for c in conds}))
        table.append(row)
        if "mless" in pairs:
            gains.append((name, pairs["mless"]))
        if "arm" in pairs:
            arm_gains.append((name, pairs["arm"]))
    obs = []
    for row in table:
        best = max(row["conds"], key=lambda c: row["acc"][c].value)
        ties = [c for c in row["conds"] if row["acc"][c].value == row["acc"][best].value]
        obs.append(say(TEXT, "highest", model=row["model"], best=best, ties=ties, acc=row["acc"][best]))
    if gains:
        up = [disp[g[0]] for g in gains if g[1][0].value > 0]
        sure = [disp[g[0]] for g in gains if g[1][1].value > 0]
        obs.append(say(TEXT, "mless_gain", up=up, sure=sure, total=len(gains)))
        interp = [say(TEXT, "paper_claim"), say(TEXT, "mless_verdict", sure=sure)]
    else:
        interp = [say(TEXT, "mless_not_run")]
    glance = obs[-1:] + interp[-1:]  # the report's "at a glance": the mless verdict
    arm_glance = []
    if arm_gains:
        up = [disp[g[0]] for g in arm_gains if g[1][0].value > 0]
        sure = [disp[g[0]] for g in arm_gains if g[1][1].value > 0 or g[1][2].value < 0]
        obs.append(say(TEXT, "arm_gain", up=up, sure=sure, total=len(arm_gains)))
        interp.append(say(TEXT, "arm_verdict", sure=sure))
        arm_glance = obs[-1:]
    n0 = table[0]["n"] if table else None
    conds_all = [c for c in CONDITIONS if any(c in row["conds"] for row in table)] or ["none", "mless", "mful"]
    return Chart(
        "accuracy", f"{ctx.benchmark} accuracy by prompt condition",
        [say(TEXT, "overview", benchmark=ctx.benchmark, n=n0)]
        + ([say(TEXT, "skipped", models=skipped)] if skipped else []),
        [say(TEXT, "axes", colours=colour_key(conds_all))],
        rows, obs, interp, extra={"table": table, "glance": glance, "arm_glance": arm_glance})
