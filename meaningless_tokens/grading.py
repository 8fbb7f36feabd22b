"""Answer grading: math-verify (the maintained library, the main grade) and, beside it, the paper's rule.

The paper's rule reproduces the behaviour of its checker (`math_equivalence.py` of
vanpe20/ARM-Meaningless-tokens at commit 67b57ba; notes/paper-method.md, section 7), written anew here:

  1. the prediction is the last `\\boxed` of the text, or the last `\\fbox` when there is no `\\boxed` at all,
     brace-matched from there; an unclosed last box gives no prediction (wrong), and so does a box not of the
     form `\\boxed{...}` (its `remove_boxed` accepts nothing else: an `\\fbox{...}` or `\\boxed 5` is wrong);
  2. prediction and gold answer are normalized (`paper_normalize`, its `_strip_string`);
  3. right when `pred == gold or pred in gold` (the substring rule).

The text searched is prompt + output for its greedy runs (`grade(..., prompt_text)`) and the output
alone for its pass@3 (`prompt_text=""`). A normalization that raises (e.g. `\\sqrt` or `\\frac` at the end
of a string) counts as wrong, as its pass@3 loop does (its greedy loop would stop with the exception).
"""

from __future__ import annotations

from dataclasses import dataclass

from math_verify import parse, verify

BOX_OPENERS = ("\\boxed{", "\\fbox{")


@dataclass(frozen=True)
class Grade:
    extracted: str          # what math-verify extracted from the output ("" when nothing)
    correct: bool           # math-verify: equivalent to the gold answer
    paper_extracted: str | None  # the paper's prediction: its last box's content, None when it has none
    paper_correct: bool     # the paper's rule: normalized prediction equal to the gold answer or a substring of it


def gold_target(answer: str):
    # wrapping the gold answer in \boxed{} makes math-verify read it as LaTeX, as it reads outputs
    return parse("\\boxed{" + answer + "}")


def _box_end(text: str, start: int) -> int | None:
    """Index just past the brace that closes the first brace at or after `start`, None when unclosed."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def has_complete_box(text: str) -> bool:
    """True once the text holds a \\boxed{...} whose braces are closed (generation may stop there)."""
    for opener in BOX_OPENERS:
        at = text.find(opener)
        while at != -1:
            if _box_end(text, at + len(opener) - 1) is not None:
                return True
            at = text.find(opener, at + 1)
    return False


# ---- the paper's checker ------------------------------------------------------------------------

def paper_box(text: str) -> str | None:
    """The paper's prediction: the content of the last `\\boxed{...}` (`\\fbox` only when no `\\boxed` occurs),
    None when that last box is unclosed or not written `\\boxed{...}`."""
    at = text.rfind("\\boxed")
    if at < 0:
        at = text.rfind("\\fbox")
        if at < 0:
            return None
    end = _box_end(text, at)
    if end is None:
        return None
    box = text[at:end]
    if not box.startswith("\\boxed{"):  # its remove_boxed: \fbox{..} and "\boxed 5 ..." give None
        return None
    return box[len("\\boxed{"):-1]


def _fix_fracs(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1b -> \\frac{1}{b}, \\frac1{72} -> \\frac{1}{72}; raises on a bare
    trailing \\frac."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":      # IndexError on an empty part: the paper's code raises there too
            out += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _fix_a_slash_b(s: str) -> str:
    """`a/b` of two plain integers -> \\frac{a}{b}."""
    pieces = s.split("/")
    if len(pieces) != 2:
        return s
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _fix_sqrt(s: str) -> str:
    """\\sqrt3 -> \\sqrt{3}; raises on a bare trailing \\sqrt."""
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        out += "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:]
    return out


def paper_normalize(s: str) -> str:
    """The paper's `_strip_string`, step by step in its order."""
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    s = s.split("\\text{ ")[0]                      # units: everything from the first "\text{ " on
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:     # "x = 3" -> " 3"; "k=" only, not "area = 3"
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def paper_equiv(text: str, answer: str) -> tuple[str | None, bool]:
    """(prediction, right) under the paper's rule for `text` (what its code searches) and the gold `answer`."""
    pred = paper_box(text)
    if pred is None:
        return None, False
    try:
        p, g = paper_normalize(pred), paper_normalize(answer)
    except IndexError:
        return pred, False
    return pred, p == g or p in g


# ---- both grades ------------------------------------------------------------------------------------

def grade(output: str, answer: str, prompt_text: str) -> Grade:
    """Grade one output against the gold `answer`: math-verify on the output; the paper's rule on
    `prompt_text + output` (its greedy runs; pass `prompt_text=""` for its pass@3, which grades the output alone).

    With the prompt included, an output without a box is scored by the instruction's own box: `\\boxed{}`
    gives the empty prediction, a substring of every answer (right), while the paper code's literal
    `\\boxed{{}}` gives `{}`, a substring of no answer (wrong).
    """
    pred = parse(output)
    correct = bool(pred) and verify(gold_target(answer), pred)
    extracted = (pred[-1] if isinstance(pred[-1], str) else str(pred[-1])) if pred else ""
    boxed, paper = paper_equiv(prompt_text + output, answer)
    return Grade(extracted, bool(correct), boxed, bool(paper))

PAPER_RULE = ("The paper's checker (math_equivalence.py, vanpe20/ARM-Meaningless-tokens 67b57ba) rewritten: the last "
              "\\boxed{...} of the text (\\fbox only without any \\boxed; unclosed or not \\boxed{...}: wrong), its "
              "_strip_string normalization of prediction and gold answer, right when equal or a substring of the gold.")
