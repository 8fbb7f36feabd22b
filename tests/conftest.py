from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from meaningless_tokens.config import yaml12
from tests import tiny

ROOT = tiny.ROOT


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
    return yaml12.load((ROOT / "params.yaml").read_text())  # as the stages and DVC read it (`on` a string)


@pytest.fixture
def write_params(tmp_path):
    """Write a params file (default values updated by `changes`) and return its path.

    Relative paths in the default params are made absolute, so the file can live in tmp_path."""

    def write(raw: dict | None = None, **sections) -> Path:
        raw = copy.deepcopy(raw if raw is not None else default_params())
        if raw["dataset"].get("path"):
            raw["dataset"]["path"] = str(ROOT / raw["dataset"]["path"])
        if "mful" in raw.get("prompt", {}):
            raw["prompt"]["mful"]["text_file"] = str(ROOT / raw["prompt"]["mful"]["text_file"])
        raw.update(sections)
        for stage in ("evaluate", "likelihood"):
            chosen = raw.get(stage, {}).get("models")
            if chosen and not set(chosen) <= set(raw.get("models", {})):  # tiny models replaced the listed ones
                raw[stage]["models"] = list(raw.get("models", {}))  # every model
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    return write


@pytest.fixture
def tiny_models_params(write_params, tiny_dirs):
    """A params file whose models are the three tiny local models."""
    models = {
        f"tiny-{arch}": {"display_name": f"Tiny {arch}", "family": arch,
                         "source": {"kind": "local_dir", "path": str(path)}, "layers": [0, 1, 2], "heads": "all"}
        for arch, path in tiny_dirs.items()
    }
    return write_params(models=models)


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


def spelled_out(spec: dict) -> dict:
    """A model entry with every key dvc.yaml lists, the schema's defaults where `spec` has none: as DVC (and so
    every stage's command) needs it."""
    from meaningless_tokens.config import dvc_model_defaults

    return {**dvc_model_defaults(), **spec}


@pytest.fixture(autouse=True)
def _release_shared_model():
    """A compiled engine's model is shared within a process (engines.transformers.release): not across tests."""
    yield
    import sys

    module = sys.modules.get("meaningless_tokens.engines.transformers")
    if module is not None:
        module.release()
