"""A page (Markdown or HTML) drawn by other code than the revision's, from inputs that reproduced, compared by
what it prints: the text line by line with what names the code and what records the run set aside, each printed
number within one unit of its last digit, each number report.html tags with its file and key within its kind's
tolerance (meaningless_tokens/verify/compare.py compares the files themselves; driver.py decides when a page is
compared so)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np

from meaningless_tokens.errors import Beyond, Differs
from meaningless_tokens.verify.compare import (Largest, code_names_aside, compare_arrays, compare_printed,
                                               first_difference, is_run_key)
from meaningless_tokens.verify.kinds import PRINTED, is_run_record, kind_of

RUN = "<run>"
# A number of report.html (results/trace.Num): its file, key, reduction, scale and value, then its printed text
NUM_SPAN = re.compile(r'<span class="num" title="[^"]*" data-src="(?P<src>[^"]*)" data-key="(?P<key>[^"]*)" '
                      r'data-op="(?P<op>[^"]*)" data-scale="(?P<scale>[^"]*)" data-fmt="[^"]*" '
                      r'data-value="(?P<value>[^"]*)">(?P<text>[^<]*)</span>')
# What records the run on a page (as RUN_RECORDS and RUN_KEYS do among outputs): a duration said in words (the
# power section's "about 57 minutes", report/content.duration_unit), the machine line, a table's run-time column
DURATION = re.compile(r"\babout (?:<run>|\d+(?:\.\d+)?) (?:minutes|hours)\b")
MACHINE = re.compile(r"\bran on: [^\n<]*")
# A figure report.html embeds: a copy of a file of reports/figures, an output the page's stage reads, so already
# compared as that output (identical or within tolerance, or the page is not compared at all)
FIGURE = "<figure>"
EMBEDDED = re.compile(r"data:image/[\w+.-]+;base64,[A-Za-z0-9+/=]+")
RUN_COLUMNS = ("run time",)


def compare_page(file: str, path_a: Path, path_b: Path, largest: Largest) -> None:
    """A page (Markdown or HTML) drawn by other code than the revision's, from inputs that reproduced: its text
    equal line by line once what names the code (code_names_aside) and what records the run (RUN) are set aside,
    each printed number within one unit of its last digit (compare_printed), and each number report.html tags
    with its file and key within its kind's tolerance; raises Differs for other words, keeps a number beyond its
    tolerance in `largest`. A figure has no reader of values: its
    bytes must be equal."""
    if Path(file).suffix not in (".md", ".html"):
        raise Differs(f"{file}: drawn by other code than the revision's, and its bytes differ (no reader of "
                      f"values for '{Path(file).suffix}')")
    since = len(largest.beyond)
    nums_a, text_a = _page(path_a.read_text(encoding="utf-8", errors="replace"))
    nums_b, text_b = _page(path_b.read_text(encoding="utf-8", errors="replace"))
    lines_a, lines_b = text_a.splitlines(), text_b.splitlines()
    if len(lines_a) != len(lines_b):
        raise Differs(f"{file}: {len(lines_a)} lines here, {len(lines_b)} in the revision (the code's names and "
                      "the run records set aside)")
    for i, (x, y) in enumerate(zip(lines_a, lines_b), start=1):
        if x != y:
            try:
                compare_printed(f"{file}: line {i}", x, y)
            except Beyond as e:  # the same words, a number beyond one unit of its last digit: a value
                largest.beyond_tolerance(str(e), 1, PRINTED)
            except Differs:
                raise Differs(f"{file}: line {i}: {first_difference(x, y)} (the code's names and the run records "
                              "set aside)") from None
    if len(nums_a) != len(nums_b):
        raise Differs(f"{file}: {len(nums_a)} tagged numbers here, {len(nums_b)} in the revision")
    for (src, key, op, a), (src_b, key_b, op_b, b) in zip(nums_a, nums_b):
        if (src, key, op) != (src_b, key_b, op_b):
            raise Differs(f"{file}: a number read from {src}: {key} ({op}) here, from {src_b}: {key_b} ({op_b}) "
                          "in the revision")
        kind = "exact" if op.startswith("arg") else kind_of(src, key.partition("[")[0])
        compare_arrays(f"{file}: {src}: {key}", np.float64(a), np.float64(b), kind, largest)
    largest.raise_beyond(since)


def _page(text: str) -> tuple[list[tuple[str, str, str, float]], str]:
    """(report.html's tagged numbers that are results: file, key, op, unscaled value; the text with the code's
    names and the run records set aside, each result number left as printed)."""
    nums = []

    def num(m: re.Match) -> str:
        src, key = html.unescape(m["src"]), html.unescape(m["key"])
        if is_run_record(src) or is_run_key(src, key):
            return RUN
        try:
            nums.append((src, key, m["op"], float(m["value"]) / float(m["scale"])))
        except ValueError:
            raise Differs(f"{src}: {key}: a tagged number that does not parse ({m['value']!r} / {m['scale']!r})") from None
        return m["text"]

    text = MACHINE.sub(f"ran on: {RUN}", DURATION.sub(f"about {RUN}", NUM_SPAN.sub(num, EMBEDDED.sub(FIGURE, text))))
    return nums, code_names_aside("\n".join(_run_columns_aside(text.splitlines())))


def _run_columns_aside(lines: list[str]) -> list[str]:
    """A Markdown table's cells under a header that names a run record (RUN_COLUMNS), set aside."""
    out, aside = [], None
    for line in lines:
        if not line.startswith("|"):
            out.append(line)
            aside = None
            continue
        cells = re.split(r"(?<!\\)\|", line)
        if aside is None:
            aside = {i for i, c in enumerate(cells) if c.strip().lower().startswith(RUN_COLUMNS)}
        else:
            cells = [RUN if i in aside else c for i, c in enumerate(cells)]
        out.append("|".join(cells))
    return out
