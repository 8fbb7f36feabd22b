"""Checks beyond the schema: a model's facts (its config's family, layers, heads) once it is prepared, and what a
run through DVC needs (every key a stage lists spelled out, the model lists, the files named)."""

from __future__ import annotations

from pydantic import BaseModel

from meaningless_tokens.config import yaml12
from meaningless_tokens.config.base import FAMILIES, PROFILES_DIR, ROOT, resolve_path
from meaningless_tokens.config.charts import check_chart_facts
from meaningless_tokens.config.loading import model_spec
from meaningless_tokens.config.model import ModelSpec
from meaningless_tokens.config.schema import Params
from meaningless_tokens.errors import ConfigError


def check_model_facts(params: Params, name: str, facts: dict) -> None:
    """Checks that need the model's config: family, layer and head indices."""
    spec = model_spec(params, name)
    where = f"{params.file}: models.{name}"
    if spec.family is not None:
        allowed_types = FAMILIES.get(spec.family, (spec.family,))
        if facts["model_type"] not in allowed_types:
            raise ConfigError(
                f"{where}.family: '{spec.family}' expects model_type {list(allowed_types)}, "
                f"but the model's config says '{facts['model_type']}' (or set family: null)"
            )
    n_layers, n_heads = facts["num_layers"], facts["num_heads"]
    bad = [layer for layer in spec.layers if layer >= n_layers]
    if bad:
        raise ConfigError(f"{where}.layers: {bad} out of range; the model has {n_layers} layers (allowed 0..{n_layers - 1})")
    if spec.heads != "all":
        bad = [h for h in spec.heads if h >= n_heads]
        if bad:
            raise ConfigError(
                f"{where}.heads: {bad} out of range; the model has {n_heads} query heads (allowed 0..{n_heads - 1})"
            )
    check_chart_facts(params, name, n_layers, n_heads)


# Every model key but display_name is listed by some stage in dvc.yaml (tests/test_config.py checks the two agree),
# and DVC refuses to run a stage whose listed key is missing, defaults or not: each entry spells them out.
DVC_MODEL_KEYS = tuple(k for k in ModelSpec.model_fields if k != "display_name")


def dvc_model_defaults() -> dict:
    """{key: the schema's default, as params.yaml writes it} of every key dvc.yaml lists but `source` (required)."""
    out = {}
    for k in DVC_MODEL_KEYS:
        if k != "source":
            value = ModelSpec.model_fields[k].get_default(call_default_factory=True)
            out[k] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def check_spelled_out(params: Params, names: list[str] | None = None) -> None:
    """Refuse a model entry (of `names`, default all) that lacks a key dvc.yaml lists, naming the `-S` flags (the
    schema's defaults) and the command that complete it. Every stage's command runs this for its model, and
    `config check` for all: the model's prepare stage lists the entry whole and runs first, so this is the first error
    a `dvc exp run -S '+models.<name>...'` with only the required keys meets, not DVC's, one stage at a time. Code that
    calls the stages in-process, without DVC, may leave the defaults out."""
    path = params.file
    for name, spec in params.models.items():
        if names is not None and name not in names:
            continue
        # the keys the file gave (pydantic's fields_set), not those the schema's defaults filled in
        missing = [k for k in DVC_MODEL_KEYS if k not in spec.model_fields_set]
        if not missing:
            continue
        defaults = dvc_model_defaults()
        flags = " ".join(f"-S '+models.{name}.{k}={_flow(defaults[k])}'" for k in missing)
        raise ConfigError(
            f"{path}: models.{name}: {', '.join(missing)} missing; DVC needs every key the stages list "
            f"(dvc.yaml), defaults included. Add them with their defaults: dvc exp run {flags} "
            f"(or write the whole entry: mless add-model {name} --local DIR | --hf ORG/NAME --revision COMMIT "
            f"| --gguf FILE; docs/your-model.md)")


def _flow(value) -> str:
    """A default as `dvc exp run -S` reads it (YAML flow style, one line)."""
    return yaml12.flow(value)


def check_files(p: Params) -> None:
    """Every file the params name exists (a stage would stop on it later, after minutes of work)."""
    named = [("dataset.path", p.dataset.path), ("prompt.mful.text_file", p.prompt.mful.text_file)]
    named += [(f"models.{n}.source.path", m.source.path) for n, m in p.models.items()
              if m.source.kind in ("local_dir", "gguf_file")]
    # a profile's paths are relative to the project root, where `use` copies it
    base = ROOT / "params.yaml" if p.file.resolve().parent == PROFILES_DIR.resolve() else p.file
    for key, value in named:
        where = resolve_path(base, str(value)) if value else None
        if where and not where.exists():
            raise ConfigError(f"{p.file}: {key}: {where} does not exist")

