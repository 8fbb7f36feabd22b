"""Loading params.yaml: YAML with unique keys, the schema, the checks across sections; every error names the
file, the dotted key, the bad value and what is allowed."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from meaningless_tokens.config.base import PARAMS_FILE
from meaningless_tokens.config.charts import check_charts
from meaningless_tokens.config.model import ModelSpec
from meaningless_tokens.config.schema import Params
from meaningless_tokens.errors import ConfigError


def _format_error(path: Path, err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    # discriminated unions add the tag to the location; drop it so the key is the file's key
    loc = re.sub(r"\.(pypi_gguf|gguf_file|local_dir|hf)(?=\.|$)", "", loc)
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {got!r})"
    if not loc and re.match(r"^[a-z_]+(\.[a-z_]+)*: ", msg):  # a check across sections names its own key
        return f"{path}: {msg}"
    return f"{path}: {loc or '<root>'}: {msg}{shown}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML says keys are unique; PyYAML keeps the last,
    DVC refuses the file: both stages and `config check` refuse it as DVC does)."""

    def construct_document(self, node):
        self._prefix = {}  # id of each mapping node -> its dotted key ("likelihood."), named in the error

        def walk(n, prefix):
            if isinstance(n, yaml.MappingNode):
                self._prefix[id(n)] = prefix
                for k, v in n.value:
                    walk(v, f"{prefix}{k.value}." if isinstance(k, yaml.ScalarNode) else prefix)
            elif isinstance(n, yaml.SequenceNode):
                for k, v in enumerate(n.value):
                    walk(v, f"{prefix}{k}.")

        walk(node, "")
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(f"{self._prefix.get(id(node), '')}{key}: given twice (lines {seen[key] + 1} and "
                                  f"{key_node.start_mark.line + 1}); YAML keys are unique: keep one")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_params(path: str | os.PathLike = PARAMS_FILE) -> Params:
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: params file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
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
