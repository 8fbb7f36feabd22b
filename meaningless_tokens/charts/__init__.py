"""The chart kinds, in report order: every module of this package that declares `KIND`, with `draw` (the figure),
`explain` (its part of the report), `SECTION` (the report section it sits in: the report's sections follow the
charts' order) and `ORDER` (its place among the per-model kinds, which come first, or among the others).
`stages/figures.py` and `stages/report.py` only loop over these lists, found here rather than listed: to add a
chart, add its module; to change one, open its module."""

import importlib
import pkgutil


def _kinds() -> tuple:
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    # the per-model kinds first (the report's per-model pages), each group by ORDER
    kinds = sorted((k for k in found if hasattr(k, "KIND")), key=lambda k: (not k.PER_MODEL, k.ORDER))
    for group in (True, False):
        orders = [k.ORDER for k in kinds if k.PER_MODEL == group]
        if len(set(orders)) != len(orders):
            raise RuntimeError(f"two chart kinds share an ORDER: {orders}")
    return tuple(kinds)


KINDS = _kinds()
PER_MODEL = tuple(k for k in KINDS if k.PER_MODEL)  # one chart per model: reports/figures/<model>-<KIND>.*
STUDY = tuple(k for k in KINDS if not k.PER_MODEL)  # across models: <KIND>.*


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
