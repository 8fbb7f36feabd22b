"""The tests' params, built in one place: a params or profile file of the project, a profile laid over it, sections
replaced (tiny local models in place of the shipped ones), paths made absolute for a params file outside the project.

tests/conftest.py's `write_params` (the stage tests), tests/dvc_repo.py's throwaway DVC projects (the CPU profile with
the tests' own, tests/profile.yaml) and tests/dry_run.py's GPU dry run (profiles/gpu.yaml with tiny stand-ins) all
build their params here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from meaningless_tokens.config import yaml12

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "tests" / "profile.yaml"  # the tests' own profile, laid over profiles/cpu.yaml


def read(file: str | Path = "params.yaml") -> dict:
    """A params or profile file of the project (`file` relative to its root) as the stages and DVC read it."""
    return yaml12.load((ROOT / file).read_text())  # YAML 1.2 (`on` a string)


def overlay(base: dict, over: dict) -> dict:
    """`base` with `over`'s keys laid over it, section by section (a mapping merges, anything else replaces)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = overlay(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def tiny_model(family: str, path: Path, **spec) -> dict:
    """A models entry for a tiny local model of `family` saved in `path` (tests/tiny.py), `spec`'s keys added."""
    return {"display_name": f"Tiny {family}", "family": family, "source": {"kind": "local_dir", "path": str(path)},
            "layers": [0, 1, 2], "heads": "all", **spec}


def spelled_out(spec: dict) -> dict:
    """A model entry with every key dvc.yaml lists, the schema's defaults where `spec` has none: as DVC (and so
    every stage's command) needs it."""
    from meaningless_tokens.config import dvc_model_defaults

    return {**dvc_model_defaults(), **spec}


def build(base: str | Path | dict = "params.yaml", over: dict | None = None, absolute: bool = False,
          **sections) -> dict:
    """The params: `base` (a file of the project, or a dict, copied), `over` laid over it key by key (overlay),
    `sections` replacing whole top-level sections (`models=`). An evaluate or likelihood list naming a model the
    params do not have (tiny models replaced the listed ones) becomes every model. `absolute`: the dataset and
    mful text paths made absolute, for a params file outside the project."""
    raw = copy.deepcopy(base) if isinstance(base, dict) else read(base)
    if absolute:
        if raw["dataset"].get("path"):
            raw["dataset"]["path"] = str(ROOT / raw["dataset"]["path"])
        if "mful" in raw.get("prompt", {}):
            raw["prompt"]["mful"]["text_file"] = str(ROOT / raw["prompt"]["mful"]["text_file"])
    if over:
        raw = overlay(raw, over)
    raw.update(sections)
    for stage in ("evaluate", "likelihood"):
        chosen = raw.get(stage, {}).get("models")
        if chosen and not set(chosen) <= set(raw.get("models", {})):
            raw[stage]["models"] = list(raw.get("models", {}))  # every model
    return raw


def write(path: Path, raw: dict) -> Path:
    """Write the params `raw` to `path` (keys in their order) and return it."""
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
