"""Metrics files (`metrics/<kind>/<model>.json`, `metrics/timing/<stage>-<model>.json`, `metrics/verdict.json`):
each records the stage and model that wrote it, and reading one checks both against its place and refuses a NaN
or an infinity, naming the file and the key, as `read_h5` does for an artifact."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from meaningless_tokens.errors import ArtifactError, NonFiniteError
from meaningless_tokens.store.files import write_json_atomic

# metrics/<folder>/<model>.json -> the stage that writes it, where the folder is not named for its stage
FOLDER_STAGE = {"accuracy": "evaluate"}


def origin(path: str | os.PathLike) -> tuple[str, str | None] | None:
    """(stage, model) a metrics file at `path` must have been written by, from its place; None where the place
    names neither (a file outside metrics/)."""
    path = Path(path)
    if path.parent.name == "metrics" and path.name == "verdict.json":
        return "report", None
    if path.parent.parent.name != "metrics" or path.suffix != ".json":
        return None
    if path.parent.name == "timing":
        stage, sep, model = path.stem.partition("-")  # stage names hold no "-" (dvc.yaml: arm_tuning)
        return (stage, model) if sep else None
    return FOLDER_STAGE.get(path.parent.name, path.parent.name), path.stem


def first_non_finite(value, key: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first NaN or infinity in a JSON value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (key or "<root>", value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = first_non_finite(v, f"{key}.{k}" if key else str(k))
        if found:
            return found
    return None


def write_metrics(path: str | os.PathLike, data: dict) -> None:
    """A metrics file with its stage and model (from its place, `origin`), atomically; a NaN or infinity is refused
    (NonFiniteError naming the file and the key), as `put` refuses one in an artifact."""
    bad = first_non_finite(data)
    if bad:
        raise NonFiniteError(f"{path}: {bad[0]}: non-finite value {bad[1]!r}")
    stamp = origin(path)
    if stamp is not None:
        data = {**data, "stage": stamp[0], **({"model": stamp[1]} if stamp[1] is not None else {})}
    write_json_atomic(path, data)


def read_metrics(path: str | os.PathLike) -> dict:
    """A metrics file, refused in one ArtifactError naming the file when it is missing, not JSON, not an object,
    written by another stage or for another model than its place says, or holding a NaN or infinity (then naming
    the key); each line ends with the command that writes the file again."""
    path = Path(path)
    stamp = origin(path)
    hint = "dvc repro" if stamp is None else f"dvc repro {stamp[0]}" + (f"@{stamp[1]}" if stamp[1] else "")
    if not path.is_file():
        raise ArtifactError(f"{path}: missing (run: {hint})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(data).__name__}")
    bad = first_non_finite(data)
    if bad:
        raise NonFiniteError(f"{path}: {bad[0]}: non-finite value {bad[1]!r}; no stage writes one: the file was "
                             f"changed after its stage wrote it (run: {hint})")
    if stamp is not None:
        stage, model = stamp
        found = (data.get("stage"), data.get("model"))
        if found[0] is None:
            raise ArtifactError(f"{path}: records no stage (written by an earlier version?); run: {hint}")
        if found[0] != stage:
            raise ArtifactError(f"{path}: written by stage '{found[0]}', expected '{stage}' (another stage's file "
                                f"copied in place?); run: {hint}")
        if model is not None and found[1] != model:
            raise ArtifactError(f"{path}: written for model '{found[1]}', read as model '{model}' (another model's "
                                f"file copied in place?); run: {hint}")
    return data
