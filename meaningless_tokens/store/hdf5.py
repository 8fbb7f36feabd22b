"""HDF5 artifacts: deterministic writing (fixed library bounds, no timestamps, checksummed datasets) and reading that
refuses a file of another kind, stage, model or params."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from meaningless_tokens.errors import ArtifactError, NonFiniteError
from meaningless_tokens.store.files import atomic_path, fs_error
from meaningless_tokens.store.view import stage_params


FORMAT_VERSION = 1


_WRITING: dict[str, Path] = {}  # temporary file name -> the artifact it becomes, while write_h5 holds it open


@contextlib.contextmanager
def write_h5(final: str | os.PathLike):
    """An HDF5 file opened for writing at a temporary path, renamed onto `final` on success.

    Fixed library version bounds and no timestamps, so equal inputs give byte-identical files. The file is built
    in memory (HDF5's core driver, no backing store) and its image written out with plain file I/O: a full or
    read-only disk is then one OutputError naming `final`, never an HDF5 library that fails to flush its
    caches at close and crashes the interpreter at exit (as it did with the disk driver)."""
    import h5py

    final = Path(final)
    with atomic_path(final) as tmp:
        f = h5py.File(tmp.name, "w", driver="core", backing_store=False, libver=("earliest", "v110"),
                      track_order=True)
        key = f.filename
        _WRITING[key] = final
        try:
            f.attrs["format_version"] = FORMAT_VERSION
            yield f
            f.flush()
            image = f.id.get_file_image()
        finally:
            _WRITING.pop(key, None)
            _close_quietly(f)
        try:
            with open(tmp, "wb") as out:
                out.write(image)
        except OSError as e:
            raise fs_error(e, final) from None


def _close_quietly(f) -> None:
    try:
        f.close()
    except Exception:  # noqa: BLE001 - the write already failed; that error is the one reported
        pass


def check_finite(data, where: str) -> None:
    """Raise NonFiniteError naming `where` and the first non-finite value's index, if `data` holds one."""
    import numpy as np

    data = np.asarray(data)
    if data.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(data)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), data.shape) if data.ndim else ()
        raise NonFiniteError(f"{where}: non-finite value {data[first].item()!r} at index {list(map(int, first))} "
                             f"({int(bad.sum())} of {data.size} values)")


def put(group, name: str, data, compress: bool = True, **attrs):
    """A dataset with fixed dtype, chunked + gzip-compressed when large enough, fletcher32-checksummed (a flipped
    byte is a read error, not a number), no timestamps. NaN or infinity is refused (NonFiniteError)."""
    import numpy as np

    data = np.asarray(data)
    final = _WRITING.get(group.file.filename, group.file.filename)
    check_finite(data, f"{final}: {group.name.rstrip('/')}/{name}")
    kw = {}
    if data.dtype.kind == "O":  # variable-length strings: the checksum would cover only their heap pointers
        if compress and data.size >= 1024:
            kw = dict(compression="gzip", compression_opts=4, shuffle=True, chunks=True)
    elif data.size and data.ndim:  # fletcher32 needs a chunked layout: small arrays are one chunk
        kw = dict(chunks=True if data.size >= 1024 else data.shape, fletcher32=True)
        if compress and data.size >= 1024:
            kw |= dict(compression="gzip", compression_opts=4, shuffle=True)
    ds = group.create_dataset(name, data=data, track_times=False, **kw)
    for k, v in attrs.items():
        ds.attrs[k] = v
    return ds


def put_json_attr(obj, name: str, value) -> None:
    obj.attrs[name] = json.dumps(value, sort_keys=True, ensure_ascii=False)


@contextlib.contextmanager
def read_h5(path: str | os.PathLike, kind: str, required: tuple[str, ...] = (), model: str | None = None,
            params=None):
    """Open an artifact for reading; every failure is an ArtifactError naming the file.

    The artifact must be of `kind`, written by that kind's stage, and of `model` (by default, at
    `artifacts/<kind>/<model>.h5`, the model its file name says): another model's file copied in place is refused.
    With `params`, the params values it records (its stage's dvc.yaml keys) must be today's: a stale artifact,
    or one made by another experiment, is refused naming the first key that differs."""
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
        _check_origin(f, path, kind, model, params)
        missing = [name for name in required if name not in f]
        if missing:
            raise ArtifactError(f"{path}: missing datasets {missing} (truncated or written by another version?)")
        yield f
    except (OSError, KeyError) as e:  # a damaged chunk surfaces only when read
        raise ArtifactError(f"{path}: cannot read ({type(e).__name__}: {e}); corrupt or truncated?") from None
    finally:
        f.close()


KIND_STAGE = {"attention": "extract", "eval": "evaluate"}  # the stage that writes an artifact kind, where its name differs


def _check_origin(f, path: Path, kind: str, model: str | None, params=None) -> None:
    import json as _json

    if model is None and path.parent.name == kind:  # the artifact's own place: artifacts/<kind>/<model>.h5
        model = path.stem
    found = f.attrs.get("model")
    if model is not None and found is not None and str(found) != model:
        raise ArtifactError(f"{path}: written for model '{found}', read as model '{model}' (another model's file "
                            f"copied in place?); rerun its stage: dvc repro")
    try:
        stage = _json.loads(f.attrs["provenance"]).get("stage") if "provenance" in f.attrs else None
    except (ValueError, TypeError, AttributeError):
        raise ArtifactError(f"{path}: its provenance attribute is not JSON (corrupt or written by another tool?)") from None
    want = KIND_STAGE.get(kind, kind)
    if stage is not None and stage != want:
        raise ArtifactError(f"{path}: written by stage '{stage}', expected '{want}'")
    if params is not None and "provenance" in f.attrs:
        recorded = _json.loads(f.attrs["provenance"]).get("params")
        name = str(found) if found is not None else model
        if recorded is not None:
            now = _json.loads(_json.dumps(stage_params(params, want, name), ensure_ascii=False))
            differs = _first_difference(recorded, now)
            if differs:
                key, old, new = differs
                raise ArtifactError(f"{path}: made with other params ({key}: {_json.dumps(old, ensure_ascii=False)} vs "
                                    f"{_json.dumps(new, ensure_ascii=False)})")


def _first_difference(recorded, now, prefix: str = ""):
    """(dotted key, recorded value, today's value) of the first leaf that differs, or None. A key recorded as
    absent or null where today's params hold a section is one the writer did not read (e.g. `arm` with no arm
    condition): the keys that decided that (the conditions, the sample counts) are compared themselves."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in recorded:
            if key in now:
                found = _first_difference(recorded[key], now[key], f"{prefix}{key}.")
                if found:
                    return found
        return None
    if recorded is None and isinstance(now, dict):
        return None
    return None if recorded == now else (prefix.rstrip("."), recorded, now)
