"""What every part of the params schema shares: the project's paths, the conditions, the strict base class
and the list checks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, model_validator


ROOT = Path(__file__).resolve().parents[2]  # the project: meaningless_tokens/config/ is two folders below it
PARAMS_FILE = Path("params.yaml")  # relative: DVC and the CLI run from the project root
PROFILES_DIR = ROOT / "profiles"

# arm: the `none` prompt with the paper's activation redistribution on layer 0's MLP (meaningless_tokens/arm/)
CONDITIONS = ("none", "mless", "mful", "arm")
Condition = Literal[CONDITIONS]
# A family is a model_type of transformers (`models.<name>.family`; null: the model's own). Some
# families also accept these model_types (gemma-3-4b-it is the multimodal wrapper around gemma3_text).
# Which model_types are supported is decided when a model is prepared: every decoder-only causal LM
# of the installed transformers whose attention passes the probe (meaningless_tokens/models/probe.py, meaningless_tokens/capture.py).
FAMILIES = {"gemma3": ("gemma3", "gemma3_text"), "gemma3_text": ("gemma3", "gemma3_text")}

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# model names become DVC stage keys (extract@<name>) and file names: DVC allows only [A-Za-z0-9_-]
ModelName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64)]


# a pair written as a YAML list: a tuple accepts a list only where strictness is lifted, so lift it for the
# container alone and keep both numbers strict
Pair = Annotated[tuple[StrictFloat, StrictFloat], Field(strict=False)]


def duplicated(v: list) -> bool:
    """Whether a list names an item twice (every list key of the params must not)."""
    return len(set(v)) != len(v)


def unique(v: list) -> list:
    """`v` itself, or a ValueError naming the list if an item repeats."""
    if duplicated(v):
        raise ValueError(f"duplicates in {v}")
    return v


def conditions_with_none(v: list[str], why: str) -> list[str]:
    """A list of conditions without duplicates that includes `none`, in the canonical order."""
    unique(v)
    if "none" not in v:
        raise ValueError(f"must include 'none' ({why})")
    return [c for c in CONDITIONS if c in v]


def sorted_unique(v: list) -> list:
    """A list key whose items must differ (layers, counts), sorted."""
    return sorted(unique(v))


class Strict(BaseModel):
    # strict: a count is an int (not `true`, not `2.0`), a flag a bool (not 1), a number a number (an int is one);
    # YAML gives every type as written, so nothing is converted behind the user's back
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(f"unknown key(s) {unknown}; allowed keys: {sorted(cls.model_fields)}")
        return data


def resolve_path(params_file: Path, p: str) -> Path:
    """A path written in the params file `params_file`: relative ones are relative to its folder."""
    path = Path(p).expanduser()
    return path if path.is_absolute() else params_file.resolve().parent / path
