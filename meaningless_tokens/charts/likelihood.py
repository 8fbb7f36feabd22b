"""likelihood: the teacher-forced outcome (stages/likelihood.py). A forest plot of the paired differences of each
model and contrast (solution: mean log-prob per token; answer: the answer's log-prob) with bootstrap 95 %
intervals, the solution's difference by MATH level, and each problem's gain against its Layer 1 attention shift
with the rank correlation.

The per-problem links (to the attention shift of `artifacts/stats/`, the activation shift of
`artifacts/activations/` and the accuracy flips of `artifacts/eval/`) are computed by the figures stage and
written to `reports/likelihood.json` (LINK), which the report quotes: every number traces to a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meaningless_tokens import store
from meaningless_tokens.results.context import Chart, Context
from meaningless_tokens.charts.style import COLORS
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.prose import say
from meaningless_tokens.results.trace import artifact, excludes_zero
from meaningless_tokens.store import read_h5

KIND = "likelihood"
PER_MODEL = False
SECTION = "Likelihood"  # the report section it sits in (its anchor: charts.anchor)
ORDER = 90  # its place in the report (charts.KINDS: by ORDER)
LINK = store.path("likelihood_links")
CONTRASTS = ("mless-none", "mful-none", "arm-none")
# per-problem shift measures the gain is correlated with: (source, description)
SHIFTS = {
    "attention_drop": ("stats", "drop of the attention original tokens receive (orig_mean none − condition), mean over "
                                "heads"),
    "span_mass": ("stats", "attention mass original queries give to the span, mean over heads"),
    "near_zero_shift": ("activations", "change of the share of near-zero MLP activations (near_zero_robust, "
                                       "condition − none; negative: the distribution spreads)"),
    "l1_shift": ("activations", "change of the mean |a| of the MLP activations (condition − none)"),
}
UNITS = {"solution": "nats/token", "answer": "nats"}
TEXT = "charts/likelihood.j2"  # the explanation's sentences (report/prose.py renders them)


def path(name: str) -> str:
    return artifact("likelihood", name)


# ---- the per-problem links --------------------------------------------------------------------------------

def spearman_ci(x: np.ndarray, y: np.ndarray, seed: int, n_boot: int) -> tuple[float, float, float]:
    """Spearman's rank correlation and its percentile bootstrap 95 % interval (problems resampled in pairs)."""
    from scipy.stats import rankdata

    def rho(a, b):  # Pearson on (average) ranks, row-wise
        ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
        ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
        den = np.sqrt((ra ** 2).sum(-1) * (rb ** 2).sum(-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1), np.nan)

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    boots = rho(x[idx], y[idx])
    lo, hi = np.nanquantile(boots, [0.025, 0.975]) if np.isfinite(boots).any() else (np.nan, np.nan)
    return float(rho(x[None], y[None])[0]), float(lo), float(hi)


def shifts(root: Path, name: str) -> dict[str, dict[str, dict[int, float]]]:
    """{contrast: {shift measure: {problem index: value}}} from the statistics (Layer 1 = layer index 0, or the
    first analysed layer) and the activations (their first measured layer) files."""
    out: dict = {}
    with read_h5(root / store.path("stats", name), "stats", ("problem_index", "none/orig_mean")) as f:
        index = [int(i) for i in f["problem_index"][()]]
        layers = [int(x) for x in f.attrs["layers"]]
        li = layers.index(0) if 0 in layers else 0
        base = f["none/orig_mean"][()][:, li, :].mean(-1)
        for c in [str(c) for c in f.attrs["conditions"] if c != "none"]:
            drop = base - f[f"{c}/orig_mean"][()][:, li, :].mean(-1)
            mass = f[f"{c}/span_mass_per_sample"][()][:, li, :].mean(-1)
            out.setdefault(f"{c}-none", {})["attention_drop"] = dict(zip(index, drop))
            out[f"{c}-none"]["span_mass"] = dict(zip(index, mass))
    with read_h5(root / store.path("activations", name), "activations", ("problems/index",)) as f:
        index = [int(i) for i in f["problems/index"][()]]
        for c in [str(c) for c in f.attrs["conditions"] if c != "none"]:
            for key, m in (("near_zero_shift", "near_zero_robust"), ("l1_shift", "l1")):
                d = f[f"{c}/original/{m}"][()][:, 0] - f[f"none/original/{m}"][()][:, 0]
                out.setdefault(f"{c}-none", {})[key] = dict(zip(index, d))
    return out


