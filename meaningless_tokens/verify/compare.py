"""Two copies of an output file, compared by value: one comparer per file type, each float within the tolerance of
its kind of quantity (meaningless_tokens/verify/kinds.py). Pure: it reads the two files it is given, nothing of git, DVC or dvc.lock
(meaningless_tokens/verify/driver.py finds the files).

Metrics and other JSON are compared number by number, HDF5 files dataset by dataset (shape, dtype, values,
attributes except the declared provenance keys), CSV tables cell by cell, each float within the tolerance of its
kind of quantity (TOLERANCES, `numpy.isclose`: |a - b| <= atol + rtol * |b|); counts, token ids, grades and text
exactly, text as store.read_texts decodes it; a count past a threshold and a rank statistic's p-value (kinds `count`
and `rank-p`) within the float noise recorded beside it (`<name>_noise`: meaningless_tokens/noise.py), a p-value's
decision at ALPHA exactly. A difference of structure (an object, key, shape or dtype on one side only) raises Differs;
a value beyond its tolerance in files otherwise alike is kept in a Largest (`beyond`: judged by the conclusions,
verify/conclusions.py), as is the largest one within tolerance; a key, dataset or attribute only the workspace has is
kept as `added`, not a difference.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meaningless_tokens import store
from meaningless_tokens.errors import ArtifactError, Beyond, Differs
from meaningless_tokens.tolerances import ALPHA, NOISE
# BOUNDED: kinds compared within the noise recorded beside each value (`<name>_noise`), not within a float tolerance
from meaningless_tokens.verify.kinds import BOUNDED, PRINTED, TOLERANCES, VERDICT, _match, kind_of


# A text dataset's attributes that say how its elements are escaped (store.put_texts): left out, as the texts are
# compared decoded.
TEXT_ATTRS = ("escape", "escaped")
# Keys of the provenance attribute (and model manifests) that name the code and environment, not the result:
# left out of the comparison, as h5diff's --exclude-attribute would.
PROVENANCE_KEYS = frozenset({"code_sha256", "libraries", "environment", "package_version"})
# Wall times inside a result file (file glob, key glob): the verdict's power section says how long the run took
# and what more problems would cost; left out of the comparison, as the run records (kinds.RUN_RECORDS) are.
RUN_KEYS = ((VERDICT, "*seconds*"), (VERDICT, "*hours*"))
# What names the code inside a text, not a result: a module or stage path (`meaningless_tokens/arm/hook.py`,
# `meaningless_tokens.scoring`, `stages/likelihood.py`) and a git commit. Set aside where a text describes a
# result (a dataset's `definitions` attribute) or a page drawn with other code is compared, as PROVENANCE_KEYS are
# in JSON: a module's move renames it, and the result stays.
CODE_NAME = re.compile(r"\bmeaningless_tokens(?:[/.]\w+)*/?|\bstages/\w+(?:\.py)?")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?:-dirty)?\b")


def is_run_key(file: str, key: str) -> bool:
    """Whether `key` of result file `file` is a wall time (RUN_KEYS), not a result."""
    return any(_match(file, key, f, k) for f, k in RUN_KEYS)


def code_names_aside(text: str) -> str:
    return COMMIT.sub("<commit>", CODE_NAME.sub("<code>", text))


# ---- strings that print numbers -------------------------------------------------------------------------

# A printed number: a sign (ASCII or U+2212) only where it starts the number, digits, a fraction, an exponent; not
# part of a word, a name or a dotted version ("gemma3-270m", "Qwen2.5", "verdict.sesoi.g1", "4.57.1"), but one that
# ends a sentence ("p = 0.03.") is
NUMBER = re.compile(r"(?<![\w.])[+\-\u2212]?\d+(?:\.\d+)?(?:[eE][+\-]?\d+)?(?!\w|\.\d)")


def _unit(printed: str) -> float:
    """One unit of the last printed digit: 0.1 for "+4.0", 1 for "100", 1e-06 for "1.2e-05"."""
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _number(printed: str) -> float:
    return float(printed.replace("\u2212", "-"))


def compare_printed(where: str, a: str, b: str) -> None:
    """Two strings that print numbers: equal once each number is a placeholder, and each pair of numbers within one
    unit of the coarser last printed digit (a value on a rounding boundary prints either way); raises Differs."""
    na, nb = NUMBER.findall(a), NUMBER.findall(b)
    if NUMBER.sub("#", a) != NUMBER.sub("#", b) or len(na) != len(nb):
        raise Differs(f"{where}: {a!r} here, {b!r} in the revision (text)")
    for x, y in zip(na, nb):
        if abs(_number(x) - _number(y)) > max(_unit(x), _unit(y)) * (1 + 1e-9):
            raise Beyond(f"{where}: {a!r} here, {b!r} in the revision ({x} vs {y}: more than one unit of the "
                         "last printed digit)")


# ---- comparing values ---------------------------------------------------------------------------------


@dataclass
class Largest:
    """The largest within-tolerance difference seen so far, measured as a share of its tolerance: of all, and per
    kind (`by_kind`: kind -> (share, text); for comparing machines kind by kind); the values beyond their tolerance
    (`beyond`: the first few, `n_beyond` in all; `beyond_by_kind`: kind -> (share, text), the largest) and what only
    the workspace has (`added`)."""
    share: float = -1.0
    text: str = ""
    by_kind: dict[str, tuple[float, str]] = field(default_factory=dict)
    beyond: list[str] = field(default_factory=list)
    n_beyond: int = 0
    beyond_by_kind: dict[str, tuple[float, str]] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)

    def beyond_tolerance(self, text: str, n: int = 1, kind: str = "", share: float = float("inf")) -> None:
        """`n` values beyond their tolerance, the first of them described by `text`, the largest by `share`."""
        self.beyond.append(text)
        self.n_beyond += n
        if kind and share > self.beyond_by_kind.get(kind, (-1.0, ""))[0]:
            self.beyond_by_kind[kind] = (share, text)

    def raise_beyond(self, since: int) -> None:
        """Raise Beyond, naming the first value beyond tolerance kept after the first `since`, if any was."""
        if len(self.beyond) > since:
            raise Beyond(self.beyond[since])

    def offer(self, where: str, a: float, b: float, kind: str) -> None:
        tol = TOLERANCES[kind]
        allowed = tol.atol + tol.rtol * abs(b)
        if a != b:
            self.offer_at(where, a, b, kind, abs(a - b) / allowed if allowed else 0.0)

    def offer_at(self, where: str, a: float, b: float, kind: str, share: float) -> None:
        """A difference whose share of what its tolerance allows is already measured (a bounded kind's)."""
        diff = abs(a - b)
        rel = f", relative {diff / abs(b):.1e}" if b else ""
        self.offer_share(share, kind, f"{where}: {a!r} here, {b!r} in the revision (|diff| {diff:.1e}{rel}; {kind})")

    def offer_share(self, share: float, kind: str, text: str) -> None:
        """A difference already measured as a share of what its tolerance allows (the reference's blocks)."""
        self._offer(share, kind, text)

    def _offer(self, share: float, kind: str, text: str) -> None:
        if share > 0 and share > self.share:
            self.share, self.text = share, text
        if share > 0 and share > self.by_kind.get(kind, (-1.0, ""))[0]:
            self.by_kind[kind] = (share, text)


def _index(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]" if len(idx) else ""


def compare_arrays(where: str, a: np.ndarray, b: np.ndarray, kind: str, largest: Largest,
                   noise: tuple = (None, None)) -> None:
    """`a` (workspace) against `b` (the revision): exact unless both are floats or the kind is bounded by the noise
    recorded beside them (`noise`: each side's `<name>_noise`, or None); raises Differs for another shape or dtype,
    keeps a value beyond tolerance in `largest`."""
    if a.shape != b.shape:
        raise Differs(f"{where}: shape {a.shape} here, {b.shape} in the revision")
    floats = a.dtype.kind == "f" and b.dtype.kind == "f"
    if a.dtype != b.dtype and not (floats and a.dtype.itemsize == b.dtype.itemsize):
        raise Differs(f"{where}: dtype {a.dtype} here, {b.dtype} in the revision")
    if kind == "noise":
        return  # a bound, not a result: it sets the tolerance of the value it names
    bounded = kind in BOUNDED and a.dtype.kind in "iuf"
    if not (floats or bounded) or kind == "exact":
        if a.dtype.kind == "f":
            bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        else:
            bad = a != b
        bad = np.asarray(bad)
        if bad.any():
            i = tuple(np.argwhere(bad)[0]) if bad.ndim else ()
            largest.beyond_tolerance(f"{where}{_index(i)}: {_item(a, i)!r} here, {_item(b, i)!r} in the revision "
                                     "(exact)", int(bad.sum()), "exact")
        return
    tol = TOLERANCES[kind]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    allow = tol.atol + tol.rtol * np.abs(np.nan_to_num(b64))
    bound = _bound(noise, a.shape, where) if bounded else None
    if bound is not None:
        allow = allow + bound
    both_nan = np.isnan(a64) & np.isnan(b64)
    diff = np.where(both_nan, 0.0, np.abs(a64 - b64))
    close = (diff <= allow) | both_nan | (a64 == b64)
    what = f"{kind}: atol {tol.atol:g}, rtol {tol.rtol:g}" + ("" if bound is None else f", its noise {NOISE[1:]}")
    if kind == "rank-p":  # the decision at the study's alpha, exactly
        decided = (a64 < ALPHA) == (b64 < ALPHA)
        if not np.all(decided | both_nan):
            i = tuple(np.argwhere(~(decided | both_nan))[0]) if a.ndim else ()
            largest.beyond_tolerance(f"{where}{_index(i)}: {_item(a, i)!r} here, {_item(b, i)!r} in the revision "
                                     f"(rank-p: the decision at {ALPHA} differs)", int((~decided).sum()), kind)
            return
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(diff > 0, diff / allow, 0.0)
    if not close.all():
        i = tuple(np.argwhere(~close)[0]) if close.ndim else ()
        extra = "" if bound is None else f" {float(np.broadcast_to(bound, a.shape)[i] if a.ndim else bound):g}"
        largest.beyond_tolerance(f"{where}{_index(i)}: {_item(a, i)!r} here, {_item(b, i)!r} in the revision "
                                 f"({what}{extra})", int((~close).sum()), kind, float(np.max(np.where(close, 0, share))))
        return
    if diff.size and diff.max() > 0:
        i = np.unravel_index(int(np.argmax(share)), share.shape) if share.ndim else ()
        largest.offer_at(f"{where}{_index(i)}", float(a64[i]), float(b64[i]), kind, float(share[i]))


def _bound(noise: tuple, shape: tuple, where: str):
    """The larger of both sides' recorded noise, element by element (one side's where only it has one), else None."""
    sides = [np.asarray(n, dtype=np.float64) for n in noise if n is not None]
    for n in sides:
        if n.shape != shape:
            raise Differs(f"{where}{NOISE}: shape {n.shape}, its value's {shape}")
    return np.maximum.reduce(sides) if sides else None


def _item(x: np.ndarray, i: tuple):
    v = x[i] if i else x[()]
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, str) and len(v) > 60:
        v = v[:57] + "..."
    return v


