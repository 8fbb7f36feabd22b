"""dvc.yaml read as the stages' own definition: the stages and their order, what each declares it writes, a stage's
deps (whose code files it hashes into its provenance) and its params list, as DVC resolves them (YAML anchors and
aliases, `params.yaml: [...]` entries)."""

from __future__ import annotations

import copy
import functools
import re

from meaningless_tokens.config import ROOT, yaml12
from meaningless_tokens.errors import ConfigError, StageError

DVC_YAML = ROOT / "dvc.yaml"
CODE_PATHS = ("stages", "meaningless_tokens", "pyproject.toml")  # the code: run_info's git_commit is the last commit touching it
CODE_DIRS = ("stages/", "meaningless_tokens/")  # a dvc.yaml dep under one of these is code
PARAMS_FILE = "params.yaml"
# the model a foreach stage runs for: the only interpolation the stages expand themselves (view.params_keys)
_OTHER_INTERPOLATION = re.compile(r"\$\{(?!key\}|item\})")


def code_hashes(stage: str) -> dict[str, str]:
    """{path: sha256} of every code file the stage declares as a dependency in dvc.yaml.

    Code deps are those under `stages/` and `meaningless_tokens/` (a folder dep counts each file in it); data
    deps (dataset, artifacts) are recorded by the stages themselves. These hashes are what dvc.lock records for the
    stage's code, so an artifact carrying them is a function of the stage's declared inputs only."""
    import hashlib

    deps = dvc_stage(stage).get("deps") or []
    files = []
    for dep in deps:
        path = ROOT / dep
        if not str(dep).startswith(CODE_DIRS):
            continue
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        elif path.is_file():
            files.append(path)
        else:
            raise StageError(f"{DVC_YAML}: stages.{stage}.deps: {dep} does not exist")
    return {p.relative_to(ROOT).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


@functools.lru_cache(maxsize=4)
def _stages(text: str) -> dict:
    """The file's `stages`, aliases resolved (a stage reads dvc.yaml several times: parsed once per content)."""
    return yaml12.load(text)["stages"]


def _all_stages() -> dict:
    try:
        stages = _stages(DVC_YAML.read_text())
        if not isinstance(stages, dict):
            raise TypeError(f"a {type(stages).__name__}, not a mapping")
        return stages
    except (OSError, yaml12.YAMLError, ConfigError, KeyError, TypeError) as e:
        raise StageError(f"{DVC_YAML}: stages: cannot read them ({type(e).__name__}: {e})") from None


def stage_names() -> tuple[str, ...]:
    """dvc.yaml's stages in its order (it lists each after the stages whose outputs it reads)."""
    return tuple(_all_stages())


def declared_outputs(stage: str) -> list[str]:
    """The files `stage` declares in dvc.yaml (its `outs` and `metrics`), a model's `${key}` / `${item}` as `{name}`:
    the form of store.PATHS' templates."""
    spec = _all_stages()[stage]
    body = spec.get("do") or spec
    entries = (body.get("outs") or []) + (body.get("metrics") or [])
    return [(next(iter(e)) if isinstance(e, dict) else e).replace("${key}", "{name}").replace("${item}", "{name}")
            for e in entries]


def dvc_stage(stage: str) -> dict:
    """dvc.yaml's definition of `stage` (a foreach stage's `do` part, with `foreach` beside it), `params` as the flat
    list of params.yaml's dotted keys DVC tracks for it (`${key}` / `${item}` left for the model name)."""
    try:
        spec = _stages(DVC_YAML.read_text())[stage]
        body = copy.deepcopy(spec.get("do") or spec)
        foreach = spec.get("foreach")
    except (OSError, yaml12.YAMLError, ConfigError, KeyError, TypeError, AttributeError) as e:
        raise StageError(f"{DVC_YAML}: stages.{stage}: cannot read the stage ({type(e).__name__}: {e})") from None
    body["params"] = _params_keys(stage, body.get("params") or [])
    for dep in body.get("deps") or []:
        _check_expanded(stage, "deps", dep)
    return {**body, "foreach": foreach}


def _params_keys(stage: str, entries: list) -> list[str]:
    """DVC's reading of a `params:` list: a string is a key of params.yaml, `{params.yaml: [keys]}` adds those keys
    (how an alias adds a group of keys: a YAML alias cannot splice a list into another)."""
    keys = []
    for entry in entries:
        if isinstance(entry, str):
            keys.append(entry)
            continue
        if not isinstance(entry, dict):
            raise StageError(f"{DVC_YAML}: stages.{stage}.params: {entry!r} is neither a key nor a mapping")
        for file, listed in entry.items():
            if file != PARAMS_FILE or not isinstance(listed, list) or not listed:
                raise StageError(f"{DVC_YAML}: stages.{stage}.params: {file}: {listed!r}; the stages read "
                                 f"{PARAMS_FILE} only, and a group lists its keys (DVC tracks a bare file whole)")
            keys += listed
    for key in keys:
        _check_expanded(stage, "params", key)
    return keys


def _check_expanded(stage: str, field: str, value) -> None:
    """Refuse what the stages cannot expand as DVC would (`vars`, params.yaml values): a key or dep read unexpanded
    would be another one than DVC tracks."""
    if not isinstance(value, str) or _OTHER_INTERPOLATION.search(value):
        raise StageError(f"{DVC_YAML}: stages.{stage}.{field}: {value!r}; the stages expand only ${{key}} and "
                         f"${{item}} (the model's name): write the key or path out")