def flips(root: Path, name: str) -> tuple[dict[int, dict[str, bool]], list[str]]:
    """{problem index: {condition: correct}} from the evaluation file; empty where there is none (no generated
    accuracy to compare with)."""
    if not (root / store.path("eval", name)).is_file():
        return {}, []
    with read_h5(root / store.path("eval", name), "eval", ("problems/index",)) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        correct = {c: f[f"{c}/correct"][()] for c in conds}
        return {int(i): {c: bool(correct[c][k]) for c in conds} for k, i in enumerate(f["problems/index"][()])}, conds


def problem_links(ctx: Context) -> dict:
    """The per-problem links of every model (written to LINK by the figures stage), computed once per context."""
    if ctx._likelihood_link is None:
        ctx._likelihood_link = link(ctx)
    return ctx._likelihood_link


def link(ctx: Context) -> dict:
    """The per-problem links of every model, from the artifacts."""
    out = {"definitions": {k: d for k, (_, d) in SHIFTS.items()}, "models": {}}
    for n in ctx.likelihood:
        lk = ctx.likelihood[n]
        seed, n_boot = lk["params"]["seed"], lk["params"]["n_boot"]
        index = [int(i) for i in lk["index"]]
        sh = shifts(ctx.root, n)
        correct, _ = flips(ctx.root, n)
        m = {"n_likelihood": lk["n"], "contrasts": {}, "accuracy": {}}
        for contrast, res in lk["contrasts"].items():
            for k in ("solution", "answer"):
                gain = dict(zip(index, res[k]["diff"]))
                for key, values in sh.get(contrast, {}).items():
                    common = [i for i in index if i in values]
                    entry = {"n": len(common), "rho": None, "ci95_low": None, "ci95_high": None}
                    if len(common) >= 3:
                        r, lo, hi = spearman_ci(np.array([gain[i] for i in common]),
                                                np.array([values[i] for i in common]), seed, n_boot)
                        if np.isfinite([r, lo, hi]).all():  # a constant series has no rank correlation
                            entry = {"n": len(common), "rho": round(r, 6), "ci95_low": round(lo, 6),
                                     "ci95_high": round(hi, 6)}
                    m["contrasts"].setdefault(contrast, {}).setdefault(k, {})[key] = entry
            c = contrast.split("-")[0]
            common = [i for i in index if i in correct and c in correct[i]]
            if not common:  # no generated accuracy for these problems and this condition
                continue
            gain = dict(zip(index, res["solution"]["diff"]))
            groups = {"to_right": [i for i in common if correct[i][c] and not correct[i]["none"]],
                      "to_wrong": [i for i in common if not correct[i][c] and correct[i]["none"]],
                      "unchanged": [i for i in common if correct[i][c] == correct[i]["none"]]}
            m["accuracy"][contrast] = {"n": len(common), **{
                g: {"n": len(ids), "mean_gain": round(float(np.mean([gain[i] for i in ids])), 6) if ids else None}
                for g, ids in groups.items()}}
        out["models"][n] = m
    return out


# ---- the chart ---------------------------------------------------------------------------------------------

