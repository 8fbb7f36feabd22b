"""verify across a move of the code: what names the code in a text (a module path, a commit) is set aside, as the
provenance code hashes are, and a page drawn by other code is compared by what it prints. Fast: small files."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

from meaningless_tokens.errors import Differs
from meaningless_tokens.verify.compare import Largest, code_names_aside, compare_h5
from meaningless_tokens.verify.pages import compare_page

DEFINITIONS = ("`arm`: the none prompt with the ARM hook ({module}, the one evaluate uses), seeded by the "
               "problem's index; the drop at count 55 is the statistics' ({stats}: `sample_stats`).")


def h5(path: Path, definitions: str) -> Path:
    with h5py.File(path, "w") as f:
        f.attrs["definitions"] = definitions
        f["none/solution/sum"] = [1.0, 2.0]
    return path


def test_a_module_path_or_commit_inside_a_text_is_set_aside_and_nothing_else():
    assert code_names_aside("the hook (meaningless_tokens/arm/hook.py, the one)") == "the hook (<code>, the one)"
    assert code_names_aside("(meaningless_tokens/scoring/: the") == code_names_aside("(meaningless_tokens/scoring.py: the")
    assert code_names_aside("meaningless_tokens.measures.extract") == "<code>"
    assert code_names_aside("stages/likelihood.py's DEFINITIONS") == "<code>'s DEFINITIONS"
    assert code_names_aside("commit 0fbb1f98d690 / 20fb8be00c0680f21eb668cf99054e337b6a0e2a-dirty") == \
        "commit <commit> / <commit>"
    # a sha256 of data, a plain number, a word and a model's name are no code names
    for kept in ("35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132", "1234567", "the stages run",
                 "Qwen2.5-Coder-0.5B", "deadbeef"):
        assert code_names_aside(kept) == kept


def test_a_definitions_text_naming_moved_modules_is_equal_and_a_changed_word_differs(tmp_path):
    old = h5(tmp_path / "old.h5", DEFINITIONS.format(module="meaningless_tokens/arm.py",
                                                     stats="meaningless_tokens/attention.py"))
    moved = h5(tmp_path / "moved.h5", DEFINITIONS.format(module="meaningless_tokens/arm/hook.py",
                                                         stats="meaningless_tokens/measures/extract.py"))
    largest = Largest()
    compare_h5("artifacts/likelihood/m.h5", moved, old, largest)
    assert largest.share < 0  # no value differs
    reworded = h5(tmp_path / "reworded.h5", DEFINITIONS.format(module="meaningless_tokens/arm/hook.py",
                                                               stats="meaningless_tokens/measures/extract.py")
                  .replace("count 55", "count 56"))
    with pytest.raises(Differs, match=r"attribute definitions: .*count 56.*here.*count 55.*in the revision"):
        compare_h5("artifacts/likelihood/m.h5", reworded, old, Largest())


PAGE_MD = """# Report

- Likelihood, M: with 100 problems the detectable change is 0.015 nats/token; all 500 problems would bring it to \
0.0065 at about {minutes} (dvc exp run -S likelihood.n\\_samples=null).

A forward hook does it (`{module}`).

| model | git commit (extract / evaluate) | run time, s (extract / evaluate) | weights sha256 |
|---|---|---:|---|
| M | `{commit}` / `{commit}` | {seconds} | `35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132` |

