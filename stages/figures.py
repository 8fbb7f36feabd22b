"""figures: every chart of the study, from the statistics and evaluation metrics, as PNG and SVG.

Per model (layers 1-based on charts, heads 0-based as in the files):
  <model>-layer-sweep   one head, `figures.sweep_layers` side by side, none vs mless over original positions
  <model>-heads         per head: none vs mless over original positions (top); mless over the full
                        prompt with the span shaded (bottom)
  <model>-conditions    one head: none / mless / mful over original positions, mless vs mful over the full prompt
Across models:
  cross-model           one panel per model: "Meaningless tokens" vs "Random sentence" over the full prompt
  accuracy              MATH-500 accuracy per model and condition (drawn only from evaluation metrics)
and the accuracy table `reports/accuracy.csv` (model, condition, label, accuracy, correct, n: one row per
model and condition) that `dvc plots` draws.

Heads: `figures.heads: auto` picks, per model, the heads of `figures.layer` with the largest drop of
attention on original tokens under mless (stats head_rank); or name them per model.
Files are byte-identical for equal data: no timestamps, fixed SVG ids.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np

from stages import cli
from stages.config import ConfigError, Params
from stages.stats import stats_path
from stages.store import ArtifactError, atomic_path, read_h5

COLORS = {"none": "#1f77b4", "mless": "#d62728", "mful": "#2ca02c"}
LABELS = {"none": "No insertion (none)", "mless": "Meaningless tokens (mless)", "mful": "Random sentence (mful)"}
OUT_DIR = Path("reports/figures")
ACCURACY_TABLE = Path("reports/accuracy.csv")


def _setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "meaningless-tokens", "font.size": 10, "axes.titlesize": 11,
                         "legend.fontsize": 9, "figure.dpi": 100, "path.simplify": False})
    return plt


def save(fig, folder: Path, stem: str, dpi: int) -> list[Path]:
    """PNG and SVG with no timestamps or software tags (byte-identical for equal data)."""
    written = []
    for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
        path = folder / f"{stem}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=dpi, metadata=meta, bbox_inches="tight")
        written.append(path)
    return written


def load_stats(path: Path) -> dict:
    need = ("none/original_avg", "none/full_avg", "mless/head_rank")
    with read_h5(path, "stats", need) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        data = {"layers": [int(x) for x in f.attrs["layers"]],
                "heads": [int(x) for x in f.attrs["heads"]], "conditions": conds, "span": {}}
        for c in conds:
            data[c] = {k: f[c][k][()] for k in f[c]}
            data["span"][c] = tuple(int(x) for x in f[c].attrs["span"])
    return data


def choose_heads(params: Params, name: str, st: dict) -> list[int]:
    cfg = params.figures
    li = _layer_index(params, name, st, cfg.layer, "figures.layer")
    if cfg.heads == "auto":
        return [st["heads"][k] for k in st["mless"]["head_rank"][li][: cfg.n_heads]]
    chosen = cfg.heads.get(name)
    if chosen is None:
        raise ConfigError(f"{params.file}: figures.heads.{name}: no heads named for this model (or use 'auto')")
    bad = [h for h in chosen if h not in st["heads"]]
    if bad:
        raise ConfigError(f"{params.file}: figures.heads.{name}: {bad} not among the extracted heads {st['heads']}")
    return chosen


def _layer_index(params: Params, name: str, st: dict, layer: int, key: str) -> int:
    if layer not in st["layers"]:
        raise ConfigError(f"{params.file}: {key}: layer {layer} was not extracted for {name} "
                          f"(extracted: {st['layers']}; see models.{name}.layers)")
    return st["layers"].index(layer)


def _curve(ax, st, cond, kind, li, hi, limit, **kw):
    y = st[cond][f"{kind}_avg"][li, hi][:limit]
    ax.plot(np.arange(len(y)), y, color=COLORS[cond], label=kw.pop("label", LABELS[cond]), lw=1.4, **kw)
    return y


def _shade_span(ax, st, cond, limit, label="Meaningless tokens"):
    start, end = st["span"][cond]
    if 0 <= start < end:
        ax.axvspan(start - 0.5, min(end, limit) - 0.5, color=COLORS[cond], alpha=0.12, label=label)


def _axes(ax, xlabel, limit):
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Average attention weight")
    ax.set_xlim(-0.5, limit - 0.5)
    ax.grid(alpha=0.3, lw=0.5)


def draw_model(plt, params: Params, name: str, st: dict) -> list[tuple[str, object]]:
    cfg = params.figures
    disp, heads = st["display_name"], choose_heads(params, name, st)
    li = _layer_index(params, name, st, cfg.layer, "figures.layer")
    P, F = cfg.original_positions, cfg.full_positions
    drawn = []
    h0 = st["heads"].index(heads[0])

    sweep = [_layer_index(params, name, st, layer, "figures.sweep_layers") for layer in cfg.sweep_layers]
    fig, axes = plt.subplots(1, len(sweep), figsize=(4.2 * len(sweep), 3.4), squeeze=False)
    for ax, lj in zip(axes[0], sweep):
        for c in ("none", "mless"):
            _curve(ax, st, c, "original", lj, h0, P)
        ax.set_title(f"{disp} Layer {st['layers'][lj] + 1} Head {heads[0]}")
        _axes(ax, "Original token position", P)
    axes[0][0].legend(loc="upper right")
    fig.tight_layout()
    drawn.append((f"{name}-layer-sweep", fig))

    fig, axes = plt.subplots(2, len(heads), figsize=(4.2 * len(heads), 6.4), squeeze=False)
    for k, h in enumerate(heads):
        hi = st["heads"].index(h)
        for c in ("none", "mless"):
            _curve(axes[0][k], st, c, "original", li, hi, P)
        axes[0][k].set_title(f"{disp} Layer {cfg.layer + 1} Head {h}")
        _axes(axes[0][k], "Original token position", P)
        _curve(axes[1][k], st, "mless", "full", li, hi, F)
        _shade_span(axes[1][k], st, "mless", F)
        axes[1][k].set_title(f"Layer {cfg.layer + 1} Head {h}: full mless prompt")
        _axes(axes[1][k], "Token position (mless prompt)", F)
    axes[0][0].legend(loc="upper right")
    axes[1][0].legend(loc="upper right")
    fig.tight_layout()
    drawn.append((f"{name}-heads", fig))

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    for c in st["conditions"]:
        _curve(axes[0], st, c, "original", li, h0, P)
    axes[0].set_title(f"{disp} Layer {cfg.layer + 1} Head {heads[0]}")
    _axes(axes[0], "Original token position", P)
    for c in ("mless", "mful"):
        if c in st["conditions"]:
            _curve(axes[1], st, c, "full", li, h0, F)
    _shade_span(axes[1], st, "mless", F, label="Inserted span")
    axes[1].set_title(f"{disp} Layer {cfg.layer + 1} Head {heads[0]}: full prompt")
    _axes(axes[1], "Token position", F)
    axes[0].legend(loc="upper right")
    axes[1].legend(loc="upper right")
    fig.tight_layout()
    drawn.append((f"{name}-conditions", fig))
    return drawn


def draw_cross_model(plt, params: Params, stats: dict) -> list[tuple[str, object]]:
    cfg = params.figures
    fig, axes = plt.subplots(1, len(stats), figsize=(4.2 * len(stats), 3.4), squeeze=False)
    for ax, (name, st) in zip(axes[0], stats.items()):
        h = choose_heads(params, name, st)[0]
        li, hi = _layer_index(params, name, st, cfg.layer, "figures.layer"), st["heads"].index(h)
        _curve(ax, st, "mless", "full", li, hi, cfg.full_positions, label="Meaningless tokens")
        if "mful" in st["conditions"]:
            _curve(ax, st, "mful", "full", li, hi, cfg.full_positions, label="Random sentence")
        _shade_span(ax, st, "mless", cfg.full_positions, label="Inserted span")
        ax.set_title(f"{st['display_name']} Layer {cfg.layer + 1} Head {h}")
        _axes(ax, "Token position", cfg.full_positions)
        ax.legend(loc="upper right")
    fig.tight_layout()
    return [("cross-model", fig)]


def draw_accuracy(plt, params: Params, metrics: dict) -> list[tuple[str, object]]:
    names = list(metrics)
    conds = [c for c in ("none", "mless", "mful") if all(c in m["accuracy"] for m in metrics.values())]
    width = 0.8 / len(conds)
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(names), 3.6))
    for k, c in enumerate(conds):
        x = np.arange(len(names)) + (k - (len(conds) - 1) / 2) * width
        acc = [100 * metrics[n]["accuracy"][c] for n in names]
        bars = ax.bar(x, acc, width, color=COLORS[c], label=LABELS[c])
        for b, n in zip(bars, names):
            ax.annotate(f"{metrics[n]['correct'][c]}/{metrics[n]['n_problems']}", (b.get_x() + b.get_width() / 2,
                        b.get_height()), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(np.arange(len(names)), [metrics[n]["display_name"] for n in names], rotation=10)
    ax.set_ylabel("MATH-500 accuracy (%, math-verify)")
    ax.set_title("Accuracy by prompt condition")
    ax.set_ylim(0, max(5.0, 1.25 * max(100 * v for m in metrics.values() for v in m["accuracy"].values())))
    ax.legend(loc="upper left")
    ax.grid(axis="y", alpha=0.3, lw=0.5)
    fig.tight_layout()
    return [("accuracy", fig)]


def write_accuracy_table(path: Path, metrics: dict) -> Path:
    """One row per model and condition (math-verify accuracy as a fraction, as in metrics/accuracy)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "condition", "label", "accuracy", "correct", "n"])
    for name, m in metrics.items():
        for c in ("none", "mless", "mful"):
            if c in m["accuracy"]:
                w.writerow([name, c, f"{name} / {c}", f"{m['accuracy'][c]:.6g}", m["correct"][c], m["n_problems"]])
    with atomic_path(path) as tmp:
        tmp.write_text(buf.getvalue())
    return path


