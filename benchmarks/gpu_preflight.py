"""The GPU check's preflight (`python benchmarks/gpu_preflight.py`, and the first thing `make gpu-check` and
`make test-gpu` do): imports every third-party module that the library, the stages, the CUDA tier's files and the
check import, with this interpreter and its path (on the GPU machine: the image's python3 and the carried wheels'
folder on PYTHONPATH), and prints one line for each that is missing or older than the project needs, with the
carried wheel that would bring it; exit 2 if any. Standard library only, with the project's envlock (itself standard
library only, and packaging or pip's vendored copy for versions and wheel tags): it must run where the project's own
requirements are what is missing.

`tests/test_envlock.py` checks the same files against the wheels `make gpu-wheels` carries and the image's packages
(locks/gpu-image.txt) in every `make test`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/gpu_preflight.py` puts only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))

# the project's packaging helpers: standard library only (and packaging, or pip's vendored copy)
from meaningless_tokens.envlock.gpu import fits  # noqa: E402
from meaningless_tokens.envlock.lock import _packaging, canonical  # noqa: E402
# What the GPU check runs: the library and the stages whole, and the files the check and the tier start from; the
# project's modules these import (tests.*, benchmarks.*) are followed. bench_gpu_generate is loaded by its path.
ENTRIES = ("benchmarks/gpu_check.py", "benchmarks/gpu_tier.py", "benchmarks/bench_gpu_generate.py",
           "tests/conftest.py", "tests/test_cuda.py")
LIBRARY = ("meaningless_tokens", "stages")
# What the GPU machine never imports: the DVC-side commands (run cache, verify, the cluster scheduler, which runs
# DVC), GGUF conversion (the GPU profile's models come from the hub as safetensors) and the vLLM engine (its own
# environment, its replicas on Ray).
NOT_ON_THE_GPU = {"dvc": "runcache and verify, not run there", "dvc_data": "DVC's data layer, for verify's reference",
                  "gguf": "GGUF conversion; the GPU models are safetensors",
                  "vllm": "the vLLM engine, its own environment",
                  "ray": "`mless repro --cluster` and the vLLM engine's replicas, neither run there",
                  "configobj": "DVC's config format, for the cluster scheduler's worktrees"}
PROJECT = ("meaningless_tokens", "stages", "tests", "benchmarks")


def files(root: Path = ROOT) -> list[Path]:
    """The library, the stages and ENTRIES with the project's test and benchmark modules they import."""
    todo = [root / e for e in ENTRIES]
    seen = {*(p for pkg in LIBRARY for p in (root / pkg).rglob("*.py"))}
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        todo += [local for name in _imports(path) if (local := _local(path, name, root))]
    return sorted(seen)


def _local(path: Path, name: str, root: Path) -> Path | None:
    """The project's file that import `name` in `path` reads: tests.X, benchmarks.X (or tests.tiny for
    tests.tiny.build_real), or a sibling module of a benchmark script (run with benchmarks/ on its path)."""
    parts = name.split(".")
    if parts[0] in ("tests", "benchmarks"):
        for k in range(len(parts), 1, -1):
            candidate = root.joinpath(*parts[:k]).with_suffix(".py")
            if candidate.is_file():
                return candidate
    sibling = path.parent / f"{parts[0]}.py"
    return sibling if path.parent == root / "benchmarks" and sibling.is_file() else None


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def third_party(root: Path = ROOT) -> dict[str, list[str]]:
    """Top-level third-party module -> the files (relative) that import it, NOT_ON_THE_GPU left out."""
    out: dict[str, list[str]] = {}
    for path in files(root):
        for top in {n.split(".")[0] for n in _imports(path) if not _local(path, n, root)}:
            if top in sys.stdlib_module_names or top in PROJECT or top in NOT_ON_THE_GPU or top == "__future__":
                continue
            out.setdefault(top, []).append(path.relative_to(root).as_posix())
    return {k: sorted(v) for k, v in sorted(out.items())}