def draw(plt, ctx: Context, name: None = None):
    names = list(ctx.likelihood)  # likelihood.models
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    for ax, k in zip(axes[0], ("solution", "answer")):
        y, ticks = 0, []
        for n in names:
            for contrast, res in ctx.likelihood[n]["contrasts"].items():
                c = contrast.split("-")[0]
                mean, ci = res[k]["mean"][0], res[k]["ci"][0]
                ax.errorbar(mean, y, xerr=[[mean - ci[0]], [ci[1] - mean]], fmt="o", color=COLORS[c], capsize=3)
                ticks.append((y, f"{ctx.disp(n)}: {c} − none"))
                y -= 1
            y -= 0.5
        ax.set_yticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=8)
        ax.axvline(0, color="#444", lw=0.8)
        ax.set_xlabel(f"paired difference to none, {UNITS[k]}")
        ax.set_title("Reference solution: mean log-prob per token" if k == "solution" else
                     "Gold answer after the frame: log-prob", fontsize=10)
        ax.grid(axis="x", alpha=0.3, lw=0.5)
    ax = axes[1, 0]
    width = 0.8 / max(1, len(names))
    for j, n in enumerate(names):
        res = ctx.likelihood[n]["contrasts"].get("mless-none")
        if res is None:
            continue
        s = res["solution"]
        x = np.array(s["levels"], dtype=float) + (j - (len(names) - 1) / 2) * width
        ax.errorbar(x, s["level_mean"], yerr=np.abs(s["level_ci"].T - s["level_mean"]), fmt="o", capsize=2,
                    label=ctx.disp(n), color=f"C{j}")
    ax.axhline(0, color="#444", lw=0.8)
    ax.set_xlabel("MATH level")
    ax.set_ylabel("mless − none, nats/token (solution)")
    ax.set_title("Solution gain under mless by level (bootstrap 95 % intervals)", fontsize=10)
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    links = problem_links(ctx)["models"]
    for j, n in enumerate(names):
        lk = ctx.likelihood[n]
        res = lk["contrasts"].get("mless-none")
        sh = shifts(ctx.root, n).get("mless-none", {}).get("attention_drop", {})
        if res is None or not sh:
            continue
        index = [int(i) for i in lk["index"]]
        pts = [(sh[i], g) for i, g in zip(index, res["solution"]["diff"]) if i in sh]
        if not pts:
            continue
        e = links[n]["contrasts"]["mless-none"]["solution"]["attention_drop"]
        tag = f"{ctx.disp(n)} (n {e['n']}" + (f", ρ {e['rho']:+.2f})" if e["rho"] is not None else ")")
        ax.scatter(*zip(*pts), s=14, color=f"C{j}", label=tag, alpha=0.8)
    ax.axhline(0, color="#444", lw=0.8)
    ax.set_xlabel(f"{label(0)} drop of attention on original tokens under mless (per problem)")
    ax.set_ylabel("mless − none, nats/token (solution)")
    ax.set_title("Per problem: likelihood gain against the attention shift", fontsize=10)
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8)
    fig.suptitle("Likelihood of the reference solution and the gold answer (teacher forcing): a proxy outcome",
                 fontsize=11)
    fig.tight_layout()
    return fig