def compare_json(file: str, a, b, largest: Largest, path: str = "", noise: tuple = (None, None)) -> None:
    """Two parsed JSON values, key by key; numbers within their kind's tolerance (a count's or a rank statistic's
    within the `<key>_noise` beside it), strings of kind `printed` by compare_printed. A key only the revision has, a
    list's length or a value's type raises Differs; a key only the workspace has is `added`; a value beyond its
    tolerance is kept in `largest`, and the whole file's (`path` empty) first one raised as Beyond at the end."""
    where = path or "(top level)"
    if path and is_run_key(file, path):
        return
    if not path:  # the whole file: every value compared, then the first beyond tolerance raised
        since = len(largest.beyond)
        _json(file, a, b, largest, path, noise, where)
        largest.raise_beyond(since)
        return
    _json(file, a, b, largest, path, noise, where)


def _json(file: str, a, b, largest: Largest, path: str, noise: tuple, where: str) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        keys_a, keys_b = set(a) - PROVENANCE_KEYS, set(b) - PROVENANCE_KEYS
        if keys_b - keys_a:
            raise Differs(f"{file}: key {_join(path, sorted(keys_b - keys_a)[0])}: in the revision, not here")
        largest.added += [f"{file}: key {_join(path, k)}" for k in sorted(keys_a - keys_b, key=str)]
        for k in sorted(keys_a & keys_b, key=str):
            companion = f"{k}{NOISE}" if isinstance(k, str) else None
            compare_json(file, a[k], b[k], largest, _join(path, k),
                         (a.get(companion), b.get(companion)) if companion else (None, None))
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise Differs(f"{file}: {where}: {len(a)} items here, {len(b)} in the revision")
        for i, (x, y) in enumerate(zip(a, b)):
            compare_json(file, x, y, largest, f"{path}[{_item_name(x, y, i)}]")
    elif _is_float(a) and _is_float(b):
        kind = kind_of(file, path)
        if isinstance(a, float) or isinstance(b, float) or kind in BOUNDED:
            compare_arrays(f"{file}: {where}", np.float64(a), np.float64(b), kind, largest,
                           tuple(None if not _is_float(n) else np.float64(n) for n in noise))
        elif a != b:
            largest.beyond_tolerance(f"{file}: {where}: {a!r} here, {b!r} in the revision (exact)", 1, "exact")
    elif isinstance(a, str) and isinstance(b, str) and a != b:
        if kind_of(file, path) == PRINTED:
            try:
                compare_printed(f"{file}: {where}", a, b)
            except Beyond as e:
                largest.beyond_tolerance(str(e), 1, PRINTED)
            except Differs as e:  # other words around the numbers: a value (a sentence), not the file's structure
                largest.beyond_tolerance(str(e), 1, "exact")
        else:
            largest.beyond_tolerance(f"{file}: {where}: {a!r} here, {b!r} in the revision (exact)", 1, "exact")
    elif type(a) is not type(b) and not (a is None or b is None or (_is_float(a) and _is_float(b))):
        raise Differs(f"{file}: {where}: {a!r} here, {b!r} in the revision (another type)")
    elif a != b:
        largest.beyond_tolerance(f"{file}: {where}: {a!r} here, {b!r} in the revision (exact)", 1, "exact")


