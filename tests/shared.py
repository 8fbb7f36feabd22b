"""What a test run builds once and every test worker shares: the tiny models and the tiny pipeline.

Under pytest-xdist each worker is a process of its own, so a session fixture would run once per worker; `once`
builds into the run's common temporary folder (pytest's base temp's parent, `pytest-N/`, which the workers'
`popen-gwK/` folders sit in) under a file lock: the first worker to ask builds, a second one waits for it and
reads the same folder. Without xdist the folder is the run's own base temp.

The tiny pipeline (`pipeline`): a throwaway git + DVC copy of the project (tests/dvc_repo.py) with two tiny local
models, `tiny-a` (llama) and `tiny-b` (qwen2), through one `dvc repro` on the tests' profile, committed. A test
that needs a repository takes `copy_of_pipeline`: the whole folder copied (git, DVC cache, outputs, HOME and model
cache), so whatever it runs or breaks there touches no other test; a fraction of a second, not a `dvc repro`. A second
build (`copy_of_pipeline(..., experiment=True)`), from a copy of the first, runs one experiment there (SPAN0: the
span length 0, every model's extraction and evaluation branch) and puts the workspace back to the commit: a copy of
it holds the experiment's ref, its outputs in the DVC cache and its stages in the run-cache, for the tests that
compare an experiment with the commit (`dvc exp apply` instead of a rerun) and for a queued grid that passes through
the same point (DVC restores those stages instead of running them). It is built only when such a test runs (not
in `make test-fast`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from filelock import FileLock

A, B = "tiny-a", "tiny-b"  # the pipeline's models: llama, qwen2
SPAN0 = "span0"  # the pipeline's experiment: `dvc exp run -n span0 -S prompt.mless.count=0` (no span: mless is none)


def common_root(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` run once per test run (across workers); returns the folder it built. A build that raised
    leaves nothing behind, so the next worker to ask tries again and meets the same error."""
    root = common_root(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder


def built_models(tmp_path_factory, name: str, archs) -> dict[str, Path]:
    """Tiny saved models of `archs` (tests/tiny.py), built once per run into the shared folder `name`."""
    from tests import tiny

    folder = once(tmp_path_factory, name, lambda f: [tiny.build(arch, f / arch) for arch in archs])
    return {arch: folder / arch for arch in archs}


def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """One tiny saved model per architecture (tests/tiny.py): {"llama": dir, "qwen2": dir, "gemma3": dir}."""
    from tests import tiny

    return built_models(tmp_path_factory, "tiny-models", tiny.ARCHS)


def family_models(tmp_path_factory) -> dict[str, Path]:
    """One tiny saved model per supported family (tests/tiny.py FAMILIES), the three of `tiny_models` among them."""
    from tests import tiny

    extra = [f for f in tiny.FAMILIES if f not in tiny.ARCHS]
    return {**tiny_models(tmp_path_factory), **built_models(tmp_path_factory, "tiny-families", extra)}


def pipeline(tmp_path_factory) -> Path:
    """The tiny pipeline's folder: project/ (committed results), home/, model-cache/, and ran.json (the stages the
    first `dvc repro` ran)."""
    from tests.dvc_repo import Repo

    dirs = tiny_models(tmp_path_factory)

    def build(folder: Path) -> None:
        repo = Repo.create(folder / "project", folder / "home", folder / "model-cache",
                           {A: ("llama", dirs["llama"]), B: ("qwen2", dirs["qwen2"])})
        ran = repo.repro()
        repo.git("add", "-A")
        repo.git("commit", "-q", "-m", "results")
        (folder / "ran.json").write_text(json.dumps(sorted(ran)))

    return once(tmp_path_factory, "pipeline", build)


def pipeline_with_experiment(tmp_path_factory) -> Path:
    """A copy of the tiny pipeline's folder that also holds the experiment SPAN0, its workspace at the commit."""
    src = pipeline(tmp_path_factory)

    def build(folder: Path) -> None:
        repo = _copy(src, folder)
        repo.dvc("exp", "run", "-n", SPAN0, "-S", "prompt.mless.count=0")
        repo.git("reset", "-q", "--hard")
        repo.dvc("checkout", "--force", "--quiet")
        status = repo.status()
        if status:
            raise AssertionError(f"the tiny pipeline after its experiment: not the commit's results: {status}")

    return once(tmp_path_factory, "pipeline-span0", build)


def _copy(src: Path, dest: Path):
    from tests.dvc_repo import Repo, make_env

    shutil.copytree(src, dest, symlinks=True)
    repo = Repo(dest / "project", make_env(dest / "home", dest / "model-cache"))
    repo.first_run = set(json.loads((dest / "ran.json").read_text()))
    return repo


def readme(test):
    """A README promise on the tiny pipeline (marker `readme`: `make test-fast` runs it), and one worker's (xdist group
    "pipeline"): these come first in a run (tests/conftest.py), so the worker that builds the pipeline runs them while
    the other runs other work instead of waiting on the build; the other tests on a copy of the pipeline go one by one
    to whichever worker is free."""
    import pytest

    return pytest.mark.xdist_group("pipeline")(pytest.mark.readme(test))


def copy_of_pipeline(tmp_path_factory, dest: Path, experiment: bool = False):
    """A private copy of the tiny pipeline at `dest` (a Repo whose `first_run` is the stages the build ran); with
    `experiment`, of the build that also holds the experiment SPAN0."""
    return _copy((pipeline_with_experiment if experiment else pipeline)(tmp_path_factory), dest)
