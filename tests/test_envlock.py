"""The locked environment (meaningless_tokens/envlock.py): the installed packages are the lock's, and every lock
answers pyproject.toml."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from meaningless_tokens import envlock
from meaningless_tokens.store import ROOT, environment, provenance


def test_this_environment_is_its_lock():
    env = environment()
    assert env["lock"] is not None, "this environment was not installed from a lock: run `make install`"
    lock = ROOT / env["lock"]
    assert env["sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest(), f"{lock} changed since the install"
    assert envlock.drift(lock) == []


def test_every_lock_answers_pyproject():
    assert [p for spec in envlock.SPECS.values() for p in envlock.pyproject_disagreements(spec)] == []
    for spec in envlock.SPECS.values():
        pins = envlock.parse(spec.path)
        assert pins["torch"] == ("2.13.0+cpu" if spec.torch == "cpu" else "2.13.0")
        assert not set(spec.omit) & set(pins)


def test_drift_names_the_package_and_both_versions():
    lock = ROOT / "locks" / "cpu.txt"
    have = dict(envlock.parse(lock))
    have["transformers"] = "9.9.9"
    have["left-by-hand"] = "1.0"
    del have["h5py"]
    lines = envlock.drift(lock, have)
    want = envlock.parse(lock)
    assert lines == [f"h5py: not installed; the lock pins {want['h5py']}",
                     "left-by-hand: 1.0 installed, not in the lock",
                     f"transformers: 9.9.9 installed, the lock pins {want['transformers']}"]


def test_a_changed_pyproject_is_told(tmp_path, monkeypatch):
    (tmp_path / "locks").mkdir()
    for p in (ROOT / "locks").iterdir():
        shutil.copy(p, tmp_path / "locks" / p.name)
    text = (ROOT / "pyproject.toml").read_text()
    assert '"h5py>=3.12"' in text
    (tmp_path / "pyproject.toml").write_text(text.replace('"h5py>=3.12"', '"h5py>=99"'))
    monkeypatch.setattr(envlock, "ROOT", tmp_path)
    monkeypatch.setattr(envlock, "LOCK_DIR", tmp_path / "locks")
    problems = envlock.pyproject_disagreements(envlock.SPECS["cpu"])
    pinned = envlock.parse(tmp_path / "locks" / "cpu.txt")["h5py"]
    assert problems == [
        "locks/cpu.txt: made from other inputs than pyproject.toml and locks/*.in now hold (input-sha256 differs): "
        "run `make lock`",
        f"locks/cpu.txt: pyproject.toml requires 'h5py>=99', the lock pins h5py=={pinned}"]


def test_a_lock_without_exact_pins_is_refused(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("# input-sha256: x\nnumpy>=2\n")
    with pytest.raises(envlock.LockError, match=r"bad.txt:2: 'numpy>=2' is not pinned to one version"):
        envlock.parse(bad)


def test_provenance_records_the_lock():
    assert provenance("report")["environment"] == environment()
