"""Writing artifacts: atomic (temporary file, then rename) and deterministic."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from stages.config import StageError


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike):
    """Yield a temporary path beside `final`; rename it onto `final` only if the block succeeds.

    A crash or Ctrl-C leaves the old `final` (or nothing) in place, never a half-written file.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | os.PathLike, data) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


# ---- HDF5 -------------------------------------------------------------------------------------

FORMAT_VERSION = 1


class ArtifactError(StageError):
    """An artifact a stage reads is missing, corrupt, truncated or of another format; names the file."""


@contextlib.contextmanager
def write_h5(final: str | os.PathLike):
    """An HDF5 file opened for writing at a temporary path, renamed onto `final` on success.

    Fixed library version bounds and no timestamps, so equal inputs give byte-identical files."""
    import h5py

    with atomic_path(final) as tmp:
        with h5py.File(tmp, "w", libver=("earliest", "v110"), track_order=True) as f:
            f.attrs["format_version"] = FORMAT_VERSION
            yield f


def put(group, name: str, data, compress: bool = True, **attrs):
    """A dataset with fixed dtype, chunked + gzip-compressed when large enough, no timestamps."""
    import numpy as np

    data = np.asarray(data)
    kw = {}
    if compress and data.size >= 1024:
        kw = dict(compression="gzip", compression_opts=4, shuffle=True, chunks=True)
    ds = group.create_dataset(name, data=data, track_times=False, **kw)
    for k, v in attrs.items():
        ds.attrs[k] = v
    return ds


def put_json_attr(obj, name: str, value) -> None:
    obj.attrs[name] = json.dumps(value, sort_keys=True, ensure_ascii=False)


@contextlib.contextmanager
def read_h5(path: str | os.PathLike, kind: str, required: tuple[str, ...] = ()):
    """Open an artifact for reading; every failure is an ArtifactError naming the file."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: missing (run the stage that writes it: dvc repro)")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ArtifactError(f"{path}: not a readable HDF5 file (corrupt or truncated?): {e}") from None
    try:
        if f.attrs.get("kind") != kind or f.attrs.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{path}: expected a '{kind}' artifact of format {FORMAT_VERSION}, found "
                                f"kind={f.attrs.get('kind')!r} format={f.attrs.get('format_version')!r}")
        missing = [name for name in required if name not in f]
        if missing:
            raise ArtifactError(f"{path}: missing datasets {missing} (truncated or written by another version?)")
        yield f
    except (OSError, KeyError) as e:  # a damaged chunk surfaces only when read
        raise ArtifactError(f"{path}: cannot read ({type(e).__name__}: {e}); corrupt or truncated?") from None
    finally:
        f.close()


CODE_PATHS = ("stages", "pyproject.toml")  # what makes the artifacts: git_commit is the last commit touching them


def provenance() -> dict:
    """Package version, git commit of the code and library versions (the run-independent part).

    `git_commit` is the last commit that changed the code (CODE_PATHS), not HEAD: committing results
    (dvc.lock, metrics) or params moves HEAD, and a rerun after that must give byte-identical
    artifacts, or DVC would rerun every downstream stage. `git_dirty` says the code had uncommitted
    changes (then the commit alone does not identify it)."""
    import subprocess
    from importlib import metadata

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("log", "-1", "--format=%H", "--", *CODE_PATHS) or "unknown"
        dirty = bool(git("status", "--porcelain", "--", *CODE_PATHS))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", None
    libs = {}
    for lib in ("torch", "transformers", "tokenizers", "h5py", "numpy", "math-verify", "dvc"):
        try:
            libs[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    try:
        version = metadata.version("meaningless-tokens")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"package_version": version, "git_commit": commit, "git_dirty": dirty, "libraries": libs}
