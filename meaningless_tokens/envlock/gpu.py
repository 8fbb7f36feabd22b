"""The GPU machine's wheels (`make gpu-wheels`): every binary wheel of the carried packages for each CPython the
project supports on x86-64 and aarch64 (TARGETS), fetched at the versions of locks/cuda.txt, so that pip on the GPU
machine picks the file that fits its own interpreter (`--find-links .whl --no-index`); and the closure check: for each
target, the carried wheels that fit it require nothing that neither they nor the image's packages provide."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from meaningless_tokens.envlock.lock import _packaging
from meaningless_tokens.errors import LockError

# (CPython, machine) the wheels are fetched and checked for: the project's requires-python (>=3.11) up to the newest
# CPython its locks hold wheels of, on x86-64 and on aarch64 (Grace Hopper machines). aarch64 is best effort: a
# package without a wheel there is named, not an error.
PYTHONS = ("3.11", "3.12", "3.13")
MACHINES = ("x86_64", "aarch64")
REQUIRED_MACHINES = ("x86_64",)
TARGETS = tuple((py, m) for m in MACHINES for py in PYTHONS)
MANYLINUX = tuple(f"manylinux_2_{k}" for k in range(28, 16, -1))  # glibc 2.28 down to 2.17 (manylinux2014)


def markers(python: str, machine: str) -> dict:
    """The environment markers of CPython `python` on Linux `machine`, as a carried wheel's requirements see them."""
    return {"implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": machine,
            "python_version": python, "python_full_version": f"{python}.0", "implementation_version": f"{python}.0",
            "extra": ""}


GPU_MARKERS = markers("3.12", "x86_64")  # the image on record: python3 3.12 (locks/gpu-image.txt)


def fits(wheel: str, python: str, machine: str) -> bool:
    """Whether pip on CPython `python`, Linux `machine` (glibc >= 2.28), installs wheel file `wheel`."""
    tags, utils = _packaging("tags", "utils")
    version = tuple(int(x) for x in python.split("."))
    interp = f"cp{version[0]}{version[1]}"
    platforms = [f"{m}_{machine}" for m in MANYLINUX] + [f"manylinux2014_{machine}", f"linux_{machine}"]
    supported = {*tags.cpython_tags(version, [interp, "abi3", "none"], platforms),
                 *tags.compatible_tags(version, interp, platforms)}
    return bool(set(utils.parse_wheel_filename(wheel)[3]) & supported)


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


def _image_lines(image: Path) -> list[str]:
    try:
        lines = image.read_text().splitlines()
    except OSError as e:
        raise LockError(f"{image}: {e.strerror or e}") from None
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def image_names(image: Path) -> set[str]:
    """The GPU image's package names (`image`: one a line, `name` or `name==version`, # comments), canonical."""
    _, utils = _packaging()
    return {utils.canonicalize_name(line.split("==")[0]) for line in _image_lines(image)}


def image_versions(image: Path) -> dict[str, str]:
    """The versions the image file records (`name==version` lines: those read from the image), by canonical name."""
    _, utils = _packaging()
    return {utils.canonicalize_name(name): version for name, sep, version in
            (line.partition("==") for line in _image_lines(image)) if sep}


def closure(dists: list[tuple[str, str, str, list[str]]], image: set[str], where: str,
            env: dict | None = None, versions: dict[str, str] | None = None) -> list[str]:
    """What the distributions `dists` ((label, name, version, Requires-Dist lines)) require, markers evaluated for
    `env` (default GPU_MARKERS), that neither one of them nor the image's packages (`image`; `versions`: the image's
    known versions, checked against the specifiers too) provide; [] when the set is closed. `where` names the
    carried set."""
    requirements, utils = _packaging()
    env = env or GPU_MARKERS
    versions = versions or {}
    carried = {utils.canonicalize_name(name): version for _, name, version, _ in dists}
    problems = []
    for label, _, _, lines in dists:
        for line in lines:
            req = requirements.Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = utils.canonicalize_name(req.name)
            if name in carried:
                if req.specifier and not req.specifier.contains(carried[name], prereleases=True):
                    problems.append(f"{label} requires {line}, but {where} carries {name} {carried[name]}")
            elif name not in image:
                problems.append(f"{label} requires {line}, which neither {where} nor the image holds")
            elif name in versions and req.specifier and not req.specifier.contains(versions[name], prereleases=True):
                problems.append(f"{label} requires {line}, but the image holds {name} {versions[name]}")
    return problems


