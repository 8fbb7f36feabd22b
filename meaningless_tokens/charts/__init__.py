"""The chart kinds, in report order: one module each, with `draw` (the figure), `explain` (its part of the report)
and `SECTION` (the report section it sits in: the report's sections follow the charts' order). `stages/figures.py`
and `stages/report.py` only loop over these lists; to change a chart, open its module."""

from meaningless_tokens.charts import (accuracy, activation_shift, activations, conditions, cross_model, heads, layer_sweep,
                           likelihood, pass_at_k, span_accuracy, span_sweep)

PER_MODEL = (layer_sweep, heads, conditions)   # one chart per model: reports/figures/<model>-<KIND>.*
STUDY = (cross_model, span_sweep, span_accuracy, activations, activation_shift, likelihood, accuracy, pass_at_k)  # across models: <KIND>.*
KINDS = PER_MODEL + STUDY


def stem(kind, name: str | None) -> str:
    return f"{name}-{kind.KIND}" if kind.PER_MODEL else kind.KIND


def unavailable(kind, ctx) -> str | None:
    """Why a chart kind has nothing to draw in this run (e.g. an optional measurement is off), or None.
    Such a chart is not drawn; its report section says why and how to get it."""
    check = getattr(kind, "unavailable", None)
    return check(ctx) if check else None


def anchor(title: str) -> str:
    """A report section's anchor: its title in lower case, the words joined by hyphens."""
    return title.lower().replace(" ", "-")


def section(kind) -> str:
    """The anchor of the report section chart `kind` sits in."""
    return anchor(kind.SECTION)
