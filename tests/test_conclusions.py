"""The conclusions judged apart from the last digits (meaningless_tokens/verify/conclusions.py) and the answer they give
with the numbers' (verify/driver.py's verdict), on the committed metrics/verdict.json: a moved word, Holm decision, sign
or estimate is `not reproduced` even when every number is within tolerance; values beyond tolerance with every
conclusion equal are `reproduced in its conclusions`, exit 4."""

from __future__ import annotations

import copy
import json

import pytest

from meaningless_tokens.report.pooling import Z95
from meaningless_tokens.verify.conclusions import MOVE, judge
from meaningless_tokens.verify.compare import Largest
from meaningless_tokens.verify.driver import BEYOND, EXIT, IDENTICAL, WITHIN, Output, verdict
from tests.dvc_repo import ROOT

VERDICT = json.loads((ROOT / "metrics/verdict.json").read_text())


def cell(v: dict, claim: str, model: str) -> dict:
    return next(c for c in v["claims"] if c["key"] == claim)["cells"][model]


def a_cell_with_an_interval() -> tuple[str, str]:
    for c in VERDICT["claims"]:
        for model, x in c["cells"].items():
            if x.get("low") is not None and x["high"] > x["low"] and x.get("holm") is not None:
                return c["key"], model
    raise AssertionError("the committed verdict has no cell with an interval")


def moved_by(se: float) -> dict:
    """The committed verdict with one cell's estimate moved up by `se` of its standard errors."""
    claim, model = a_cell_with_an_interval()
    v = copy.deepcopy(VERDICT)
    x = cell(v, claim, model)
    x["estimate"] += se * (x["high"] - x["estimate"]) / Z95
    return v


def rows(*statuses: str) -> list[Output]:
    out = []
    for k, s in enumerate(statuses):
        r = Output(f"out{k}", "stage", "md5", s)
        if s == BEYOND:
            r.largest = Largest()
            r.largest.beyond_tolerance(f"artifacts/x.h5: d[{k}]: 2 here, 1 in the revision (exact)")
        out.append(r)
    return out


def test_the_committed_verdict_against_itself_is_equal():
    c = judge(VERDICT, copy.deepcopy(VERDICT))
    assert c.equal and c.largest == 0 and not c.moved


@pytest.mark.parametrize("se,equal", [(0.05, True), (0.5, False)])
def test_an_estimate_moved_by_half_a_standard_error_is_a_moved_conclusion(se, equal):
    c = judge(moved_by(se), VERDICT)
    assert c.equal is equal and c.largest == pytest.approx(se, rel=1e-6)
    line, code = verdict(rows(WITHIN, IDENTICAL), c)  # every number within tolerance (a loosened kind, say)
    if equal:
        assert code == EXIT["reproduced"] == 0 and line.startswith("reproduced: ")
    else:
        assert code == EXIT["not reproduced"] == 1 and "a conclusion moved" in line and f"at most {MOVE}" in line


@pytest.mark.parametrize("key,value", [("word", "contradicted"), ("holm", "flip")])
def test_a_verdict_word_or_a_holm_decision_that_moved(key, value):
    claim, model = a_cell_with_an_interval()
    v = copy.deepcopy(VERDICT)
    x = cell(v, claim, model)
    x[key] = (not x[key]) if value == "flip" else ("reproduced" if x[key] == value else value)
    c = judge(v, VERDICT)
    assert not c.equal and c.moved[0].startswith(f"claims[{claim}].cells.{model}.{key}: ")
    line, code = verdict(rows(WITHIN), c)
    assert code == 1 and line.startswith("not reproduced: ")


def test_a_sign_and_a_pooled_word_and_the_counts_are_conclusions():
    v = copy.deepcopy(VERDICT)
    pooled = next(c for c in v["claims"] if c.get("pooled"))["pooled"]
    pooled["estimate"] = -pooled["estimate"]
    pooled["word"] = "contradicted" if pooled["word"] != "contradicted" else "reproduced"
    v["counts"] = {**v["counts"], "reproduced": v["counts"]["reproduced"] + 1}
    moved = judge(v, VERDICT).moved
    assert any(".pooled.word:" in m for m in moved) and any(".pooled.estimate: sign" in m for m in moved)
    assert any(m.startswith("counts of words") for m in moved)


def test_values_beyond_tolerance_with_equal_conclusions_have_their_own_answer():
    line, code = verdict(rows(IDENTICAL, BEYOND, BEYOND), judge(moved_by(0.02), VERDICT))
    assert code == EXIT["reproduced in its conclusions"] == 4
    assert line.startswith("reproduced in its conclusions: 2 value(s) beyond float noise (artifacts/x.h5: d[1]; "
                           "artifacts/x.h5: d[2]), every conclusion equal, largest move 0.02 SE")


def test_a_verdict_file_without_a_key_the_conclusions_need_is_one_line_and_the_numbers_alone_judge():
    v = copy.deepcopy(VERDICT)
    del v["claims"][0]["cells"][next(iter(v["claims"][0]["cells"]))]["word"]
    c = judge(VERDICT, v)
    assert c.problem.startswith("metrics/verdict.json at the revision claims[") and "no key 'word'" in c.problem
    assert "\n" not in c.problem
    assert verdict(rows(WITHIN), c) == (verdict(rows(WITHIN), c)[0], 0)  # the numbers alone: reproduced
    line, code = verdict(rows(BEYOND), c)  # values beyond tolerance, and nothing to judge them by
    assert code == 1 and "the conclusions cannot be judged" in line
