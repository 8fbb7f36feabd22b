"""Loading params.yaml: YAML 1.2 as DVC reads it, with unique keys (yaml12), the schema, the checks across sections;
every error names the file, the dotted key, the bad value and what is allowed."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import ValidationError

from meaningless_tokens.config import yaml12
from meaningless_tokens.config.base import PARAMS_FILE
from meaningless_tokens.config.charts import check_charts
from meaningless_tokens.config.model import ModelSpec
from meaningless_tokens.config.schema import Params
from meaningless_tokens.errors import ConfigError


def _format_error(path: Path, err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    # discriminated unions add the tag to the location; drop it so the key is the file's key
    loc = re.sub(r"\.(pypi_gguf|gguf_file|local_dir|hf)(?=\.|$)", "", loc)
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # the key is the tag's own: source.kind
        loc = f"{loc}.{err['ctx']['discriminator'].strip(chr(39))}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {got!r})"
    if not loc and re.match(r"^[a-z_]+(\.[a-z_]+)*: ", msg):  # a check across sections names its own key
        return f"{path}: {msg}"
    return f"{path}: {loc or '<root>'}: {msg}{shown}"


def load_params(path: str | os.PathLike = PARAMS_FILE) -> Params:
    path = Path(path)
    try:
        raw = yaml12.load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: params file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml12.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        params = Params.model_validate(raw)
    except ValidationError as e:
        raise ConfigError("\n".join(_format_error(path, err) for err in e.errors())) from None
    params._file = path
    check_charts(params)
    return params


def model_spec(params: Params, name: str) -> ModelSpec:
    if name not in params.models:
        raise ConfigError(f"{params.file}: models.{name}: unknown model; configured: {sorted(params.models)}")
    return params.models[name]
