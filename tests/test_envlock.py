"""The locked environment (meaningless_tokens/envlock/): the installed packages are the lock's, and every lock
answers pyproject.toml."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

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
        if spec.base:  # a layer holds only what it adds: torch is its base's
            assert "torch" not in pins
            assert not set(pins) & {n for below in spec.base for n in envlock.parse(envlock.SPECS[below].path)}
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
    assert set(problems) == set(envlock.TARGETS)  # every target: the wheels are pure Python
    # markers for CPython 3.12 on Linux x86-64: gamma, delta and the extra are not required there; zeta is
    found = problems[("3.12", "x86_64")]
    assert len(found) == 2, found
    assert "alpha-1.0-py3-none-any.whl requires beta>=2, but" in found[0] and "beta 1.5" in found[0]
    assert "requires zeta; sys_platform != 'emscripten', which neither" in found[1]
    # on 3.11 delta is required too (its marker holds there)
    assert any("requires delta; python_version < '3.12', which neither" in f for f in problems[("3.11", "x86_64")])
    _wheel(tmp_path, "zeta", "0.1", [])
    _wheel(tmp_path, "delta", "0.1", [])
    (tmp_path / "beta-1.5-py3-none-any.whl").unlink()
    _wheel(tmp_path, "beta", "2.0", ["numpy"])
    assert envlock.wheel_closure(tmp_path, image) == {}
    assert envlock.main(["wheels", str(tmp_path), str(image)]) == 0
    with pytest.raises(envlock.LockError, match="no wheels"):
        envlock.wheel_closure(tmp_path / "empty", image)


def test_a_binary_wheel_fits_only_its_own_python_and_machine(tmp_path):
    """pip on the GPU machine picks among the carried files by their tags; the closure check does the same per
    target, and names a carried package without a file for one."""
    fits = envlock.fits
    assert fits("pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.12", "x86_64")
    assert not fits("pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11", "x86_64")
    assert not fits("pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.12", "aarch64")
    assert fits("tokenizers-0.23.3-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.13", "x86_64")
    assert fits("transformers-5.24.0-py3-none-any.whl", "3.11", "aarch64")
    image = tmp_path / "image.txt"
    image.write_text("torch==2.11.0\n")
    _wheel(tmp_path, "alpha", "1.0", ["torch>=2.4"])
    core = tmp_path / "alpha-1.0-py3-none-any.whl"
    core.rename(tmp_path / "alpha-1.0-cp312-cp312-manylinux_2_17_x86_64.whl")
    problems = envlock.wheel_closure(tmp_path, image, ["alpha"])
    assert ("3.12", "x86_64") not in problems
    assert problems[("3.11", "x86_64")] == [f"no wheel of alpha in {tmp_path}/ fits CPython 3.11 on x86_64"]
    # a requirement the image's recorded version does not meet
    _wheel(tmp_path, "beta", "1.0", ["torch>=2.12"])
    found = envlock.wheel_closure(tmp_path, image, ["alpha", "beta"])[("3.12", "x86_64")]
    assert found == ["beta-1.0-py3-none-any.whl requires torch>=2.12, but the image holds torch 2.11.0"]


def _makefile_list(name):
    import re

    make = (ROOT / "Makefile").read_text()
    return re.search(rf"^{name}\s*:= ((?:.*\\\n)*.*)$", make, re.M).group(1).replace("\\\n", " ").split()


def test_the_gpu_wheels_of_the_makefile_form_a_closed_set():
    """GPU_WHEELS at the versions this environment holds (the CPU lock pins the same versions as the CUDA one for
    these pure-Python and ABI3 packages): every requirement on the GPU machine, for every CPython and machine the
    wheels are fetched for, is met by them or its image, at the image's versions where they are recorded."""
    from importlib import metadata

    names = _makefile_list("GPU_WHEELS")
    image = ROOT / _makefile_list("GPU_IMAGE")[0]
    cuda = envlock.parse(ROOT / "locks" / "cuda.txt")
    dists = []
    for name in names:
        dist = metadata.distribution(name)
        assert dist.version == cuda[envlock.canonical(name)], (name, dist.version)
        dists.append((name, name, dist.version, dist.requires or []))
    for python, machine in envlock.TARGETS:
        assert envlock.closure(dists, envlock.image_names(image), "GPU_WHEELS", envlock.markers(python, machine),
                               envlock.image_versions(image)) == [], (python, machine)
    assert envlock.image_versions(image) == {"torch": "2.11.0+cu130", "transformers": "5.17.0"}


