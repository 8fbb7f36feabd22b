"""The paper's rule (meaningless_tokens/grading.py) against a table of cases, one per behaviour of its checker."""

import pytest

from meaningless_tokens.grading import grade, paper_box, paper_equiv, paper_normalize

BOXED = "Please reason step by step and put your final answer within \\boxed{}."
BOXED_LITERAL = "Please reason step by step and put your final answer within \\boxed{{}}."  # the paper's greedy code

# (text the paper's code searches, gold answer, expected prediction, expected right)
CASES = [
    # normalization steps, each alone
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", "\\dfrac{1}{2}", True),          # dfrac -> frac
    ("\\boxed{\\tfrac{1}{2}}", "\\frac{1}{2}", "\\tfrac{1}{2}", True),          # tfrac -> frac
    ("\\boxed{x = 3}", "3", "x = 3", True),                                     # short left side of '=' dropped
    ("\\boxed{xyz = 3}", "3", "xyz = 3", False),                                # ... but not one of 3 characters
    ("\\boxed{0.5}", "\\frac{1}{2}", "0.5", True),                              # 0.5 -> \frac{1}{2}
    ("\\boxed{1/2}", "\\frac{1}{2}", "1/2", True),                              # integer a/b -> \frac{a}{b}
    ("\\boxed{10\\%}", "10", "10\\%", True),                                    # \% dropped
    ("\\boxed{90^\\circ}", "90", "90^\\circ", True),                            # ^\circ dropped
    ("\\boxed{90^{\\circ}}", "90", "90^{\\circ}", True),                        # ^{\circ} dropped
    ("\\boxed{\\$5}", "5", "\\$5", True),                                       # \$ dropped
    ("\\boxed{5\\text{ cm}}", "5", "5\\text{ cm}", True),                       # units from "\text{ " on
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", "\\left( 1, 2 \\right)", True),  # \left, \right, spaces
    ("\\boxed{\\!1\\!0}", "10", "\\!1\\!0", True),                              # \! dropped
    ("\\boxed{.5}", "\\frac{1}{2}", ".5", True),                                # leading '.' -> 0.5 -> \frac12
    ("\\boxed{\\frac{.5}{2}}", "\\frac{0.5}{2}", "\\frac{.5}{2}", True),        # "{." -> "{0."
    ("\\boxed{\\sqrt3}", "\\sqrt{3}", "\\sqrt3", True),                         # \sqrt3 -> \sqrt{3}
    ("\\boxed{\\frac12}", "\\frac{1}{2}", "\\frac12", True),                    # \frac12 -> \frac{1}{2}
    ("\\boxed{\\frac1{72}}", "\\frac{1}{72}", "\\frac1{72}", True),             # \frac1{72} -> \frac{1}{72}
    ("\\boxed{1\n2}", "12", "1\n2", True),                                      # newlines dropped
    # the substring rule
    ("\\boxed{1}", "12", "1", True),
    ("\\boxed{12}", "1", "12", False),
    # box selection
    ("\\boxed{1} then \\boxed{\\sqrt{2}}", "\\sqrt{2}", "\\sqrt{2}", True),     # the last box
    ("\\boxed{7} then \\boxed{\\frac{1}{2", "7", None, False),                  # unclosed last box: wrong
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True),  # nested braces
    ("\\fbox{3}", "3", None, False),            # \fbox is found, but its remove_boxed accepts \boxed{ only
    ("\\boxed 3", "3", None, False),            # \boxed without a brace: no prediction
    ("\\fbox{4} and \\boxed{3}", "3", "3", True),                               # \boxed wins over a later \fbox
    ("no box at all", "3", None, False),
    ("\\boxed{\\sqrt}", "2", "\\sqrt", False),  # normalization raises (bare trailing \sqrt): wrong
    # zero-padded AIME answers
    ("\\boxed{33}", "033", "33", True),         # by the substring rule
    ("\\boxed{033}", "033", "033", True),
    ("\\boxed{3}", "033", "3", True),           # ... which also accepts a wrong 3 for 033
    ("\\boxed{336}", "336^\\circ", "336", True),  # AIME 2025 row 20
    # the empty box of the instruction, prompt + output as the paper's greedy runs grade
    (BOXED + "I do not know.", "12", "", True),          # "" is a substring of every answer
    (BOXED_LITERAL + "I do not know.", "12", "{}", False),  # "{}" of none
    (BOXED + "so \\boxed{5}", "12", "5", False),
]


@pytest.mark.parametrize("text,gold,pred,right", CASES)
def test_paper_rule_table(text, gold, pred, right):
    assert paper_equiv(text, gold) == (pred, right)


def test_normalization_examples():
    assert paper_normalize("\\dfrac{3}{4}") == "\\frac{3}{4}"
    assert paper_normalize("k = \\frac 12") == "\\frac{1}{2}"
    assert paper_normalize("") == ""
    assert paper_box("\\boxed{{}}") == "{}"


def test_grade_scope_prompt_and_output_or_output_alone():
    # greedy: prompt + output (the instruction's empty box counts); pass@3: the output alone (no prediction)
    g = grade("I do not know.", "12", BOXED)
    assert not g.correct and g.paper_extracted == "" and g.paper_correct
    g = grade("I do not know.", "12", "")
    assert g.paper_extracted is None and not g.paper_correct
    g = grade("so $x = 0.5$, i.e. \\boxed{\\dfrac{1}{2}}", "\\frac12", BOXED)
    assert g.correct and g.paper_extracted == "\\dfrac{1}{2}" and g.paper_correct
