"""The dataset: benchmark loading (MATH-500, the AIME files, any local JSONL/Parquet/CSV; sha256-checked), the seeded
subsets the stages run on, and the `/problems` group that says which problems an artifact's samples are."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens.config import FIELDS, ROOT, Dataset, DatasetFields, Extract, resolve_path
from meaningless_tokens.errors import ConfigError, DatasetError
from meaningless_tokens.store import put, put_texts


# The vendored benchmarks (data/<name>/, each with its SOURCE.md): file, sha256 and column names.
VENDORED = {
    "math500": ("data/math500/test.jsonl", "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
                DatasetFields(problem="problem", answer="answer", solution="solution", level="level",
                              subject="subject", id="unique_id")),
    # AIME 2022-2024, 90 problems, as the paper's code evaluates "AIME2024" (filter {field: url, contains:
    # 2024_AIME} keeps the 30 of 2024)
    "aime2024": ("data/aime2024/train-00000-of-00001.parquet",
                 "025484a99fea498e7d0c3b0ee42afcbec0176405c19c5dbf557b9f6ca6445675",
                 DatasetFields(problem="problem", answer="answer", solution="solution", id="id")),
    "aime2025": ("data/aime2025/aime2025.jsonl", "dee94372847a43a5eb6b0a439047efa82f3804db221a55dc640053425315dd4b",
                 DatasetFields(problem="question", answer="answer")),
}


@dataclass(frozen=True)
class Problem:
    index: int          # 0-based row of the file (before any filter): the stable prompt id
    unique_id: str      # the id field, else str(index)
    problem: str
    solution: str | None  # None where the file has no solution field
    answer: str
    subject: str | None   # None where the file has no subject field
    level: int | None     # None where the file has no level field

    def row(self) -> dict:
        """The canonical fields: problem, answer, solution, level, subject, id."""
        d = asdict(self)
        return {k: d["unique_id" if k == "id" else k] for k in FIELDS}


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset params with the benchmark's defaults filled in."""

    benchmark: str
    path: Path
    sha256: str
    format: str
    fields: DatasetFields
    filter: dict | None
    params_file: Path   # the params file it came from: errors name it (not in describe())
    sha256_key: str     # the params key the expected sha256 comes from, for the mismatch's message

    @property
    def label(self) -> str:
        """The benchmark's name on charts and in the report."""
        name = {"math500": "MATH-500", "aime2024": "AIME 2022-2024", "aime2025": "AIME 2025"}.get(
            self.benchmark, self.path.stem)
        if self.filter:
            f = self.filter
            name += f" ({f['field']} {'holds' if f['contains'] is not None else '='} {f['contains'] or f['equals']})"
        return name

    def describe(self) -> dict:
        """The artifacts' `dataset_file`: the file and how it is read (not where the params came from)."""
        return {"benchmark": self.benchmark, "label": self.label, "path": self.path.name, "sha256": self.sha256, "format": self.format,
                "fields": self.fields.model_dump(), "filter": self.filter}


def dataset_spec(cfg: Dataset, params_file: Path) -> DatasetSpec:
    """`cfg` (the params' `dataset`) with the benchmark's defaults filled in; relative paths are relative to
    `params_file`'s folder, which errors name."""
    path, sha, fields = VENDORED.get(cfg.benchmark, (None, None, None))
    # the vendored files ship with the code: relative to the project root, not to the params file
    path = resolve_path(params_file, cfg.path) if cfg.path else ROOT / path
    fmt = cfg.format
    if fmt == "auto":
        fmt = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(f"{params_file}: dataset.format: cannot tell the format of {path} from its extension; "
                              "set jsonl, parquet or csv")
    return DatasetSpec(cfg.benchmark, path, cfg.sha256 or sha, fmt, cfg.fields or fields,
                       cfg.filter.model_dump() if cfg.filter else None, params_file,
                       "dataset.sha256" if cfg.sha256 else f"dataset.benchmark: {cfg.benchmark}")


