"""The locked environment (meaningless_tokens/envlock/): the installed packages are the lock's, and every lock
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
    assert envlock.recorded_locks()[0] == lock
    assert envlock.drift(envlock.recorded_locks()) == []


def test_every_lock_answers_pyproject():
    assert [p for spec in envlock.SPECS.values() for p in envlock.pyproject_disagreements(spec)] == []
    for spec in envlock.SPECS.values():
        pins = envlock.parse(spec.path)
        if spec.base is not None:  # a layer holds only what it adds: torch is its base's
            assert "torch" not in pins and not set(pins) & set(envlock.parse(envlock.SPECS[spec.base].path))
            continue
        assert pins["torch"] == ("2.13.0+cpu" if spec.torch == "cpu" else "2.13.0")
        assert not set(spec.omit) & set(pins)


TEST_ONLY = {"pytest", "pytest-xdist", "playwright", "moto", "flask", "docker", "cfn-lint", "aws-xray-sdk"}


def test_the_results_environment_holds_no_test_harness():
    """`make repro` installs locks/cpu.txt alone: the test extra and what only it pulls in live in the test layer,
    at the results lock's versions for everything both need."""
    for base in ("cpu", "cuda"):
        results = envlock.parse(envlock.SPECS[base].path)
        layer = envlock.parse(envlock.SPECS[f"{base}-test"].path)
        assert not TEST_ONLY & set(results), (base, TEST_ONLY & set(results))
        assert TEST_ONLY <= set(layer), (base, TEST_ONLY - set(layer))
        assert {"dvc-s3", "dvc-ssh"} <= set(results)  # sharing is a user feature, not a test's


def test_a_layer_that_repeats_its_base_is_told(tmp_path, monkeypatch):
    (tmp_path / "locks").mkdir()
    for p in (ROOT / "locks").iterdir():
        shutil.copy(p, tmp_path / "locks" / p.name)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    base = (tmp_path / "locks" / "cpu.txt").read_text()
    numpy = base[base.index("\nnumpy=="):].split("\n# ")[0].split("\n    # via")[0]
    with open(tmp_path / "locks" / "cpu-test.txt", "a") as f:
        f.write(numpy.strip() + "\n")
    monkeypatch.setattr(envlock.lock, "ROOT", tmp_path)  # where pyproject_disagreements reads it
    monkeypatch.setattr(envlock.lock, "LOCK_DIR", tmp_path / "locks")
    assert envlock.pyproject_disagreements(envlock.SPECS["cpu-test"]) == [
        "locks/cpu-test.txt: pins numpy, which its base locks/cpu.txt pins too (a layer holds only what it adds)"]


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
    monkeypatch.setattr(envlock.lock, "ROOT", tmp_path)  # where pyproject_disagreements reads it
    monkeypatch.setattr(envlock.lock, "LOCK_DIR", tmp_path / "locks")
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


# What the GPU machine never imports: the DVC-side commands (run cache, verify), GGUF conversion (the GPU profile's
# models come from the hub as safetensors) and the vLLM engine (its own environment).
NOT_ON_THE_GPU = {"dvc": "runcache and verify, not run there", "dvc_data": "DVC's data layer, for verify's reference",
                  "gguf": "GGUF conversion; the GPU models are safetensors",
                  "vllm": "the vLLM engine, its own environment"}


def test_every_package_the_gpu_check_imports_travels_or_is_in_the_image():
    """Each third-party package imported by the library, the stages, the CUDA tier or benchmarks/gpu_check.py is in
    the GPU image (locks/gpu-image.txt) or among GPU_WHEELS: a package missing there stops `make gpu-check` at
    import on the GPU machine, where nothing can be installed."""
    import ast
    import re
    import sys
    from importlib.metadata import packages_distributions

    make = (ROOT / "Makefile").read_text()
    carried = {envlock.canonical(n) for n in
               re.search(r"^GPU_WHEELS := ((?:.*\\\n)*.*)$", make, re.M).group(1).replace("\\\n", " ").split()}
    image = envlock.image_names(ROOT / "locks" / "gpu-image.txt")
    owners = packages_distributions()
    files = [*(ROOT / "meaningless_tokens").rglob("*.py"), *(ROOT / "stages").glob("*.py"),
             ROOT / "benchmarks" / "gpu_check.py", ROOT / "tests" / "test_cuda.py"]
    missing = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top in sys.stdlib_module_names or top in ("meaningless_tokens", "stages", "tests", "benchmarks"):
                    continue
                dists = {envlock.canonical(d) for d in owners.get(top, [top])}
                if not dists & (carried | image) and top not in NOT_ON_THE_GPU:
                    missing.setdefault(top, []).append(path.relative_to(ROOT).as_posix())
    assert missing == {}, missing


