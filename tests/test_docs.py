"""The front page and the manual stay true to the project (README.md and docs/*.md).

Fast (no model, no subprocess): the Markdown is parsed with markdown-it-py (CommonMark + tables, as
a code host renders it) and every checkable item is checked against the repository:

- relative links and images resolve to a file, and their `#anchor` to a heading of that file
  (the code host's slug rules);
- `python -m X` in code names an importable module, and `python -m stages.<s>` a module that a
  `dvc.yaml` stage runs; `python path/to/script.py` names a file that exists;
- `dvc ...` command lines in code parse with DVC's own argument parser, and their `-S` /
  `--set-param` keys exist in the params schema;
- dotted params keys in backticks (`evaluate.batch_size`, `models.<m>.layers`) exist in the schema;
- repository paths in backticks (`stages/...`, `tests/...`, `profiles/...`) exist.

Each failure names the doc file, its line and the bad item; each kind must be found a minimum number
of times, so the test cannot pass on an empty manual.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import logging
import re
import shlex
import sys
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from meaningless_tokens import config  # noqa: E402  (the params schema)

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SECTIONS = ("prompt", "dataset", "extract", "evaluate", "stats", "activations", "sweep", "likelihood",
            "figures", "arm", "runtime", "models")
PATH_PREFIXES = ("stages", "meaningless_tokens", "tests", "benchmarks", "data", "profiles", "locks", "docs",
                 "vendor")
FILE_SUFFIXES = (".py", ".json", ".jsonl", ".h5", ".csv", ".md", ".txt", ".yaml", ".yml", ".png", ".svg",
                 ".html", ".j2", ".parquet", ".lock", ".in", ".toml")
PLACEHOLDER = re.compile(r"<[^<>]*>")
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class Item:
    doc: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


@dataclass
class Doc:
    path: Path
    lines: list[str]
    links: list[Item]          # href/src of links and images
    spans: list[Item]          # inline code
    blocks: list[Item]         # one item per line of fenced/indented code
    headings: list[str]


def _line(lines: list[str], span: list[int] | None, needle: str) -> int:
    """1-based line of needle inside the block's line range (its first line when not found)."""
    if not span:
        return 1
    start, end = span
    for i in range(start, min(end, len(lines))):
        if needle in lines[i]:
            return i + 1
    return start + 1


@cache
def parse(path: Path) -> Doc:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    md = MarkdownIt("commonmark").enable("table")
    doc = Doc(path, lines, [], [], [], [])
    tokens = md.parse(text)
    for i, tok in enumerate(tokens):
        if tok.type in ("fence", "code_block"):
            start = tok.map[0] + (1 if tok.type == "fence" else 0)
            for k, line in enumerate(tok.content.splitlines()):
                doc.blocks.append(Item(path, start + k + 1, line))
        elif tok.type == "inline":
            if i > 0 and tokens[i - 1].type == "heading_open":
                doc.headings.append("".join(c.content for c in tok.children
                                            if c.type in ("text", "code_inline", "html_inline")))
            for child in tok.children or []:
                if child.type == "code_inline":
                    doc.spans.append(Item(path, _line(lines, tok.map, f"`{child.content}"), child.content))
                elif child.type in ("link_open", "image"):
                    target = child.attrs.get("href") or child.attrs.get("src")
                    doc.links.append(Item(path, _line(lines, tok.map, f"]({target}"), target))
    return doc


def slug(heading: str) -> str:
    """GitHub's heading anchor: lowercase, drop punctuation but - and _, each space a hyphen."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in parse(path).headings:
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


@cache
def stage_modules() -> frozenset[str]:
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    cmds = []
    for stage in spec["stages"].values():
        cmds.append((stage.get("do") or stage)["cmd"])
    return frozenset(m for cmd in cmds for m in re.findall(r"python -m stages\.(\w+)", str(cmd)))


@cache
def model_names() -> tuple[str, ...]:
    return tuple(yaml.safe_load((ROOT / "params.yaml").read_text())["models"])


# ---------------------------------------------------------------- the params schema


def _unwrap(tp) -> list:
    """The concrete types an annotation allows (Optional, unions and Annotated opened)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(tp) for t in _unwrap(arg)]
    return [tp]


def schema_error(key: str) -> str | None:
    """None when the dotted key exists in the schema, else why not. `<...>` stands for any dict key
    (a model name, a chart kind); a trailing `*` for any key below."""
    parts = key.split(".")
    if parts[-1] == "*":
        parts = parts[:-1]
    types_ = [config.Params]
    walked = []
    for part in parts:
        nxt = []
        for tp in types_:
            origin = typing.get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                field = tp.model_fields.get(part)
                if field is not None:
                    nxt.extend(_unwrap(field.annotation))
            elif origin is dict:
                key_t, val_t = typing.get_args(tp)
                if PLACEHOLDER.fullmatch(part) or part.strip('"'):
                    nxt.extend(_unwrap(val_t))
        if not nxt:
            return f"{'.'.join(walked) or 'params'} has no key {part!r}"
        if walked == ["models"] and not (PLACEHOLDER.fullmatch(part) or MODEL_NAME.match(part)):
            return f"{part!r} is not a model name"
        types_ = nxt
        walked.append(part)
    return None