def _preflight():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_preflight", ROOT / "benchmarks" / "gpu_preflight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_the_gpu_check_imports_travels_or_is_in_the_image():
    """Each third-party module imported by the library, the stages, the CUDA tier's files (conftest, params, tiny, the
    ARM tests), the benchmark or benchmarks/gpu_check.py (the preflight's files: one list) is carried among
    GPU_WHEELS or in the GPU image (locks/gpu-image.txt), and where the image's version is recorded, it meets the
    project's requirement: a package missing there stops `make gpu-check` on the GPU machine, where nothing can be
    installed."""
    from importlib.metadata import packages_distributions

    preflight = _preflight()
    carried = {envlock.canonical(n) for n in _makefile_list("GPU_WHEELS")}
    image = envlock.image_names(ROOT / "locks" / "gpu-image.txt")
    versions = envlock.image_versions(ROOT / "locks" / "gpu-image.txt")
    needs = preflight.requirements()
    owners = packages_distributions()
    modules = preflight.third_party()
    read = {p.relative_to(ROOT).as_posix() for p in preflight.files()}
    assert {"tests/conftest.py", "tests/params.py", "tests/tiny.py", "tests/test_arm.py", "tests/test_arm_compile.py",
            "benchmarks/bench_gpu_generate.py", "benchmarks/gpu_check.py", "benchmarks/gpu_tier.py"} <= read
    missing, old = {}, {}
    from packaging.specifiers import SpecifierSet

    for top, users in modules.items():
        dists = {envlock.canonical(d) for d in owners.get(top, [top])}
        if not dists & (carried | image):
            missing[top] = users
        for dist in dists - carried:
            if dist in versions and needs.get(dist) and not SpecifierSet(needs[dist]).contains(versions[dist]):
                old[dist] = (versions[dist], needs[dist])
    assert missing == {}, missing
    assert old == {}, old
    assert set(preflight.NOT_ON_THE_GPU) == {"dvc", "dvc_data", "gguf", "vllm", "ray", "configobj"}


def test_the_preflight_names_a_removed_module_and_the_wheel_that_brings_it(tmp_path):
    """The preflight with a site that lacks math_verify (a scratch copy of this environment's site-packages without
    it, this interpreter run without its own site) and one whose h5py claims 2.0: one line each, naming the module,
    its importer and the carried wheel that brings it; exit 2. With the whole site: exit 0."""
    import subprocess
    import sys
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    scratch = tmp_path / "site"
    scratch.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(("math_verify", "h5py-")) or entry.suffix == ".pth":
            continue
        (scratch / entry.name).symlink_to(entry)
    fake = scratch / "h5py-2.0.0.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: h5py\nVersion: 2.0.0\n")
    (fake / "top_level.txt").write_text("h5py\n")
    (fake / "RECORD").write_text("h5py/__init__.py,,\n")
    wheels = tmp_path / ".whl"
    wheels.mkdir()
    _wheel(wheels, "math_verify", "0.9.0", [])
    whl = wheels / "math_verify-0.9.0-py3-none-any.whl"
    import zipfile

    with zipfile.ZipFile(whl, "a") as z:
        z.writestr("math_verify/__init__.py", "")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-S", str(ROOT / "benchmarks" / "gpu_preflight.py"), "--wheels", str(wheels)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**env, "PYTHONPATH": f"{scratch}:{ROOT}"},
                          timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("preflight: h5py: h5py 2.0.0 is too old (pyproject.toml: h5py>=3.12), imported by ")
    assert "no wheel in" in lines[0] and "add its distribution to GPU_WHEELS" in lines[0]
    assert lines[1].startswith("preflight: math_verify: missing (ModuleNotFoundError: No module named 'math_verify'), "
                               "imported by meaningless_tokens/grading.py; ")
    assert lines[1].endswith(".whl/math_verify-0.9.0-py3-none-any.whl brings math-verify 0.9.0")
    whole = subprocess.run([cmd[0], *cmd[2:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0 and "each new enough" in whole.stdout, whole.stderr


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