Extraction ran on: device cpu, cpu model {cpu}, threads 2
"""
OLD = dict(minutes="8 minutes", module="meaningless_tokens/arm.py", commit="82b5e9dbb561", seconds="20 / 28",
           cpu="Intel Xeon, cpu capability AVX512")
NEW = dict(minutes="1.4 hours", module="meaningless_tokens/arm/hook.py", commit="0fbb1f98d690", seconds="41 / 121",
           cpu="AMD EPYC, cpu capability AVX2")


def page(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_a_markdown_page_drawn_by_moved_code_equals_the_revisions_with_code_names_and_run_records_aside(tmp_path):
    old = page(tmp_path, "old.md", PAGE_MD.format(**OLD))
    compare_page("reports/report.md", page(tmp_path, "new.md", PAGE_MD.format(**NEW)), old, Largest())
    # a printed result one unit of its last digit away still passes; further, or a word changed, differs
    compare_page("reports/report.md", page(tmp_path, "a.md", PAGE_MD.format(**NEW).replace("0.015 ", "0.016 ")),
                 old, Largest())
    for changed, where in (("0.015 ", "0.017 "), ("A forward hook", "A backward hook"),
                           ("`35dc41080a", "`45dc41080a"), ("| M |", "| N |")):
        with pytest.raises(Differs, match=r"reports/report.md: line \d+: "):
            compare_page("reports/report.md", page(tmp_path, "b.md", PAGE_MD.format(**NEW).replace(changed, where)),
                         old, Largest())
    with pytest.raises(Differs, match="lines here"):
        compare_page("reports/report.md", page(tmp_path, "c.md", PAGE_MD.format(**NEW) + "\nOne more line.\n"),
                     old, Largest())


def num(src: str, key: str, value: float, text: str, scale: str = "1.0") -> str:
    return (f'<span class="num" title="{src}: {key}" data-src="{src}" data-key="{key}" data-op="value" '
            f'data-scale="{scale}" data-fmt=".3g" data-value="{value!r}">{text}</span>')


def html(drop: float, seconds: float, hours: float) -> str:
    return (f"<p>The drop is {num('artifacts/stats/m.h5', 'mless/layer_drop_pct[0]', drop, format(drop, '.1f'))} "
            f"%; all 500 at about {num('metrics/verdict.json', 'power.likelihood.m.hours_at_500', hours, format(hours, '.2g'))}"
            f" hours.</p>\n<td class=\"r\">{num('metrics/timing/extract-m.json', 'seconds', seconds, format(seconds, '.0f'))}</td>\n")


def test_an_html_page_compares_each_tagged_result_within_its_kind_and_sets_run_records_aside(tmp_path):
    old = page(tmp_path, "old.html", html(16.615545, 20.26, 0.13))
    largest = Largest()
    compare_page("reports/report.html", page(tmp_path, "a.html", html(16.6155, 41.0, 1.36)), old, largest)
    assert largest.share > 0 and "mless/layer_drop_pct[0]" in largest.text  # the result's difference, measured
    # printed alike, but beyond the `percent` kind's tolerance (atol 1e-3): the tagged value tells
    with pytest.raises(Differs, match=r"artifacts/stats/m.h5: mless/layer_drop_pct\[0\]"):
        compare_page("reports/report.html", page(tmp_path, "b.html", html(16.62, 41.0, 1.36)), old, Largest())


def test_a_figure_the_page_embeds_is_compared_as_its_own_output_not_in_the_page(tmp_path):
    """reports/figures, which the report's stage reads, is compared as an output of its own; the page's copy of a
    figure (a data URL) is set aside, and the text around it still counts."""
    old = page(tmp_path, "old.html", '<img src="data:image/png;base64,iVBORw0KGgoAAAA=" alt="Accuracy">\n')
    compare_page("reports/report.html",
                 page(tmp_path, "a.html", '<img src="data:image/png;base64,iVBORw0KGgoBBBB+/=" alt="Accuracy">\n'),
                 old, Largest())
    with pytest.raises(Differs, match="line 1"):
        compare_page("reports/report.html",
                     page(tmp_path, "b.html", '<img src="data:image/png;base64,iVBORw0KGgoAAAA=" alt="Likelihood">\n'),
                     old, Largest())


def test_a_figure_drawn_by_other_code_has_no_reader_of_values(tmp_path):
    a, b = page(tmp_path, "a.png", "x"), page(tmp_path, "b.png", "y")
    with pytest.raises(Differs, match="no reader of values for '.png'"):
        compare_page("reports/figures/x.png", a, b, Largest())
