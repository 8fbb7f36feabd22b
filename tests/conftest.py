from __future__ import annotations

from pathlib import Path

import pytest

from tests import params, tiny

ROOT = tiny.ROOT
spelled_out = params.spelled_out  # what the tests import from here


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """One tiny saved model per architecture: {"llama": dir, "qwen2": dir, "gemma3": dir}."""
    base = tmp_path_factory.mktemp("tiny-models")
    return {arch: tiny.build(arch, base / arch) for arch in tiny.ARCHS}


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
    """Modules with a slow test first (stable otherwise): `make test`'s two workers take one file at a time, so a
    module of minutes that started last would leave the other worker idle at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


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
