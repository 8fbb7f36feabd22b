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


def _wheel(folder, name, version, requires):
    """A minimal wheel: its dist-info METADATA is all `wheel_closure` reads."""
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_the_gpu_wheels_check_names_what_the_carried_set_lacks(tmp_path):
    image = tmp_path / "image.txt"
    image.write_text("# the image\nnumpy\nTyping_Extensions\n")
    _wheel(tmp_path, "alpha", "1.0", ["beta>=2", "numpy", "typing-extensions>=4",
                                      "gamma; sys_platform == 'win32'", "delta; python_version < '3.12'",
                                      "epsilon; extra == 'docs'", "zeta; sys_platform != 'emscripten'"])
    _wheel(tmp_path, "beta", "1.5", [])
    problems = envlock.wheel_closure(tmp_path, image)
    # markers for CPython 3.12 on Linux x86-64: gamma, delta and the extra are not required there; zeta is
    assert len(problems) == 2, problems
    assert "alpha-1.0-py3-none-any.whl requires beta>=2, but" in problems[0] and "beta 1.5" in problems[0]
    assert "requires zeta; sys_platform != 'emscripten', which neither" in problems[1]
    _wheel(tmp_path, "zeta", "0.1", [])
    (tmp_path / "beta-1.5-py3-none-any.whl").unlink()
    _wheel(tmp_path, "beta", "2.0", ["numpy"])
    assert envlock.wheel_closure(tmp_path, image) == []
    assert envlock.main(["wheels", str(tmp_path), str(image)]) == 0
    with pytest.raises(envlock.LockError, match="no wheels"):
        envlock.wheel_closure(tmp_path / "empty", image)


def test_the_gpu_wheels_of_the_makefile_form_a_closed_set():
    """GPU_WHEELS at the versions this environment holds (the CPU lock pins the same versions as the CUDA one for
    these pure-Python and ABI3 packages): every requirement on the GPU machine is met by them or its image."""
    import re
    from importlib import metadata

    make = (ROOT / "Makefile").read_text()
    names = re.search(r"^GPU_WHEELS := ((?:.*\\\n)*.*)$", make, re.M).group(1).replace("\\\n", " ").split()
    image = re.search(r"^GPU_IMAGE\s*:= (\S+)", make, re.M).group(1)
    cuda = envlock.parse(ROOT / "locks" / "cuda.txt")
    dists = []
    for name in names:
        dist = metadata.distribution(name)
        assert dist.version == cuda[envlock.canonical(name)], (name, dist.version)
        dists.append((name, name, dist.version, dist.requires or []))
    assert envlock.closure(dists, envlock.image_names(ROOT / image), "GPU_WHEELS") == []


def test_vendored_metadata_on_sys_path_is_not_an_installed_package():
    """Importing setuptools (torch's compiler does) puts setuptools/_vendor on sys.path, whose packages' metadata
    (autocommand, jaraco-*, an older platformdirs...) is not the environment's."""
    import sys

    import setuptools  # noqa: F401

    assert any(p.endswith("_vendor") for p in sys.path)
    env = environment()
    assert envlock.drift(ROOT / env["lock"]) == []
