"""report: reports/report.html and reports/report.md, every chart explained with numbers from the data.

Inputs: the statistics (`artifacts/stats/<model>.h5`), evaluation (`artifacts/eval/<model>.h5`,
`metrics/accuracy/<model>.json`), likelihood (`artifacts/likelihood/<model>.h5`, and the per-problem links the
figures stage wrote to `reports/likelihood.json`), model manifests, timings and the charts in `reports/figures/`.
Every number in the text is read from one of those files at render time and remembers where it came
from: in the HTML each sits in `<span class="num" data-src=FILE data-key=KEY data-op=OP ...>`, so a
reader (and the tests) can trace it back. Sentences are chosen from the numbers, so another run gives
other, still true, sentences. Text that comes from data, models or params is escaped (HTML autoescape;
Markdown code blocks and escaping).

The HTML is one self-contained file (charts embedded as PNG data URIs, no scripts, no network); the
Markdown links the charts beside it (`figures/*.png`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from markupsafe import Markup

from meaningless_tokens import TEMPLATES, charts, cli, store
from meaningless_tokens.config import Params
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.report.content import VERDICT, content as report_content, duration_unit
from meaningless_tokens.results.trace import md_escape
from meaningless_tokens.store import FIGURES_DIR, atomic_path

# the stage's outputs beside the verdict and docs/results.md (write_results): role -> artifact kind (store.PATHS)
OUTPUTS = {"html": "report.html", "md": "report.md"}
RESULTS = store.path("results.md")
RESULT_FIGURES = store.path("results")    # small PNG copies of the key charts, beside docs/results.md
KEY_CHARTS = ("cross-model", "accuracy", "likelihood")


def fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def write_results(root: Path, summary: dict, fig_dir: Path) -> None:
    """metrics/verdict.json, the key charts' PNG copies under docs/results/ and docs/results.md rendered from them."""
    path = root / VERDICT
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = {**summary, "stage": "report"}  # what wrote it, as every metrics file says (store.metrics)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(summary, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    (root / RESULT_FIGURES).mkdir(parents=True, exist_ok=True)
    for kind in KEY_CHARTS:
        png = fig_dir / f"{kind}.png"
        if png.is_file():
            with atomic_path(root / RESULT_FIGURES / png.name) as tmp:
                tmp.write_bytes(png.read_bytes())
    with atomic_path(root / RESULTS) as tmp:
        tmp.write_text(results_md(summary, root), encoding="utf-8")


def results_md(summary: dict, root: Path) -> str:
    """docs/results.md from metrics/verdict.json (and which key charts exist under docs/results/) alone."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=False, undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_escape
    env.filters["code"] = code_span
    env.filters["duration"] = duration
    figures = [k for k in KEY_CHARTS if (root / RESULT_FIGURES / f"{k}.png").is_file()]
    pooled = len(summary["models"]) > 1
    section_of = {k.KIND: charts.section(k) for k in charts.KINDS}  # where the report explains each chart
    return env.get_template("results.md.j2").render(v=summary, figures=figures, fig_dir=RESULT_FIGURES.name, pooled=pooled,
                                                    section_of=section_of)


def duration(hours: float) -> str:
    scale, fmt, unit = duration_unit(hours)
    return f"{hours * scale:{fmt}} {unit}"


def code_span(text: str) -> str:
    """Inline code that holds any text: delimiters longer than its longest backtick run, padded when needed."""
    text = str(text).replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or longest else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


# the markup of a phrase in each format: templates/prose.j2 writes the report's sentences once with these
HTML_MARKUP = {"b": lambda x: Markup("<b>{}</b>").format(x), "em": lambda x: Markup("<em>{}</em>").format(x),
               "code": lambda x: Markup("<code>{}</code>").format(x), "q": lambda x: Markup("“{}”").format(x),
               "to": "→"}
MD_MARKUP = {"b": lambda x: f"**{md_escape(x)}**", "em": lambda x: f"*{md_escape(x)}*", "code": lambda x: code_span(x),
             "q": lambda x: f'"{md_escape(x)}"', "to": "->"}


def render(context: dict) -> tuple[str, str]:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    loader = FileSystemLoader(str(TEMPLATES))
    html_env = Environment(loader=loader, autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True)
    html_env.globals.update(HTML_MARKUP)
    html_env.filters["md"] = lambda x: x  # text from data: autoescaping escapes it
    md_env = Environment(loader=loader, autoescape=False, undefined=StrictUndefined, keep_trailing_newline=True,
                         trim_blocks=True, lstrip_blocks=True)
    md_env.globals.update(MD_MARKUP)
    md_env.filters["md"] = md_escape
    md_env.filters["fence"] = fence
    md_env.filters["code"] = code_span
    return (html_env.get_template("report.html.j2").render(**context),
            md_env.get_template("report.md.j2").render(**context))


@names_the_file
def run(params: Params, root: Path | None = None) -> list[Path]:
    """The report from the project's data, written under `root` (default: the project)."""
    params = store.params_view(params, "report")  # the keys dvc.yaml lists for it, no other
    project = params.project_path(".")
    where = store.outputs(params, None, root, **OUTPUTS)
    fig_dir = project / FIGURES_DIR
    c = report_content(params)
    context = {**c.context, "fig_rel": Path(os.path.relpath(fig_dir, where["html"].parent)).as_posix()}
    html, md = render(context)
    written = []
    for path, text in ((where["html"], html), (where["md"], md)):
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        written.append(path)
    write_results(root or project, c.summary, fig_dir)
    print(f"report: {c.n_charts} charts explained -> {written[0]}, {written[1]}")
    return written


def main(argv: list[str] | None = None) -> int:
    return cli.main("report", __doc__, run, argv, per_model=False)


if __name__ == "__main__":
    sys.exit(main())
