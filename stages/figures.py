"""figures: every chart of the study, from the statistics, activations and evaluation metrics, as PNG and SVG.

Each chart kind is one module of `meaningless_tokens/charts/` (draw + explain); this stage only loops over them.

Per model (layers and heads numbered from 1 on charts, as in the paper; 0-based in files and params):
  <model>-layer-sweep   one head, `figures.sweep_layers` side by side, none vs mless over original positions
  <model>-heads         per head: none vs mless over original positions (top); mless over the full
                        prompt with the span shaded (bottom)
  <model>-conditions    one head: none / mless / mful over original positions, mless vs mful over the full prompt
Across models:
  cross-model           one panel per model: "Meaningless tokens" vs "Random sentence" over the full prompt
  activations           one panel per model: histogram of layer-0 MLP activations per condition, four insets
  activation-shift      each activation measure's paired change under mless / mful, and lambda, per model
  span-sweep            Layer 1 drop and span mass against the number of span characters (stages/sweep.py)
  span-accuracy         accuracy against the number of span characters (only when the accuracy sweep ran)
  likelihood            teacher-forced likelihood of the reference solution and the gold answer: paired
                        differences, by level, and per problem against the Layer 1 attention shift
  accuracy              MATH-500 accuracy per model and condition (drawn only from evaluation metrics)
and the accuracy table `reports/accuracy.csv` (model, condition, label, accuracy, correct, n: one row per
model and condition) that `dvc plots` draws, and `reports/likelihood.json`: the likelihood's per-problem links
to the attention and activation shifts and to the accuracy flips (meaningless_tokens/charts/likelihood.py), which the report
quotes.

Which models, layers and heads: `figures.charts.<kind>` per chart kind (layer-sweep, heads, conditions,
cross-model, accuracy), its missing keys from `figures.models`, `figures.layer` / `figures.sweep_layers` and
`figures.heads`. Heads `auto`: per model, the `figures.n_heads` heads of the chart's (first) layer with the
largest drop of attention on original tokens under mless (stats head_rank); or name them per model.
`figures.labels: paper` uses the seed charts' titles, legends, axis title and x range (0..N).
Files are byte-identical for equal data: no timestamps, fixed SVG ids.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from meaningless_tokens import charts, cli, store
from meaningless_tokens.charts import likelihood
from meaningless_tokens.results.context import Context, load_context
from meaningless_tokens.config import CONDITIONS, Params
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.store import atomic_path, write_csv_atomic, write_json_atomic

# the stage's outputs: role -> artifact kind (store.PATHS)
OUTPUTS = {"folder": "figures", "table": "accuracy_table", "links": "likelihood_links"}


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


def write_accuracy_table(path: Path, metrics: dict) -> Path:
    """One row per model and condition (math-verify accuracy as a fraction, as in metrics/accuracy)."""
    write_csv_atomic(path, ["model", "condition", "label", "accuracy", "correct", "n"],
                     [[name, c, f"{name} / {c}", f"{m['accuracy'][c]:.6g}", m["correct"][c], m["n_problems"]]
                      for name, m in metrics.items() for c in CONDITIONS if c in m["accuracy"]])
    return path


def draw_all(plt, ctx: Context):
    """(stem, figure) of every chart kind, drawn one at a time as the caller asks: per model in model order, then the
    charts across models (the caller closes each figure before the next is drawn, so memory stays flat with the
    number of models)."""
    for n in ctx.names:
        for k in charts.PER_MODEL:
            if n in ctx.chart_models(k.KIND):
                yield charts.stem(k, n), k.draw(plt, ctx, n)
    for k in charts.STUDY:
        if charts.unavailable(k, ctx) is None:
            yield charts.stem(k, None), k.draw(plt, ctx, None)


@names_the_file
def run(params: Params, root: Path | None = None) -> list[Path]:
    """Draw every chart of the project's data (returned: the chart files) and write the accuracy table and the
    likelihood's links, under `root` (default: the project)."""
    params = store.params_view(params, "figures")  # the keys dvc.yaml lists for it, no other
    plt = _setup()
    where = store.outputs(params, None, root, **OUTPUTS)
    folder = where["folder"]
    ctx = load_context(params)
    write_accuracy_table(where["table"], ctx.metrics)
    folder.mkdir(parents=True, exist_ok=True)
    # every chart into a folder beside the output first: a chart that fails to draw leaves the old set whole
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        drawn = []
        for stem, fig in draw_all(plt, ctx):
            try:
                drawn += save(fig, staging, stem, params.figures.dpi)
            finally:
                plt.close(fig)
        write_json_atomic(where["links"], likelihood.problem_links(ctx))  # the numbers the report quotes
        written = []
        for path in drawn:
            written.append(folder / path.name)
            os.replace(path, written[-1])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for stale in set(folder.glob("*.*")) - set(written):  # charts of models no longer configured
        stale.unlink()
    print(f"figures: {len(written)} files -> {folder}")
    return written


def main(argv: list[str] | None = None) -> int:
    return cli.main("figures", __doc__, run, argv, per_model=False)


if __name__ == "__main__":
    sys.exit(main())