# ---------------------------------------------------------------- collecting items


KEY_RE = re.compile(r"^((?:%s)(?:\.(?:<[^<>]+>|[A-Za-z0-9_\-]+|\*))+)" % "|".join(SECTIONS))
PY_M_RE = re.compile(r"(?:^|[\s;&|(/])python3?\s+-m\s+([A-Za-z_][\w.]*(?:<[^<>]+>)?)")
PY_SCRIPT_RE = re.compile(r"(?:^|[\s;&|(/])python3?\s+([\w./-]+\.py)\b")
PATH_RE = re.compile(r"^(?:%s)/[^\s`]*" % "|".join(PATH_PREFIXES))


def all_docs() -> list[Doc]:
    return [parse(p) for p in DOCS]


def code_items() -> list[Item]:
    return [it for d in all_docs() for it in (*d.spans, *d.blocks)]


def params_keys() -> list[Item]:
    found = []
    for d in all_docs():
        for it in d.spans:
            m = KEY_RE.match(it.text)
            if not m:
                continue
            key = m.group(1)
            if key.endswith(FILE_SUFFIXES) and not key.endswith(".*"):
                continue  # a file name such as figures.py, not a key
            if it.text[m.end():].startswith("("):
                continue  # a call such as models.setup_for(params, name), not a key
            found.append(Item(it.doc, it.line, key))
    return found


def dvc_lines() -> list[Item]:
    found = []
    for it in code_items():
        text = it.text.strip()
        if text.startswith("$ "):
            text = text[2:]
        # a command after an environment activation: `. .venv/bin/activate && dvc ...`
        for part in re.split(r"\s*&&\s*", text):
            # `dvc` alone names the program, `dvc.yaml` and `dvc_plots/` are files
            if re.match(r"dvc\s+\S", part):
                found.append(Item(it.doc, it.line, part))
    return found


def dvc_argv(line: str) -> list[str]:
    """The command line as the shell would pass it: comments dropped, `$(...)` replaced by a revision,
    `<m>`-style placeholders by a model of params.yaml."""
    line = re.sub(r"\$\([^)]*\)", "exp-a exp-b", line)
    line = PLACEHOLDER.sub(model_names()[0], line)
    argv = shlex.split(line, comments=True)
    return argv[1:]


@cache
def dvc_outs() -> set[str]:
    """Every output path dvc.yaml names (strings or one-key mappings)."""
    outs = set()
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        body = stage.get("do", stage)
        for kind in ("outs", "metrics", "plots"):
            for o in body.get(kind, []) or []:
                outs.add(o if isinstance(o, str) else next(iter(o)))
    return outs


# ---------------------------------------------------------------- tests


def test_the_manual_exists():
    names = {p.name for p in DOCS}
    for page in ("index.md", "pipeline.md", "measures.md", "evaluation.md", "sharing.md", "gpu.md",
                 "benchmarks.md", "development.md"):
        assert page in names, f"docs/{page} is missing"
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 105, f"README.md: {len(readme.splitlines())} lines; the front page stays about 100"
    # dated measurements live in docs/benchmarks.md; the front page states today's cost and links there
    assert not re.findall(r"`[0-9a-f]{7,40}`", readme), "README.md quotes a commit: a measurement belongs in docs/benchmarks.md"