def wheels(folder: Path) -> dict[str, list[tuple[str, str, Path]]]:
    """Top-level module -> [(distribution, version, wheel)] of the wheels in `folder` (the files each installs)."""
    out: dict[str, list] = {}
    for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        dist, version = wheel.name.split("-")[:2]
        try:
            with zipfile.ZipFile(wheel) as z:
                tops = {n.split("/")[0].removesuffix(".py") for n in z.namelist()
                        if not n.split("/")[0].endswith((".dist-info", ".data"))}
        except (OSError, zipfile.BadZipFile):
            continue
        for top in tops:
            out.setdefault(top, []).append((dist, version, wheel))
    return out


def _fits(wheel: Path) -> bool:
    """Whether this interpreter, on this machine, installs `wheel` (its tags)."""
    import platform

    return fits(wheel.name, f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine())


def requirements(root: Path = ROOT) -> dict[str, str]:
    """Canonical distribution name -> the project's specifier (pyproject.toml's dependencies and test extra)."""
    (requirement,) = _packaging("requirements")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = [requirement.Requirement(line) for line in
            [*project["dependencies"], *project.get("optional-dependencies", {}).get("test", [])]]
    return {canonical(r.name): str(r.specifier) for r in reqs}


def problems(modules: dict[str, list[str]], folder: Path, root: Path = ROOT) -> list[str]:
    """One line for each module of `modules` that does not import, or whose distribution is older than the project's
    specifier or than the wheel carried for it in `folder`; [] when every one imports and is new enough."""
    specifiers, version = _packaging("specifiers", "version")
    SpecifierSet, Version = specifiers.SpecifierSet, version.Version
    carried, needs = wheels(folder), requirements(root)
    owners = metadata.packages_distributions()
    lines = []

    def bringer(top: str) -> str:
        fit = [(d, v, w) for d, v, w in carried.get(top, []) if _fits(w)]
        if fit:
            return f"{fit[0][2].relative_to(folder.parent) if folder.parent in fit[0][2].parents else fit[0][2]} " \
                   f"brings {canonical(fit[0][0])} {fit[0][1]}"
        return (f"no wheel in {folder} provides it for this Python {sys.version.split()[0]}: add its distribution to "
                f"GPU_WHEELS (Makefile) and run `make gpu-wheels`")

    for top, users in modules.items():
        try:
            importlib.import_module(top)
        except Exception as e:  # noqa: BLE001 - whatever stops the import is the line
            missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
            missing = (missing or top).split(".")[0]
            via = "" if missing == top else f", needed by {top}"
            lines.append(f"{missing}: missing ({type(e).__name__}: {e}){via}, imported by {users[0]}; "
                         f"{bringer(missing)}")
            continue
        for dist in sorted({canonical(d) for d in owners.get(top, [])}):
            try:
                have = Version(metadata.version(dist))
            except (metadata.PackageNotFoundError, ValueError):
                continue
            spec = needs.get(dist, "")
            wheel = [(v, w) for d, v, w in carried.get(top, []) if canonical(d) == dist and _fits(w)]
            if spec and not SpecifierSet(spec).contains(have, prereleases=True):
                lines.append(f"{top}: {dist} {have} is too old (pyproject.toml: {dist}{spec}), imported by "
                             f"{users[0]}; {bringer(top)}")
            elif wheel and Version(wheel[0][0]) > have:
                lines.append(f"{top}: {dist} {have} is imported, older than the carried {wheel[0][1].name} (is its "
                             f"folder first on PYTHONPATH?)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_preflight.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="the carried wheels (default: .whl)")
    args = ap.parse_args(argv)
    modules = third_party()
    lines = problems(modules, args.wheels)
    for line in lines:
        print(f"preflight: {line}", file=sys.stderr)
    if lines:
        return 2
    print(f"preflight: {len(modules)} third-party modules import with {sys.executable} "
          f"({sys.version.split()[0]}), each new enough")
    return 0


if __name__ == "__main__":
    sys.exit(main())
