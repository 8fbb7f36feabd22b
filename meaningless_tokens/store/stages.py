"""dvc.yaml read as the stages' own definition: a stage's deps (whose code files it hashes into its provenance) and
its params list."""

from __future__ import annotations


from meaningless_tokens.config import ROOT
from meaningless_tokens.errors import StageError

DVC_YAML = ROOT / "dvc.yaml"
CODE_PATHS = ("stages", "meaningless_tokens", "pyproject.toml")  # the code: run_info's git_commit is the last commit touching it
CODE_DIRS = ("stages/", "meaningless_tokens/")  # a dvc.yaml dep under one of these is code


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


def dvc_stage(stage: str) -> dict:
    """dvc.yaml's definition of `stage` (a foreach stage's `do` part, with `foreach` beside it)."""
    import yaml

    try:
        spec = yaml.safe_load(DVC_YAML.read_text())["stages"][stage]
        return {**(spec.get("do") or spec), "foreach": spec.get("foreach")}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise StageError(f"{DVC_YAML}: stages.{stage}: cannot read the stage ({type(e).__name__}: {e})") from None
