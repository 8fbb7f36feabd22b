"""accuracy: accuracy on the evaluated benchmark (MATH-500 by default) per model and condition, from the evaluation metrics only; its report section
also carries the accuracy table (`Chart.extra["table"]`)."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.charts.context import Chart, Context
from meaningless_tokens.charts.style import COLORS, colour_key
from meaningless_tokens.config import CONDITIONS
from meaningless_tokens.report.phrases import count_of
from meaningless_tokens.report.trace import Text, artifact, interval

KIND = "accuracy"
PER_MODEL = False


def draw(plt, ctx: Context, name: None = None):
    # the models figures.charts.accuracy names (else figures.models), in its order
    metrics = {n: ctx.metrics[n] for n in ctx.chart_models(KIND) if n in ctx.metrics}
    names = list(metrics)
    lab = ctx.labels(KIND)
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
        parts = [f"{disp[name]}: "]
        for c in conds:
            parts += [f"{c} ", acc[c], " % (", cor[c], "/", n, ")", "; " if c != conds[-1] else "."]
        for c, (d, lo, hi, p) in pairs.items():
            parts += [f" {c} − none: ", d, " points ", interval(lo, hi), ", McNemar p = ", p, "."]
        boxed = {c: src.js(f, f"boxed_rate.{c}", 100, ".0f") for c in conds}
        parts += [" Outputs that wrote a complete \\boxed{} answer: "]
        for c in conds:
            parts += [f"{c} ", boxed[c], " %", "; " if c != conds[-1] else
                      " (the others are graded from math-verify's fallback: the last expression in the text)."]
        rows.append(Text(*parts))
        table.append({"model": disp[name], "n": n, "acc": acc, "correct": cor, "paper": paper, "pairs": pairs,
                      "conds": conds})
        if "mless" in pairs:
            gains.append((name, pairs["mless"]))
        if "arm" in pairs:
            arm_gains.append((name, pairs["arm"]))
    obs = []
    for row in table:
        best = max(row["conds"], key=lambda c: row["acc"][c].value)
        ties = [c for c in row["conds"] if row["acc"][c].value == row["acc"][best].value]
        obs.append(Text(f"{row['model']}: " + (f"{', '.join(ties)} tie at " if len(ties) > 1 else f"{best} is highest at "),
                        row["acc"][best], " %."))
    if gains:
        up = [disp[g[0]] for g in gains if g[1][0].value > 0]
        sure = [disp[g[0]] for g in gains if g[1][1].value > 0]
        obs.append(Text(f"Meaningless tokens raise accuracy for {count_of(up, len(gains))}; the interval excludes "
                        f"zero for {count_of(sure, len(gains))}."))
        interp = [Text("The paper reports higher MATH-500 accuracy with meaningless tokens (mless) than without (none). "),
                  Text(f"This run agrees for {', '.join(sure)}." if sure else
                       "In this run no model's mless − none interval excludes zero, so the run can neither confirm nor "
                       "refute the gain; more problems (evaluate.n_samples) and longer answers (evaluate.max_new_tokens) "
                       "narrow the intervals.")]
    else:
        interp = [Text("The mless condition was not evaluated, so the paper's accuracy claim is not tested here.")]
    glance = obs[-1:] + interp[-1:]  # the report's "at a glance": the mless verdict
    arm_glance = []
    if arm_gains:
        up = [disp[g[0]] for g in arm_gains if g[1][0].value > 0]
        sure = [disp[g[0]] for g in arm_gains if g[1][1].value > 0 or g[1][2].value < 0]
        obs.append(Text(f"ARM (arm: the none prompt, Layer 1's MLP activations redistributed) raises accuracy for "
                        f"{count_of(up, len(arm_gains))}; the interval excludes zero for "
                        f"{count_of(sure, len(arm_gains))}."))
        interp.append(Text(" The paper's ARM (section 'ARM' below) edits the first layer's MLP activations instead of "
                           "inserting tokens and reports a small gain (MATH-500 pass@3 about 0.72 → 0.74 for "
                           "Qwen2.5-Math-1.5B). " + (f"Here arm − none excludes zero for {', '.join(sure)}."
                                                     if sure else "Here no arm − none interval excludes zero.")))
        arm_glance = obs[-1:]
    n0 = table[0]["n"] if table else None
    conds_all = [c for c in CONDITIONS if any(c in row["conds"] for row in table)] or ["none", "mless", "mful"]
    return Chart(
        "accuracy", f"{ctx.benchmark} accuracy by prompt condition",
        [Text(f"{ctx.benchmark} accuracy of each model under each condition, on ", n0, " problems per model, greedy "
              "decoding, graded by math-verify against the gold answer; the same problems under every condition.")
         if n0 is not None else Text(f"{ctx.benchmark} accuracy.")]
        + ([Text(f" Not evaluated in this run (evaluate.models): {', '.join(skipped)}.")] if skipped else []),
        [Text(f"Bars: models; colours: conditions ({colour_key(conds_all)}); y axis: accuracy in percent; the "
              "label on each bar is correct / problems.")],
        rows, obs, interp, extra={"table": table, "glance": glance, "arm_glance": arm_glance})
