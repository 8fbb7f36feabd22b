"""The chart kinds, in report order: one module each, with `draw` (the figure) and `explain` (its report
section). `stages/figures.py` and `stages/report.py` only loop over these lists; to change a chart,
open its module."""

from stages.charts import accuracy, activation_shift, activations, conditions, cross_model, heads, layer_sweep

PER_MODEL = (layer_sweep, heads, conditions)   # one chart per model: reports/figures/<model>-<KIND>.*
STUDY = (cross_model, activations, activation_shift, accuracy)  # one chart across the models: <KIND>.*
KINDS = PER_MODEL + STUDY


def stem(kind, name: str | None) -> str:
    return f"{name}-{kind.KIND}" if kind.PER_MODEL else kind.KIND
