"""HDF5 artifacts: deterministic writing (fixed library bounds, no timestamps, checksummed datasets), reading that
refuses a file of another kind, stage, model or params, and texts that round-trip every character (`put_texts`,
`read_texts`)."""

from __future__ import annotations

import contextlib
import functools
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


def check_finite(data, where: str, read: bool = False) -> None:
    """Raise NonFiniteError naming `where` and the first non-finite value's index, if `data` holds one (`read`: in
    an artifact being read, which its stage never writes: the file was changed since)."""
    import numpy as np

    data = np.asarray(data)
    if data.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(data)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), data.shape) if data.ndim else ()
        why = "; no stage writes one: the file was changed after its stage wrote it (dvc repro reruns that stage)" \
            if read else ""
        raise NonFiniteError(f"{where}: non-finite value {data[first].item()!r} at index {list(map(int, first))} "
                             f"({int(bad.sum())} of {data.size} values){why}")


def put(group, name: str, data, compress: bool = True, **attrs):
    """A dataset with fixed dtype, chunked + gzip-compressed when large enough, fletcher32-checksummed (a flipped
    byte is a read error, not a number), no timestamps. NaN or infinity is refused (NonFiniteError)."""
    import numpy as np

    data = np.asarray(data)
    check_finite(data, _where(group, name))
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


def _where(group, name: str) -> str:
    """"<artifact>: <dataset>", naming the file being written by the artifact it becomes."""
    return f"{_WRITING.get(group.file.filename, group.file.filename)}: {group.name.rstrip('/')}/{name}"


# HDF5's variable-length strings are UTF-8 without NUL: h5py refuses a text holding NUL or a lone surrogate (no
# UTF-8 form), and a model can write either. Such an element is stored as its JSON string literal (ASCII) and
# listed in the dataset's `escaped` attribute; a dataset with nothing to escape is written as plain strings with
# no extra attribute, byte for byte as before.
TEXT_ESCAPE = ("json: the elements at the flat (C-order) indices in the attribute `escaped` hold json.dumps(text) "
               "(ASCII), as HDF5 strings cannot hold NUL or lone surrogates; meaningless_tokens.store.read_texts "
               "decodes them")


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def put_texts(group, name: str, texts, compress: bool = True, **attrs):
    """A dataset of texts (any shape) that round-trips every character: read it with `read_texts`."""
    import numpy as np

    data = np.array(texts, dtype=object)
    flat = data.reshape(-1)  # a view: escaping an element of `flat` escapes it in `data`
    escaped = []
    for i, text in enumerate(flat):
        if not isinstance(text, str):
            index = list(map(int, np.unravel_index(i, data.shape)))
            raise TypeError(f"{_where(group, name)}: element {index} is a {type(text).__name__}, not a str")
        if not _storable(text):
            flat[i] = json.dumps(text, ensure_ascii=True)
            escaped.append(i)
    if escaped:
        attrs = {**attrs, "escape": TEXT_ESCAPE, "escaped": np.array(escaped, dtype=np.int64)}
    return put(group, name, data, compress=compress, **attrs)


def read_texts(ds):
    """A dataset of texts as an array of str of its shape, escaped elements decoded (`put_texts`). Its dtype is
    object: numpy's fixed-width str would drop a text's trailing NULs. Damage is an ArtifactError naming the file
    and the dataset."""
    import h5py
    import numpy as np

    where = f"{ds.file.filename}: {ds.name}"
    if h5py.check_string_dtype(ds.dtype) is None:
        raise ArtifactError(f"{where}: not a dataset of texts (dtype {ds.dtype})")
    try:
        texts = np.array(ds.asstr()[()], dtype=object)
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{where}: not UTF-8 text ({e}); corrupt or written by another tool?") from None
    if "escaped" not in ds.attrs and "escape" not in ds.attrs:
        return texts
    scheme = ds.attrs.get("escape")
    scheme = scheme.decode() if isinstance(scheme, bytes) else scheme
    if not isinstance(scheme, str) or scheme.split(":")[0] != "json" or "escaped" not in ds.attrs:
        raise ArtifactError(f"{where}: attributes escape={scheme!r} and escaped do not describe the JSON escape "
                            f"this version reads (written by another version?)")
    index = np.asarray(ds.attrs["escaped"])
    flat = texts.reshape(-1)
    if (index.ndim != 1 or index.dtype.kind not in "iu" or len(np.unique(index)) != index.size
            or (index.size and not 0 <= index.min() <= index.max() < flat.size)):
        raise ArtifactError(f"{where}: attribute escaped is not a list of distinct element indices below {flat.size}: "
                            f"{index.tolist()!r}")
    for i in index.tolist():
        try:
            text = json.loads(flat[i])
        except ValueError:
            text = None
        if not isinstance(text, str):
            raise ArtifactError(f"{where}: element {i} (attribute escaped) is not a JSON string literal: "
                                f"{flat[i][:80]!r}")
        flat[i] = text
    return texts


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
        yield checked(f, path)
    except (OSError, KeyError) as e:  # a damaged chunk surfaces only when read
        raise ArtifactError(f"{path}: cannot read ({type(e).__name__}: {e}); corrupt or truncated?") from None
    finally:
        f.close()


def checked(obj, path: Path):
    """An h5py file, group or dataset of the artifact at `path` as h5py's own class made to check what it reads for
    NaN and infinity, as `put` checked it when it was written: a group hands out checking groups and datasets, and a
    dataset's read raises NonFiniteError naming the file, the dataset and the first index. So a value changed after
    its stage wrote it is refused where it is read, never averaged away or drawn as a gap. (No artifact holds a
    non-finite value by design: `put` refuses them all.) Anything else is returned as is."""
    import h5py

    file, group, dataset = _checking_classes()
    for h5, cls in ((h5py.File, file), (h5py.Group, group), (h5py.Dataset, dataset)):
        if isinstance(obj, h5):
            out = cls(obj.id)
            out._artifact = path
            return out
    return obj


@functools.cache
def _checking_classes():
    import h5py
    import numpy as np

    class Checks:  # a group's or file's members read through `checked`
        def __getitem__(self, name):
            return checked(super().__getitem__(name), self._artifact)

        def visititems(self, func):
            return super().visititems(lambda key, obj: func(key, checked(obj, self._artifact)))

    class CheckedFile(Checks, h5py.File):
        pass

    class CheckedGroup(Checks, h5py.Group):
        pass

    class CheckedDataset(h5py.Dataset):
        def __getitem__(self, args, new_dtype=None):
            data = super().__getitem__(args, new_dtype=new_dtype)
            check_finite(data, f"{self._artifact}: {self.name}", read=True)
            return data

        def __array__(self, dtype=None, copy=None):
            return np.asarray(self[()], dtype=dtype)

    return CheckedFile, CheckedGroup, CheckedDataset


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
