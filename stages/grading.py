"""Answer grading: math-verify (the maintained library) and, beside it, the paper's lenient scoring."""

from __future__ import annotations

from dataclasses import dataclass

from math_verify import parse, verify

BOX_OPENERS = ("\\boxed{", "\\fbox{")


@dataclass(frozen=True)
class Grade:
    extracted: str          # what math-verify extracted from the output ("" when nothing)
    correct: bool           # math-verify: equivalent to the gold answer
    paper_extracted: str | None  # the last \boxed{} of prompt + output, as the paper's grader takes it
    paper_correct: bool     # the paper's rule: equal to the gold answer or a substring of it


def gold_target(answer: str):
    # wrapping the gold answer in \boxed{} makes math-verify read it as LaTeX, as it reads outputs
    return parse("\\boxed{" + answer + "}")


def _box_end(text: str, start: int) -> int | None:
    """Index just past the brace that closes the box opened at `start` (which points at '{')."""
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


def last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...} (or \\fbox{...}) in `text`, None when there is none."""
    best = None
    for opener in BOX_OPENERS:
        at = text.rfind(opener)
        while at != -1:
            end = _box_end(text, at + len(opener) - 1)
            if end is not None:
                if best is None or at > best[0]:
                    best = (at, text[at + len(opener): end - 1])
                break
            at = text.rfind(opener, 0, at)
    return None if best is None else best[1]


def grade(output: str, answer: str, prompt_text: str) -> Grade:
    """Grade one output against the gold `answer`.

    The paper's grader searches the whole decoded text, prompt included; the instruction itself
    holds an empty \\boxed{}, so an output without a box is scored by that empty box, and the
    empty string is a substring of every answer: such outputs count as right under its rule.
    """
    pred = parse(output)
    correct = bool(pred) and verify(gold_target(answer), pred)
    extracted = (pred[-1] if isinstance(pred[-1], str) else str(pred[-1])) if pred else ""
    boxed = last_boxed(prompt_text + output)
    paper = boxed is not None and (boxed.strip() == answer.strip() or boxed.strip() in answer.strip())
    return Grade(extracted, bool(correct), boxed, bool(paper))