def _item_name(x, y, i: int):
    """A list item's name in a key: its `key` where both sides' item is an object with the same one (the verdict's
    claims: `claims[b]`, so a kind follows the claim, not its place), else its index."""
    if isinstance(x, dict) and isinstance(y, dict) and isinstance(x.get("key"), str) and x.get("key") == y.get("key"):
        return x["key"]
    return i


def _is_float(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def compare_csv(file: str, a: str, b: str, largest: Largest) -> None:
    """Two CSV tables cell by cell (columns only the workspace has, last, are `added`); raises Differs for another
    header or row count, Beyond at the end for the first value beyond tolerance."""
    since = len(largest.beyond)
    _csv(file, a, b, largest)
    largest.raise_beyond(since)


def _csv(file: str, a: str, b: str, largest: Largest) -> None:
    rows_a, rows_b = list(csv.reader(io.StringIO(a))), list(csv.reader(io.StringIO(b)))
    if not rows_a or not rows_b:
        raise Differs(f"{file}: header {rows_a[:1]} here, {rows_b[:1]} in the revision")
    header_a, header = rows_a[0], rows_b[0]
    if header_a[:len(header)] != header:  # columns only the workspace has come last: added
        raise Differs(f"{file}: header {rows_a[:1]} here, {rows_b[:1]} in the revision")
    largest.added += [f"{file}: column {c}" for c in header_a[len(header):]]
    if len(rows_a) != len(rows_b):
        raise Differs(f"{file}: {len(rows_a) - 1} rows here, {len(rows_b) - 1} in the revision")
    for r, (ra, rb) in enumerate(zip(rows_a[1:], rows_b[1:]), start=1):
        if len(ra) != len(header_a) or len(rb) != len(header):
            raise Differs(f"{file}: row {r}: {len(ra)} cells here, {len(rb)} in the revision")
        cells_a, cells_b = dict(zip(header_a, ra)), dict(zip(header, rb))
        for column in header:
            x, y = cells_a[column], cells_b[column]
            if x == y:
                continue
            fx, fy = _float(x), _float(y)
            where = f"{file}: row {r}, column {column}"
            if fx is None or fy is None:
                largest.beyond_tolerance(f"{where}: {x!r} here, {y!r} in the revision (exact)", 1, "exact")
                continue
            noise = tuple(_float(c.get(f"{column}{NOISE}", "")) for c in (cells_a, cells_b))
            compare_arrays(where, np.float64(fx), np.float64(fy), kind_of(file, column), largest,
                           tuple(None if n is None else np.float64(n) for n in noise))


def _float(s: str):
    try:
        return float(s)
    except ValueError:
        return None


def compare_h5(file: str, path_a: Path, path_b: Path, largest: Largest, reduced=None, skip_attrs: tuple = ()) -> None:
    """Two HDF5 files, as h5diff would: the same objects, each dataset's shape, dtype and values, and every
    attribute except the provenance keys (PROVENANCE_KEYS inside the `provenance` attribute). `reduced(file, name,
    dataset_a, dataset_b, largest)`, where given, compares a dataset `path_b` holds in another form (the
    reference's blocks: verify/reference.py) and returns False for one held whole; `skip_attrs` are its own."""
    import h5py

    def open_(p: Path, side: str):
        try:
            return h5py.File(p, "r")
        except OSError as e:
            raise Differs(f"{file}: not a readable HDF5 file {side} (truncated or corrupt?): {e}") from None

    since = len(largest.beyond)
    fa = open_(path_a, "here")
    try:
        fb = open_(path_b, "in the revision")
        try:
            names_a, names_b = _objects(fa), _objects(fb)
            gone, new = sorted(set(names_b) - set(names_a)), sorted(set(names_a) - set(names_b))
            if gone:
                raise Differs(f"{file}: {gone[0]}: in the revision, not here")
            # what only the workspace has (a dataset a newer stage adds): added, inside a group added once
            largest.added += [f"{file}: {n}" for n in new if n.rpartition("/")[0] not in new]
            for name in names_b:
                oa, ob = (fa[name], fb[name]) if name != "/" else (fa, fb)
                if names_b[name] != names_a[name]:
                    raise Differs(f"{file}: {name}: a {names_a[name]} here, a {names_b[name]} in the revision")
                texts = names_b[name] == "dataset" and _is_text(oa) and _is_text(ob)
                # texts are compared decoded (store.read_texts): how an element was escaped is not its value
                _compare_attrs(file, name, oa, ob, largest, skip=(TEXT_ATTRS if texts else ()) + skip_attrs)
                if names_b[name] == "dataset" and reduced is not None and reduced(file, name, oa, ob, largest):
                    continue
                if names_b[name] == "dataset":
                    try:
                        va, vb = (store.read_texts(oa), store.read_texts(ob)) if texts else (oa[()], ob[()])
                    except (OSError, KeyError, ValueError, ArtifactError) as e:
                        raise Differs(f"{file}: {name}: cannot be read (truncated or corrupt?): {e}") from None
                    kind = kind_of(file, name)
                    noise = ((_read(fa, f"{name}{NOISE}"), _read(fb, f"{name}{NOISE}")) if kind in BOUNDED
                             else (None, None))
                    compare_arrays(f"{file}: {name}", np.asarray(va), np.asarray(vb), kind, largest, noise)
        finally:
            fb.close()
    finally:
        fa.close()
    largest.raise_beyond(since)


def _read(f, name: str):
    """Dataset `name` of file `f`, or None where it has none (a revision made before the stage recorded it)."""
    import h5py

    obj = f.get(name)
    return obj[()] if isinstance(obj, h5py.Dataset) else None


def _objects(f) -> dict[str, str]:
    import h5py

    names = {"/": "group"}
    try:
        f.visititems(lambda n, o: names.__setitem__(n, "dataset" if isinstance(o, h5py.Dataset) else "group"))
    except (OSError, KeyError, RuntimeError) as e:
        raise Differs(f"{f.filename}: cannot list its objects (truncated or corrupt?): {e}") from None
    return names


def _is_text(ds) -> bool:
    import h5py

    return h5py.check_string_dtype(ds.dtype) is not None


def _compare_attrs(file: str, name: str, oa, ob, largest: Largest, skip: tuple[str, ...] = ()) -> None:
    ka, kb = set(oa.attrs) - set(skip), set(ob.attrs) - set(skip)
    if kb - ka:
        raise Differs(f"{file}: {name} attribute {sorted(kb - ka)[0]}: in the revision, not here")
    largest.added += [f"{file}: {name} attribute {k}" for k in sorted(ka - kb)]
    for key in sorted(ka & kb):
        a, b = oa.attrs[key], ob.attrs[key]
        where = f"{name} attribute {key}" if name != "/" else f"attribute {key}"
        ja, jb = _as_json(a), _as_json(b)
        if ja is not None and jb is not None:
            since = len(largest.beyond)
            compare_json(file, ja, jb, largest, where)
            if key == "provenance" and len(largest.beyond) > since:
                # the params, model, dataset or tokenizer the output was made from: another run, not float noise
                first = largest.beyond[since]
                largest.n_beyond -= len(largest.beyond) - since
                del largest.beyond[since:]
                raise Differs(f"{first} (what the output was made from)")
        elif _text(a) is not None and _text(b) is not None:
            ta, tb = code_names_aside(_text(a)), code_names_aside(_text(b))
            if ta != tb:
                added = added_lines(ta, tb)
                if added is None:
                    raise Differs(f"{file}: {where}: {first_difference(ta, tb)} (text, the code's names set aside)")
                largest.added.append(f"{file}: {where}: {len(added)} line(s), first {added[0].strip()[:60]!r}")
        else:
            compare_arrays(f"{file}: {where}", np.asarray(a), np.asarray(b), kind_of(file, f"{name}@{key}"), largest)


def _text(v) -> str | None:
    """An attribute's text (a str, bytes or a 0-d string array), else None."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "US":
        v = v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


def added_lines(a: str, b: str) -> list[str] | None:
    """The lines text `a` adds to `b` where it keeps every line of `b` in order (a definition that now describes
    more datasets), else None."""
    la, lb = a.splitlines(), b.splitlines()
    ops = difflib.SequenceMatcher(None, lb, la, autojunk=False).get_opcodes()
    if any(op not in ("equal", "insert") for op, *_ in ops):
        return None
    return [line for op, _, _, j1, j2 in ops if op == "insert" for line in la[j1:j2]]


def first_difference(a: str, b: str, width: int = 60) -> str:
    """Where two texts first differ, a little of each around it."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - width // 2)
    return f"{a[lo:i + width // 2]!r} here, {b[lo:i + width // 2]!r} in the revision (at character {i})"


def _as_json(v):
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, str) and v[:1] in "{[":
        try:
            return json.loads(v)
        except ValueError:
            return None
    return None


def compare_file(file: str, path_a: Path, path_b: Path, largest: Largest) -> None:
    """One file of an output, by its type; raises Differs at a difference of structure, Beyond once every value is
    compared where one is beyond its tolerance (all of them kept in `largest`)."""
    suffix = Path(file).suffix
    if suffix in (".h5", ".hdf5"):
        compare_h5(file, path_a, path_b, largest)
        return
    a, b = path_a.read_bytes(), path_b.read_bytes()
    if suffix == ".json":
        try:
            ja = json.loads(a)
        except ValueError as e:
            raise Differs(f"{file}: not valid JSON here: {e}") from None
        compare_json(file, ja, json.loads(b), largest)
    elif suffix == ".csv":
        compare_csv(file, a.decode("utf-8", "replace"), b.decode("utf-8", "replace"), largest)
    elif a != b:
        raise Differs(f"{file}: the bytes differ (compared byte for byte: no reader of values for '{suffix}')")


def changed_keys(a, b, prefix: str = "") -> list[str]:
    """The dotted keys at which two nested dicts (a stage's params) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [k for key in sorted(set(a) | set(b), key=str)
                for k in changed_keys(a.get(key), b.get(key), _join(prefix, key))]
    return [] if a == b else [prefix]