def test_vendored_metadata_on_sys_path_is_not_an_installed_package():
    """Importing setuptools (torch's compiler does) puts setuptools/_vendor on sys.path, whose packages' metadata
    (autocommand, jaraco-*, an older platformdirs...) is not the environment's."""
    import sys

    import setuptools  # noqa: F401

    assert any(p.endswith("_vendor") for p in sys.path)
    assert envlock.drift(envlock.recorded_locks()) == []


# ---- install: where each pin comes from --------------------------------------------------------------------------

def _installable_wheel(folder, name, version):
    """A wheel an installer accepts (METADATA, WHEEL, RECORD) standing in for a real one; its sha256."""
    import base64
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {f"{name}_stub/__init__.py": "", f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(member, text)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _no_pip_configuration():
    """The environment of a machine whose pip reads no configuration (PIP_CONFIG_FILE=/dev/null, no PIP_*, no UV_*)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": "/dev/null"}


def _make_install_lines(**overrides):
    """The Makefile's install recipe up to the locked install, as `make -n` prints it with these variables."""
    import subprocess

    overrides = {k: str(v) for k, v in overrides.items()}
    out = subprocess.run(["make", "-n", "--no-print-directory", "install", *(f"{k}={v}" for k, v in overrides.items())],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("rm -rf ") and overrides["VENV"] in line)
    end = next(i for i, line in enumerate(out) if i > start and overrides["LOCK"] in line)
    return out[start:end + 1]


@pytest.mark.parametrize("where", ["index", "folder"])
def test_the_cpu_torch_pin_installs_from_its_named_source_without_pip_configuration(tmp_path, where):
    """torch's CPU build (a local version, +cpu) is on no PyPI: `make install` names PyTorch's CPU index for it
    (TORCH_INDEX), so a machine whose pip reads no configuration installs it; a local file index stands in for
    PyTorch's page. And where pip's configuration names a wheel folder holding the file (the reference machine),
    the folder serves it and the index is never asked: here the index is a closed port, which would fail."""
    import subprocess
    import sys

    if not (ROOT / ".venv-uv" / "bin" / "uv").exists():
        pytest.fail(".venv-uv/bin/uv missing: `make install` bootstraps it")
    simple = tmp_path / "simple" / "torch"
    simple.mkdir(parents=True)
    wheel, digest = _installable_wheel(simple, "torch", "2.13.0+cpu")
    (simple / "index.html").write_text(f'<html><body><a href="{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>\n')
    lock = tmp_path / "lock.txt"
    lock.write_text(f"torch==2.13.0+cpu \\\n    --hash=sha256:{digest}\n")
    venv = tmp_path / "venv"
    env = _no_pip_configuration()
    if where == "index":
        index = (tmp_path / "simple").as_uri()
    else:
        index = "http://127.0.0.1:9/simple"  # nothing listens: asking it fails the install
        env["PIP_FIND_LINKS"] = str(simple)
    lines = _make_install_lines(VENV=venv, LOCK=lock, TORCH_INDEX=index, PYTHON=sys.executable)
    assert any("envlock install" in line and f"--torch-index {index}" in line for line in lines), lines
    for line in lines:
        subprocess.run(line, shell=True, cwd=ROOT, env=env, check=True, timeout=300)
    got = subprocess.run([venv / "bin" / "python", "-c", "from importlib.metadata import version; print(version('torch'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == "2.13.0+cpu"


def test_the_makefile_names_pytorchs_cpu_index():
    """Without an override, the install names PyTorch's CPU wheel index (PyTorch's own instructions for CPU-only
    machines) for the +cpu pin, and installs the results lock with uv, hashes required."""
    lines = _make_install_lines(VENV="/nonexistent/venv", LOCK="locks/cpu.txt")
    install = next(line for line in lines if "envlock install" in line)
    assert "--torch-index https://download.pytorch.org/whl/cpu" in install and install.endswith(" locks/cpu.txt")


def test_pip_sources_are_read_as_pip_reads_them(tmp_path, monkeypatch):
    """uv reads no pip.conf and no PIP_* variable: `install` takes pip's own reading of both."""
    import sys

    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///a/simple\n    file:///b/simple\nfind-links = /wheels\n")
    for k in [k for k in __import__("os").environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    src = envlock.pip_sources(sys.executable)
    assert src == envlock.Sources("https://mirror.example/simple", ("file:///a/simple", "file:///b/simple"), ("/wheels",))
    assert src.uv_args()[-2:] == ["--index-strategy", "unsafe-best-match"]
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_INDEX_URL")
    assert envlock.pip_sources(sys.executable) == envlock.Sources()
