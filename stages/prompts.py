"""MATH-500 loading (sha256-checked) and prompt conditions."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from stages.config import Params

MATH500_KEYS = ("problem", "solution", "answer", "subject", "level", "unique_id")


class DatasetError(Exception):
    """The dataset file is missing, altered or malformed; the message names the file."""


@dataclass(frozen=True)
class Problem:
    index: int          # 0-based line number in test.jsonl: the stable prompt id
    unique_id: str
    problem: str
    solution: str
    answer: str
    subject: str
    level: int


def load_math500(params: Params) -> tuple[list[Problem], str]:
    """All 500 problems and the file's sha256, refusing a file that differs from params' sha256."""
    path = params.resolve(params.dataset.path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: dataset file not found ({params.file}: dataset.path)") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != params.dataset.sha256:
        raise DatasetError(
            f"{path}: sha256 {digest} != expected {params.dataset.sha256} ({params.file}: dataset.sha256); "
            "the vendored MATH-500 must be byte-identical to the canonical copy (see data/math500/SOURCE.md)"
        )
    problems = []
    for i, line in enumerate(data.decode("utf-8").splitlines()):
        try:
            row = json.loads(line)
            problems.append(Problem(index=i, **{k: row[k] for k in MATH500_KEYS}))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DatasetError(f"{path}:{i + 1}: malformed row ({type(e).__name__}: {e})") from None
    return problems, digest
