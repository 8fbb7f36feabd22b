"""Sentences written in the templates: `say` renders a macro of `templates/charts/<kind>.j2` into a `Text`, so the
English lives in Jinja and the numbers keep their trace.

A macro is written as plain text: each `{{ value }}` stays the object it is (a `Num` or `Text` keeps its source; a
string from data is escaped by `Text` for each format, as a literal part is), and a line break in the template's
own text, with the indentation around it, is one space, so a sentence can wrap. Edges and joins are set with
Jinja's whitespace control and `{{ " " }}`. A macro's values are not rendered again: a macro does not call another.
"""

from __future__ import annotations

import re
from functools import cache

from meaningless_tokens import TEMPLATES
from meaningless_tokens.results.phrases import change, count_of, label
from meaningless_tokens.results.trace import Num, Text, excludes_zero

_SLOT = re.compile("\x00([0-9]+)\x00")  # where a value sits in a rendered macro
_BREAK = re.compile(r"[ \t]*\n\s*")
_values: list = []                      # the values of the macro being rendered (a render runs start to end)


@cache
def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, pass_eval_context

    @pass_eval_context  # also keeps Jinja from folding a constant `{{ " " }}` into the template when it compiles it
    def keep(_, value) -> str:
        _values.append(value)
        return f"\x00{len(_values) - 1}\x00"

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=False, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, finalize=keep)
    env.globals.update(label=label, count_of=count_of)
    return env


def say(template: str, macro: str, **values) -> Text:
    """Macro `macro` of template `template` (relative to templates/) with `values`, as a `Text`."""
    _values.clear()
    try:
        rendered = str(getattr(_environment().get_template(template).module, macro)(**values))
        kept = list(_values)
    finally:
        _values.clear()
    pieces = _SLOT.split(rendered)  # text, value index, text, ...
    parts = []
    for k, piece in enumerate(pieces):
        if k % 2:
            value = kept[int(piece)]
            parts.append(value if isinstance(value, Num | Text) else str(value))
        elif piece:
            parts.append(_BREAK.sub(" ", piece))
    return Text(*parts)


def plain(template: str, macro: str, **values) -> str:
    """Macro `macro` of template `template` as a plain string: for sentences that are stored (metrics/verdict.json)
    and escaped by the format that shows them, so values are joined as they are."""
    return "".join(p if isinstance(p, str) else str(p) for p in say(template, macro, **values).parts)


def shared(macro: str, **values) -> Text:
    """A sentence several charts say, from templates/charts/phrases.j2 (hypothesis, axes_original, axes_weight,
    axes_layers, verdict_drop)."""
    return say("charts/phrases.j2", macro, **values)


def verdict_drop(pct: Num, lo: Num, hi: Num, where: str) -> Text:
    """The paper's prediction for attention on original tokens, checked against one drop interval."""
    return shared("verdict_drop", where=where, change=change(pct), low=lo, high=hi, excludes=excludes_zero(lo, hi),
                  agree=pct.value > 0)
