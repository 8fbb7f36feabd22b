"""The GPU image's wheel closure: the wheels carried to the GPU machine (`make gpu-wheels`) require nothing that
neither they nor the image's packages provide."""

from __future__ import annotations

from pathlib import Path

from meaningless_tokens.envlock.lock import _packaging
from meaningless_tokens.errors import LockError

# The GPU machine's interpreter (`make test-gpu`, `make gpu-check`): the markers of a carried wheel's requirements
# are evaluated for it.
GPU_MARKERS = {"implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "python_version": "3.12", "python_full_version": "3.12.3", "implementation_version": "3.12.3",
               "extra": ""}


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