def _columns(data: bytes, fmt: str, path: Path) -> tuple[list[str], list[dict]]:
    """(column names, rows) of a JSONL, CSV or Parquet file's bytes; every value as the file holds it."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(pa.BufferReader(data))
        except pa.ArrowInvalid as e:
            raise DatasetError(f"{path}: not a readable Parquet file ({e})") from None
        return list(table.column_names), table.to_pylist()
    text = data.decode("utf-8")
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        return list(reader.fieldnames or []), list(reader)
    rows, names = [], {}
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{i + 1}: malformed JSON line ({e})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path}:{i + 1}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
        names.update(dict.fromkeys(row))
    return list(names), rows


def _text(v) -> str:
    return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def load_problems(spec: DatasetSpec) -> tuple[list[Problem], str]:
    """The dataset's problems (after `dataset.filter`) and the file's sha256, refusing a file whose sha256
    differs from the expected one; a missing file or column is one line naming the key and the file."""
    path, f = spec.path, spec.params_file
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise DatasetError(f"{path}: dataset file not found ({f}: dataset.path)") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise DatasetError(f"{path}: sha256 {digest} != expected {spec.sha256} ({f}: {spec.sha256_key}); a vendored "
                           f"benchmark must be byte-identical to its canonical copy (see data/*/SOURCE.md)")
    columns, rows = _columns(data, spec.format, path)
    mapping = spec.fields.model_dump()
    for key, col in [*mapping.items(), *([("filter.field", spec.filter["field"])] if spec.filter else [])]:
        if col is not None and col not in columns:
            hint = "" if key in ("problem", "answer", "filter.field") else "; null if the file has none"
            where = f"dataset.{key}" if key == "filter.field" else f"dataset.fields.{key}"
            raise DatasetError(f"{path}: no column {col!r} ({f}: {where}); the file's columns: {columns}{hint}")
    problems = []
    for i, row in enumerate(rows):
        if spec.filter:
            v = row.get(spec.filter["field"])
            v = "" if v is None else _text(v)
            if not (spec.filter["contains"] in v if spec.filter["contains"] is not None else v == spec.filter["equals"]):
                continue
        got = {k: (None if col is None else row.get(col)) for k, col in mapping.items()}
        for k in ("problem", "answer"):
            if got[k] is None or _text(got[k]).strip() == "":
                raise DatasetError(f"{path}: row {i + 1} has no {mapping[k]!r} ({f}: dataset.fields.{k})")
        level = got["level"]
        if level is not None:
            try:
                level = int(level)
            except (TypeError, ValueError):
                raise DatasetError(f"{path}: row {i + 1}: level {level!r} is not an integer "
                                   f"({f}: dataset.fields.level; null if the file has no integer level)") from None
        problems.append(Problem(
            index=i, unique_id=str(i) if got["id"] is None else _text(got["id"]), problem=_text(got["problem"]),
            solution=None if got["solution"] is None else _text(got["solution"]), answer=_text(got["answer"]),
            subject=None if got["subject"] is None else _text(got["subject"]), level=level))
    if not problems:
        raise DatasetError(f"{path}: no row left after the filter ({f}: dataset.filter: {spec.filter})")
    return problems, digest


load_math500 = load_problems  # the name every stage used while MATH-500 was the only benchmark


def require_field(spec: DatasetSpec, problems: list[Problem], field: str, stage: str) -> None:
    """One line naming the key and the file when a stage needs a field (solution, level, subject) the
    dataset lacks."""
    missing = next((p for p in problems if getattr(p, field) is None), None)
    if missing is not None:
        raise DatasetError(f"{spec.path}: row {missing.index + 1} has no '{field}': {stage} needs it "
                           f"({spec.params_file}: dataset.fields.{field})")


def select_problems(problems: list[Problem], n: int | None, seed: int, key: str = "n_samples") -> list[Problem]:
    """A seeded subset of `n` problems, stratified by level (largest-remainder allocation), in dataset order;
    all problems when `n` is None. Without a level field (the AIME files) the subset is a seeded uniform one."""
    if n is None or n >= len(problems):
        if n is not None and n > len(problems):
            raise DatasetError(f"{key}: asked for {n} problems; the dataset has {len(problems)} (null: all of them)")
        return list(problems)
    rng = np.random.default_rng(seed)
    if any(p.level is None for p in problems):
        chosen = rng.permutation(len(problems))[:n]
        return [problems[k] for k in sorted(chosen)]
    levels = sorted({p.level for p in problems})
    by_level = {lv: [p for p in problems if p.level == lv] for lv in levels}
    quota = {lv: n * len(by_level[lv]) / len(problems) for lv in levels}
    take = {lv: int(q) for lv, q in quota.items()}
    for lv in sorted(levels, key=lambda lv: (take[lv] - quota[lv], lv))[: n - sum(take.values())]:
        take[lv] += 1
    chosen = [p for lv in levels for p in rng.permutation(np.array(by_level[lv], dtype=object))[: take[lv]]]
    return sorted(chosen, key=lambda p: p.index)


def extraction_problems(spec: DatasetSpec, cfg: Extract) -> tuple[list[Problem], str]:
    """The extraction's subset (cfg: the params' `extract`, its n_samples and seed) and the dataset's sha256: what
    extract and activations both run on, the same problems in the same order."""
    problems, data_sha = load_problems(spec)
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "extract.n_samples")
    if not chosen:
        raise ConfigError(f"{spec.params_file}: extract.n_samples: the subset is empty")
    return chosen, data_sha


def put_problems(f, chosen: list[Problem], with_answer: bool = False) -> None:
    """The `/problems` group of an artifact: which problems its samples are, in sample order."""
    p = f.create_group("problems")
    put(p, "index", np.array([q.index for q in chosen], dtype=np.int32))
    # a dataset's texts may hold what HDF5 strings cannot (NUL): put_texts stores them all (store.read_texts)
    put_texts(p, "unique_id", [q.unique_id for q in chosen], compress=False)
    levels = [q.level for q in chosen]
    put(p, "level", np.array([-1 if lv is None else lv for lv in levels], dtype=np.int8),
        **({"note": "-1: the dataset has no level field"} if None in levels else {}))
    put_texts(p, "subject", [q.subject or "" for q in chosen], compress=False)
    if with_answer:
        put_texts(p, "answer", [q.answer for q in chosen], compress=False)