def selected_models(params: Params) -> list[str]:
    chosen = list(params.models) if params.figures.models == "all" else params.figures.models
    unknown = [m for m in chosen if m not in params.models]
    if unknown:
        raise ConfigError(f"{params.file}: figures.models: {unknown} not configured; models: {sorted(params.models)}")
    return chosen


def load_inputs(params: Params) -> tuple[dict, dict]:
    """{model: statistics} and {model: evaluation metrics} of the charted models."""
    names = selected_models(params)
    # display names come from params (not the stats file): a new label reruns only figures and report
    stats = {n: load_stats(params.resolve(str(stats_path(n)))) | {"display_name": params.models[n].display_name}
             for n in names}
    metrics = {}
    for n in names:
        path = params.resolve(f"metrics/accuracy/{n}.json")
        if not path.is_file():
            raise ArtifactError(f"{path}: missing evaluation metrics (run: dvc repro evaluate@{n})")
        try:
            metrics[n] = json.loads(path.read_text()) | {"display_name": stats[n]["display_name"]}
        except json.JSONDecodeError as e:
            raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    return stats, metrics


def run(params: Params, folder: Path | None = None, table: Path | None = None) -> list[Path]:
    """Draw every chart into `folder` (returned: the chart files) and write the accuracy table."""
    plt = _setup()
    folder = folder or params.resolve(str(OUT_DIR))
    stats, metrics = load_inputs(params)
    write_accuracy_table(table or params.resolve(str(ACCURACY_TABLE)), metrics)
    names = list(stats)
    drawn = [d for n in names for d in draw_model(plt, params, n, stats[n])]
    drawn += draw_cross_model(plt, params, stats) + draw_accuracy(plt, params, metrics)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, fig in drawn:
        written += save(fig, folder, stem, params.figures.dpi)
        plt.close(fig)
    for stale in set(folder.glob("*.*")) - set(written):  # charts of models no longer configured
        stale.unlink()
    print(f"figures: {len(written)} files -> {folder}")
    return written


def main(argv: list[str] | None = None) -> int:
    return cli.main("figures", __doc__, run, argv, per_model=False)


if __name__ == "__main__":
    sys.exit(main())