def test_links_resolve():
    bad, n_links, n_anchors = [], 0, 0
    for d in all_docs():
        for it in d.links:
            target = it.text
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            n_links += 1
            file_part, _, anchor = target.partition("#")
            dest = (d.path.parent / file_part).resolve() if file_part else d.path
            if file_part and dest.is_relative_to(ROOT / "reports") and f"reports/{dest.name}" in dvc_outs():
                continue  # a DVC output (docs/results.md links the report): there after `dvc repro` or `dvc pull`
            if file_part and not dest.exists():
                bad.append(f"{it.where()}: link {target!r}: {file_part} does not exist")
                continue
            if anchor:
                n_anchors += 1
                if dest.suffix != ".md":
                    bad.append(f"{it.where()}: link {target!r}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    bad.append(f"{it.where()}: link {target!r}: no heading with anchor #{anchor} in "
                               f"{dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)
    assert n_links >= 60 and n_anchors >= 40, (n_links, n_anchors)


def test_python_modules_exist():
    bad, n, n_stages, n_scripts = [], 0, 0, 0
    for it in code_items():
        for module in PY_M_RE.findall(it.text):
            n += 1
            if PLACEHOLDER.search(module):  # `python -m stages.<name>`: the package must exist
                module = PLACEHOLDER.sub("", module).rstrip(".")
                if importlib.util.find_spec(module) is None:
                    bad.append(f"{it.where()}: python -m {module}...: no such package")
                continue
            try:
                spec = importlib.util.find_spec(module)
            except ModuleNotFoundError:
                spec = None
            if spec is None:
                bad.append(f"{it.where()}: python -m {module}: no such module")
                continue
            if module.startswith("stages."):
                n_stages += 1
                if module.split(".", 1)[1] not in stage_modules():
                    bad.append(f"{it.where()}: python -m {module}: no dvc.yaml stage runs it "
                               f"(stages: {sorted(stage_modules())})")
        for script in PY_SCRIPT_RE.findall(it.text):
            n_scripts += 1
            if not (ROOT / script).is_file():
                bad.append(f"{it.where()}: python {script}: no such file")
    assert not bad, "\n".join(bad)
    assert n >= 30 and n_stages >= 10 and n_scripts >= 10, (n, n_stages, n_scripts)


def test_dvc_commands_parse():
    from dvc.cli import DvcParserError, parse_args

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    handler = Collect()
    dvc_logger = logging.getLogger("dvc")
    dvc_logger.addHandler(handler)
    bad, n, n_keys = [], 0, 0
    try:
        for it in dvc_lines():
            n += 1
            try:
                argv = dvc_argv(it.text)
            except ValueError as e:
                bad.append(f"{it.where()}: {it.text!r}: {e}")
                continue
            handler.messages.clear()
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    args = parse_args(argv)
            except (DvcParserError, SystemExit):
                why = "; ".join(handler.messages) or "rejected"
                bad.append(f"{it.where()}: {it.text!r}: DVC's parser: {why}")
                continue
            for assignment in getattr(args, "set_param", None) or []:
                n_keys += 1
                key = assignment.split("=", 1)[0].lstrip("+~")  # Hydra's append (+), force (++) and delete (~)
                if (why := schema_error(key)) is not None:
                    bad.append(f"{it.where()}: {it.text!r}: -S {key}: {why}")
    finally:
        dvc_logger.removeHandler(handler)
    assert not bad, "\n".join(bad)
    assert n >= 60 and n_keys >= 20, (n, n_keys)


def test_params_keys_exist():
    keys = params_keys()
    bad = [f"{it.where()}: `{it.text}`: {why}" for it in keys if (why := schema_error(it.text)) is not None]
    assert not bad, "\n".join(bad)
    assert len(keys) >= 150, len(keys)


def test_repository_paths_exist():
    bad, n = [], 0
    for d in all_docs():
        for it in d.spans:
            m = PATH_RE.match(it.text)
            if not m:
                continue
            path = m.group(0).rstrip(".,:;)")
            n += 1
            pattern = PLACEHOLDER.sub("*", path)
            # shell braces: profiles/{cpu,gpu}.yaml
            alternatives = [pattern]
            while any("{" in p for p in alternatives):
                expanded = []
                for p in alternatives:
                    b = re.search(r"\{([^{}]*)\}", p)
                    if not b:
                        expanded.append(p)
                        continue
                    expanded += [p[:b.start()] + alt + p[b.end():] for alt in b.group(1).split(",")]
                alternatives = expanded
            for p in alternatives:
                if not glob.glob(str(ROOT / p)):
                    bad.append(f"{it.where()}: `{it.text}`: {p} does not exist in the repository")
    assert not bad, "\n".join(bad)
    assert n >= 40, n


@pytest.mark.parametrize("key, ok", [
    ("evaluate.batch_size", True), ("models.<m>.layers", True), ("models.smollm2-135m.arm.pmin", True),
    ("figures.charts.cross-model.models", True), ("evaluate.vllm.tensor_parallel_size", True),
    ("figures.*", True), ("dataset.fields.problem", True), ("models.<m>.source.repo_id", True),
    ("evaluate.nosuch", False), ("models.<m>.colour", False), ("prompt.mless.count.extra", False),
    ("models.Bad Name.layers", False),
])
def test_schema_walk(key, ok):
    """The schema walk itself: it accepts real keys and refuses made-up ones."""
    assert (schema_error(key) is None) == ok, schema_error(key)


@pytest.mark.parametrize("heading, anchor", [
    ("MATH-500 accuracy (`evaluate@<model>`)", "math-500-accuracy-evaluatemodel"),
    ("Sampling: pass@k, maj@n and diversity (`evaluate.sampling`)",
     "sampling-passk-majn-and-diversity-evaluatesampling"),
    ("A model of the paper's shape (Qwen2.5-Coder-1.5B-Instruct)",
     "a-model-of-the-papers-shape-qwen25-coder-15b-instruct"),
])
def test_slug(heading, anchor):
    assert slug(heading.replace("`", "")) == anchor
