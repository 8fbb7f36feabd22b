from __future__ import annotations

import os

# One torch and BLAS thread per test worker, set before torch is imported and inherited by every process a test
# starts (DVC, the stages, the scripts): a tiny model's steps are many short parallel regions, and two workers each
# running two spin-waiting threads on two cores fight (docs/benchmarks.md: 156 s against 12 s for one step).
# MLESS_TEST_THREADS sets another count; a test that is about threads sets its own.
THREADS = os.environ.setdefault("MLESS_TEST_THREADS", "1")
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = THREADS

import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests import params, shared, tiny  # noqa: E402

ROOT = tiny.ROOT
spelled_out = params.spelled_out  # what the tests import from here


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """One tiny saved model per architecture: {"llama": dir, "qwen2": dir, "gemma3": dir}, built once for the whole
    run and shared by its workers (tests/shared.py): read them, never write into them."""
    return shared.tiny_models(tmp_path_factory)


@pytest.fixture
def pipeline_copy(tmp_path_factory, tmp_path):
    """A private copy of the tiny pipeline with its committed results (tests/shared.py, a fraction of a second):
    whatever the test runs or breaks there touches no other test, and nothing is put back; removed after the test."""
    repo = shared.copy_of_pipeline(tmp_path_factory, tmp_path / "pipeline")
    yield repo
    shutil.rmtree(repo.path.parent, ignore_errors=True)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "model-cache"
    monkeypatch.setenv("MLESS_CACHE", str(path))
    return path


def default_params() -> dict:
    return params.read()  # as the stages and DVC read it (`on` a string)


@pytest.fixture
def write_params(tmp_path):
    """Write a params file and return its path: `raw` (default: params.yaml) with `over` laid over it and `sections`
    replaced (tests/params.py, build), relative paths made absolute so that the file can live in tmp_path."""

    def write(raw: dict | None = None, over: dict | None = None, **sections) -> Path:
        return params.write(tmp_path / "params.yaml",
                            params.build(raw if raw is not None else "params.yaml", over, absolute=True, **sections))

    return write


@pytest.fixture
def tiny_models_params(write_params, tiny_dirs):
    """A params file whose models are the three tiny local models."""
    return write_params(models={f"tiny-{arch}": params.tiny_model(arch, path) for arch, path in tiny_dirs.items()})


def pytest_collection_modifyitems(session, config, items):
    """The longest work first (stable otherwise): the modules that are one worker's (an xdist group) and slow, then
    the other slow tests, then the rest. `make test`'s workers take the next unit as they come free, so a unit of
    minutes that started last would leave the other worker idle at the end; short tests fill the gaps."""
    def rank(item) -> int:
        slow = item.get_closest_marker("slow") is not None
        grouped = item.get_closest_marker("xdist_group") is not None
        return 0 if slow and grouped else 1 if slow else 2 if grouped else 3

    items.sort(key=rank)
    if config.getoption("loadgroup", False):  # an xdist worker of `--dist loadgroup`
        for item in items:
            _name_the_group(item)


def _name_the_group(item) -> None:
    """pytest-xdist's `--dist loadgroup` sends the tests of one `xdist_group` to one worker by a `@group` suffix of
    their node id, which it writes to `item._nodeid`; pytest 9.2 reads the id from `item._id` (a NodeId), so the
    suffix never arrives and every test becomes a group of its own (a module's fixture then built on both workers).
    Write it where pytest reads it, as xdist meant to."""
    from _pytest.nodeid import NodeId

    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    if names and "@" not in item.nodeid.rpartition("]")[2]:
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


# lines a test wants in the run's closing summary (tests/test_vllm.py: how the two engines' texts compare)
SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("engine comparison")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _release_shared_model():
    """A compiled engine's model is shared within a process (engines.transformers.release): not across tests."""
    yield
    import sys

    module = sys.modules.get("meaningless_tokens.engines.transformers")
    if module is not None:
        module.release()