def wheel_closure(folder: Path, image: Path, names: list[str] | None = None) -> dict[tuple[str, str], list[str]]:
    """Per target (TARGETS): `closure` of the wheels in `folder` that fit it, against the image's names and known
    versions (`image`), and each of `names` (the carried packages; default: every wheel's) without a wheel that fits
    it; {} when every target is closed."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise LockError(f"{folder}: no wheels (run `make gpu-wheels`)")
    _, utils = _packaging()
    read = {w: wheel_requirements(w) for w in wheels}
    wanted = {utils.canonicalize_name(n) for n in (names or [m[0] for m in read.values()])}
    problems = {}
    for python, machine in TARGETS:
        fit = [w for w in wheels if fits(w.name, python, machine)]
        have = {utils.canonicalize_name(read[w][0]) for w in fit}
        found = [f"no wheel of {n} in {folder}/ fits CPython {python} on {machine}" for n in sorted(wanted - have)]
        found += closure([(w.name, *read[w]) for w in fit], image_names(image), f"{folder}/",
                         markers(python, machine), image_versions(image))
        if found:
            problems[(python, machine)] = found
    return problems


def _pin(name: str, lock: Path) -> str:
    from meaningless_tokens.envlock.lock import canonical, parse

    pins = parse(lock)
    if canonical(name) not in pins:
        raise LockError(f"{name} is not in {lock}: the carried wheels come at the lock's versions")
    return f"{name}=={pins[canonical(name)]}"


def fetch(names: list[str], lock: Path, folder: Path, pip: list[str] | None = None) -> dict[str, list[tuple]]:
    """Each of `names` at `lock`'s version into `folder`: a wheel for every target unless one already there fits it
    (a pure-Python or abi3 wheel serves several). A package that publishes no wheel at all is built here only if what
    it builds is pure Python (`py3-none-any`); a binary wheel is never built for this machine's Python in place of the
    target's. Returns {name: [(python, machine), ...]} of the targets without a wheel (aarch64's are allowed)."""
    pip = pip or [sys.executable, "-m", "pip"]
    folder.mkdir(parents=True, exist_ok=True)
    _, utils = _packaging()
    lacking: dict[str, list[tuple]] = {}
    for name in names:
        pin = _pin(name, lock)
        key = utils.canonicalize_name(name)

        def present():
            return [w.name for w in folder.glob("*.whl") if utils.canonicalize_name(w.name.split("-")[0]) == key
                    and w.name.split("-")[1] == pin.split("==")[1]]
        built = False
        for python, machine in TARGETS:
            if any(fits(w, python, machine) for w in present()):
                continue
            platforms = [a for m in MANYLINUX for a in ("--platform", f"{m}_{machine}")]
            got = subprocess.run([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
                                  python, "--implementation", "cp", *platforms, "--platform",
                                  f"manylinux2014_{machine}", "-d", str(folder), pin],
                                 capture_output=True, text=True)
            if got.returncode == 0 and any(fits(w, python, machine) for w in present()):
                continue
            if not built and not present():  # no wheel on the index for any target: maybe only an sdist
                built = True
                with tempfile.TemporaryDirectory() as tmp:
                    made = subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", tmp, pin],
                                          capture_output=True, text=True)
                    out = sorted(Path(tmp).glob("*.whl"))
                    if made.returncode != 0 or not out:
                        raise LockError(f"{pin}: no wheel on the index, and building one failed: "
                                        f"{(made.stderr or got.stderr).strip().splitlines()[-1:]}")
                    if not out[0].name.endswith("-py3-none-any.whl"):
                        raise LockError(f"{pin}: no wheel on the index for CPython {python} on {machine}, and it "
                                        f"builds {out[0].name}, a binary for this machine's Python: not carried")
                    out[0].replace(folder / out[0].name)
                if any(fits(w, python, machine) for w in present()):
                    continue
            lacking.setdefault(name, []).append((python, machine))
    return lacking