def explain(ctx: Context, name: None = None) -> Chart:
    src, link_src = ctx.src, LINK.as_posix()
    rows, verdicts, link_rows, proxy_rows = [], [], [], []
    for n in ctx.likelihood:
        f, lk = path(n), ctx.likelihood[n]
        contrasts = []
        for contrast in lk["contrasts"]:
            g = f"contrasts/{contrast}"
            sol = {"mean": src.h5(f, f"{g}/solution/mean", fmt="+.4f", group=0),
                   "low": src.h5(f, f"{g}/solution/ci", fmt="+.4f", group=0, bound="low"),
                   "high": src.h5(f, f"{g}/solution/ci", fmt="+.4f", group=0, bound="high"),
                   "p": src.h5(f, f"{g}/solution/p", fmt=".2g", group=0),
                   "improved": src.h5(f, f"{g}/solution/improved", fmt=".0f", scale=100, group=0)}
            ans = {"mean": src.h5(f, f"{g}/answer/mean", fmt="+.3f", group=0),
                   "low": src.h5(f, f"{g}/answer/ci", fmt="+.3f", group=0, bound="low"),
                   "high": src.h5(f, f"{g}/answer/ci", fmt="+.3f", group=0, bound="high"),
                   "p": src.h5(f, f"{g}/answer/p", fmt=".2g", group=0)}
            contrasts.append({"name": contrast, "solution": sol, "answer": ans})
            verdicts.append((n, contrast, sol["mean"], sol["low"], sol["high"]))
        rows.append(say(TEXT, "scores", disp=ctx.disp(n), n=src.h5(f, "@n_samples", fmt="d"),
                        tokens=src.h5(f, "none/solution/tokens", "mean", fmt=".0f"), contrasts=contrasts))
        res = lk["contrasts"].get("mless-none")
        if res is not None:
            g = "contrasts/mless-none/solution"
            rows.append(say(TEXT, "levels", disp=ctx.disp(n), rows=[
                {"level": int(lv), "mean": src.h5(f, f"{g}/level_mean", fmt="+.4f", level=j),
                 "n": src.h5(f, f"{g}/level_n", fmt="d", level=j)} for j, lv in enumerate(res["solution"]["levels"])]))
        for contrast, per in problem_links(ctx)["models"][n]["contrasts"].items():
            shown = []
            for k in [k for k in SHIFTS if k in per["solution"] and per["solution"][k]["rho"] is not None]:
                key = f"models.{n}.contrasts.{contrast}.solution.{k}"
                shown.append({"shift": k.replace("_", " "), "rho": src.js(link_src, f"{key}.rho", fmt="+.2f"),
                              "low": src.js(link_src, f"{key}.ci95_low", fmt="+.2f"),
                              "high": src.js(link_src, f"{key}.ci95_high", fmt="+.2f"),
                              "n": src.js(link_src, f"{key}.n", fmt="d")})
                link_rows.append((n, contrast, k, shown[-1]["rho"], shown[-1]["low"], shown[-1]["high"]))
            if shown:
                rows.append(say(TEXT, "links", disp=ctx.disp(n), contrast=contrast, rows=shown))
        for contrast, acc in problem_links(ctx)["models"][n]["accuracy"].items():
            key = f"models.{n}.accuracy.{contrast}"
            groups = [{"n": src.js(link_src, f"{key}.{g}.n", fmt="d"), "words": words,
                       "gain": None if acc[g]["mean_gain"] is None else
                       src.js(link_src, f"{key}.{g}.mean_gain", fmt="+.4f")}
                      for g, words in (("to_right", "flipped to right"), ("to_wrong", "flipped to wrong"),
                                       ("unchanged", "unchanged"))]
            rows.append(say(TEXT, "flips", disp=ctx.disp(n), contrast=contrast,
                            n=src.js(link_src, f"{key}.n", fmt="d"), groups=groups))
            proxy_rows.append((n, contrast, acc))
    obs = []
    mless = [(n, d, lo, hi) for n, c, d, lo, hi in verdicts if c == "mless-none"]
    if mless:
        up = [ctx.disp(n) for n, d, lo, hi in mless if excludes_zero(lo, hi) and d.value > 0]
        down = [ctx.disp(n) for n, d, lo, hi in mless if excludes_zero(lo, hi) and d.value < 0]
        obs.append(say(TEXT, "direction", up=up, down=down, total=len(mless)))
    sure = [(n, c, k) for n, c, k, r, lo, hi in link_rows if excludes_zero(lo, hi) and k == "attention_drop"]
    tried = [(n, c) for n, c, k, r, lo, hi in link_rows if k == "attention_drop"]
    obs.append(say(TEXT, "correlation", sure=[f"{ctx.disp(n)}, {c}" for n, c, _ in sure], tried=len(tried)))
    agree = [(n, c) for n, c, a in proxy_rows if a["to_right"]["mean_gain"] is not None
             and a["to_wrong"]["mean_gain"] is not None and a["to_right"]["mean_gain"] > a["to_wrong"]["mean_gain"]]
    both = [(n, c) for n, c, a in proxy_rows if a["to_right"]["n"] and a["to_wrong"]["n"]]
    if both:
        obs.append(say(TEXT, "flipped_both_ways", agree=[f"{ctx.disp(n)}, {c}" for n, c in agree], both=len(both)))
    elif proxy_rows:
        obs.append(say(TEXT, "no_flips", pairs=len(proxy_rows)))
    n0 = ctx.likelihood[next(iter(ctx.likelihood))]
    return Chart(
        KIND, "Likelihood of the reference solution and the gold answer",
        [say(TEXT, "overview", n=n0["n"]), say(TEXT, "proxy")],
        [say(TEXT, m) for m in ("axes_contrasts", "axes_levels", "axes_problems", "axes_numbering")],
        rows, obs, [say(TEXT, "interpretation")])
