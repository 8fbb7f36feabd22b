"""The reference: what `make verify` compares a rerun with where the revision's outputs are in no DVC cache or
remote (a fresh clone, another machine). The pipeline makes it (stage `reference`), git keeps it (`reference/`),
and it describes every cached output of the run beside it:

- `manifest.json`: each file's md5 and size, so that an identical file needs nothing more and a folder output's
  DVC listing is known; and how the file is held;
- `whole`: text tables and JSON (CSV, JSON, JSONL) held byte for byte, compared as from the cache;
- `reduced`: an HDF5 file held as a smaller one with the same groups, datasets and attributes. Integers, texts,
  booleans and float datasets of at most SMALL elements are held whole; a larger float dataset is held as two
  numbers per block of each row (a row: one prompt's positions of one layer and head where the group cuts its last
  axis by `offsets`, else the last axis; a block: BLOCK[kind] consecutive positions of a row): the block's sum and
  its first moment about the block's centre, each on a grid of a fraction of the block's tolerance;
- `md5`: figures and pages, which count as reproduced when what they draw is (driver.drawn_from).

A block is reproduced when its sum and moment are within what its elements' tolerances allow, plus half the grid.
So a whole row moved by more than its tolerance is caught, and so is one element, or mass moved within a row,
above the thresholds docs/sharing.md#the-reference states per kind (`guarantees`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from meaningless_tokens import store
from meaningless_tokens.errors import ArtifactError, Differs
from meaningless_tokens.verify.compare import Largest, compare_file, compare_h5
from meaningless_tokens.verify.kinds import TOLERANCES, kind_of

# The folder, relative to the project root. Named here, not in store.PATHS: store is a dependency of every stage.
FOLDER = "reference"
FORMAT = 1
MANIFEST = "manifest.json"
SMALL = 4096  # a float dataset of at most this many elements is held whole
BLOCK = {"activation": 64}  # positions per block, by kind of quantity; any other kind: DEFAULT_BLOCK
DEFAULT_BLOCK = 32
GRID = (4, 16)  # a block's sum is kept on a grid of block * atol / 4, its moment on one of block**2 * atol / 16
REDUCED = "__reference__"  # the attribute of a reduced dataset: how it was reduced (JSON)
HELD = ("whole", "reduced", "md5")
# Outputs drawn from other outputs (figures, pages): held by md5 alone, reproduced when what they draw is.
DRAWN = (".png", ".svg", ".html", ".md")


def md5_file(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def held_as(file: str) -> str:
    suffix = Path(file).suffix
    return "reduced" if suffix in (".h5", ".hdf5") else "md5" if suffix in DRAWN else "whole"


def block_of(kind: str) -> int:
    return BLOCK.get(kind, DEFAULT_BLOCK)


# ---- blocks of rows ---------------------------------------------------------------------------------------


def block_starts(n: int, offsets, block: int) -> np.ndarray:
    """The first position of every block along a last axis of `n` positions: each row ([offsets[i], offsets[i+1]),
    or the whole axis) cut into blocks of `block` positions, the last one shorter."""
    bounds = [0, n] if offsets is None else [int(o) for o in offsets]
    return np.array([s for a, e in zip(bounds[:-1], bounds[1:]) for s in range(a, e, block)], dtype=np.int64)


def _weights(n: int, starts: np.ndarray) -> np.ndarray:
    """Each position's distance from its block's centre (the moment's weight)."""
    lengths = np.diff(np.append(starts, n))
    local = np.arange(n) - np.repeat(starts, lengths)
    return local - np.repeat((lengths - 1) / 2, lengths)


def block_sums(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(2, rows, blocks): each block's sum and first moment about its centre, in float64."""
    n = x.shape[-1] if x.ndim else 1
    x2 = np.asarray(x, dtype=np.float64).reshape(-1, n)
    if not len(starts):
        return np.zeros((2, x2.shape[0], 0))
    return np.stack([np.add.reduceat(x2, starts, axis=1),
                     np.add.reduceat(x2 * _weights(n, starts), starts, axis=1)])


def block_tolerance(x: np.ndarray, starts: np.ndarray, kind: str) -> np.ndarray:
    """(2, rows, blocks): how far a block's sum and moment may move when every element moves within its tolerance.
    numpy.isclose scales rtol by the revision's value, which is not held: |revision| <= (|here| + atol) / (1 - rtol)
    bounds it from the workspace's."""
    tol = TOLERANCES[kind]
    n = x.shape[-1] if x.ndim else 1
    a = np.abs(np.asarray(x, dtype=np.float64).reshape(-1, n))
    each = tol.atol + tol.rtol * (a + tol.atol) / (1 - tol.rtol)
    if not len(starts):
        return np.zeros((2, a.shape[0], 0))
    # float64 sums of the same values in another order differ by a few ulps of the block's magnitude
    slack = 1e-12 * (np.add.reduceat(a, starts, axis=1) + 1)
    return np.stack([np.add.reduceat(each, starts, axis=1) + slack,
                     np.add.reduceat(each * np.abs(_weights(n, starts)), starts, axis=1) + slack * n])


def grids(kind: str) -> tuple[float, float]:
    block, atol = block_of(kind), TOLERANCES[kind].atol
    return block * atol / GRID[0], block * block * atol / GRID[1]


def guarantees(kind: str, abs_sum: float = 0.0) -> dict[str, float]:
    """The smallest changes a block comparison is sure to catch in a block whose elements' absolute values sum to
    `abs_sum` (it matters only with rtol), whatever the block's other elements do within their tolerance:
    - `row`: a whole row moved by this many times its elements' tolerances, all one way;
    - `element`: one element moved by more than this;
    - `moved`: this much mass moved from one position of a row to another (the row's sum kept)."""
    b, (gs, gm) = block_of(kind), grids(kind)
    tol = TOLERANCES[kind]
    scaled = tol.rtol * (abs_sum + b * tol.atol) / (1 - tol.rtol)  # as block_tolerance bounds the revision's values
    t_sum = b * tol.atol + scaled
    t_moment = tol.atol * sum(abs(k - (b - 1) / 2) for k in range(b)) + scaled * (b - 1) / 2
    # in one block, a move of m from k1 to k2 changes the moment by m * |k2 - k1| >= m; across blocks, both sums by m
    return {"row": 1 + gs / 2 / (b * tol.atol), "element": 2 * t_sum + gs,
            "moved": max(2 * t_sum + gs, 2 * t_moment + gm)}


# ---- writing --------------------------------------------------------------------------------------------


def write(root: Path, files: list[str], out: Path) -> dict:
    """The reference of `files` (paths relative to `root`: every file of every cached output) into folder `out`,
    built beside it and moved into place whole; returns the manifest."""
    staging = out.parent / f".{out.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        entries = {}
        for file in sorted(files):
            src = root / file
            held = held_as(file)
            entry = {"md5": md5_file(src), "size": src.stat().st_size, "held": held}
            if held != "md5":
                dest = staging / file
                dest.parent.mkdir(parents=True, exist_ok=True)
                if held == "whole":
                    shutil.copyfile(src, dest)
                else:
                    reduce_h5(file, src, dest)
                entry["held_md5"] = md5_file(dest)
            entries[file] = entry
        manifest = {"format": FORMAT, "files": entries,
                    "about": "what `make verify` compares a rerun with where the run's cached outputs are out of "
                             "reach: meaningless_tokens/verify/reference.py"}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        old = out.parent / f".{out.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _offsets(group, n: int):
    """The group's `offsets` where they cut an axis of `n` positions into rows (the attention file's prompts)."""
    off = group.get("offsets")
    if off is None or off.ndim != 1 or off.shape[0] < 2 or off.dtype.kind not in "iu":
        return None
    off = off[()]
    return off if off[0] == 0 and off[-1] == n and (np.diff(off) >= 0).all() else None


def _copy_attrs(src, dst) -> None:
    for key in src.attrs:
        dst.attrs.create(key, src.attrs[key], dtype=src.attrs.get_id(key).dtype)


def reduce_h5(file: str, src: Path, dest: Path) -> None:
    """The HDF5 file `src` (the output `file`) held as described in the module's docstring, written to `dest`."""
    import h5py

    try:
        f = h5py.File(src, "r")
    except OSError as e:
        raise ArtifactError(f"{src}: not a readable HDF5 file (truncated or corrupt?): {e}") from None
    with f, store.write_h5(dest) as g:
        _copy_attrs(f, g)

        def visit(name, obj):
            if isinstance(obj, h5py.Group):
                _copy_attrs(obj, g.create_group(name))
                return
            parent = g[obj.parent.name]
            kind = kind_of(file, name)
            if obj.dtype.kind != "f" or obj.size <= SMALL or TOLERANCES[kind].atol == 0:
                # contiguous unless large: a chunk index costs kilobytes per dataset, more than most hold
                big = obj.size > SMALL
                ds = parent.create_dataset(name.rsplit("/", 1)[-1], data=obj[()], dtype=obj.dtype, track_times=False,
                                           **(dict(compression="gzip", compression_opts=9, shuffle=True) if big else {}))
                _copy_attrs(obj, ds)
                return
            x = obj[()]
            store.check_finite(x, f"{file}: {name}")
            offsets = _offsets(obj.parent, x.shape[-1])
            block = block_of(kind)
            starts = block_starts(x.shape[-1], offsets, block)
            gs, gm = grids(kind)
            held = np.rint(block_sums(x, starts) / np.array([gs, gm])[:, None, None])
            dtype = np.int32 if np.abs(held).max(initial=0) < 2**31 - 1 else np.int64
            ds = parent.create_dataset(name.rsplit("/", 1)[-1], data=held.astype(dtype), track_times=False,
                                       compression="gzip", compression_opts=9, shuffle=True,
                                       chunks=True if held.size else None)
            _copy_attrs(obj, ds)
            ds.attrs[REDUCED] = json.dumps({"shape": list(x.shape), "dtype": x.dtype.str, "kind": kind,
                                            "block": block, "grid": [gs, gm],
                                            "rows": "offsets" if offsets is not None else "last axis"})

        f.visititems(visit)


# ---- comparing ------------------------------------------------------------------------------------------


def compare_reduced(file: str, name: str, here, held, largest: Largest) -> bool:
    """Compare the workspace's dataset `here` with its reduced form `held` (raises Differs); False where `held` is
    held whole (the caller compares it as usual)."""
    if REDUCED not in held.attrs:
        return False
    try:
        how = json.loads(held.attrs[REDUCED])
        shape, dtype, block, (gs, gm), rows = (tuple(how["shape"]), np.dtype(how["dtype"]), int(how["block"]),
                                               how["grid"], how["rows"])
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{file}: {name}: attribute {REDUCED}: not a reference's reduction ({e})") from None
    where = f"{file}: {name}"
    if here.shape != shape:
        raise Differs(f"{where}: shape {here.shape} here, {shape} in the revision")
    if here.dtype != dtype and not (here.dtype.kind == "f" == dtype.kind and here.dtype.itemsize == dtype.itemsize):
        raise Differs(f"{where}: dtype {here.dtype} here, {dtype} in the revision")
    x = here[()]
    offsets = None
    if rows == "offsets":
        off = held.parent.get("offsets")
        offsets = off[()] if off is not None else None
        if offsets is None or offsets[-1] != shape[-1]:
            raise ArtifactError(f"{file}: {name}: its rows are cut by the group's offsets, which the reference lacks")
    starts = block_starts(shape[-1], offsets, block)
    grid = np.array([gs, gm])[:, None, None]
    kept = held[()].astype(np.float64) * grid
    if kept.shape != (2, int(np.prod(shape[:-1], dtype=np.int64)), len(starts)):
        raise ArtifactError(f"{file}: {name}: {kept.shape[1:]} blocks held, the shape {shape} has other rows")
    kind = kind_of(file, name)
    got = block_sums(x, starts)
    allowed = block_tolerance(x, starts, kind)
    off = np.abs(got - kept)
    bad = off > allowed + grid / 2
    if bad.any():
        which, r, b = (int(i) for i in np.argwhere(bad)[0])
        end = starts[b + 1] if b + 1 < len(starts) and starts[b + 1] > starts[b] else _row_end(starts[b], offsets, shape[-1])
        row = np.unravel_index(r, shape[:-1]) if len(shape) > 1 else ()
        what = ("sum", "moment about its centre")[which]
        span = f"positions {starts[b]}..{end - 1}"
        if offsets is not None:  # one prompt's positions: say which prompt, and where in it
            p = int(np.searchsorted(offsets, starts[b], side="right")) - 1
            span += f" (prompt {p}'s {starts[b] - offsets[p]}..{end - 1 - offsets[p]})"
        with np.errstate(divide="ignore", invalid="ignore"):
            worst = float(np.max(np.where(bad, (off - grid / 2) / allowed, 0)))
        largest.beyond_tolerance(f"{where}{list(map(int, row)) if row else ''}: {span}: their "
                                 f"{what} {got[which, r, b]:.6g} here, {kept[which, r, b]:.6g} in the reference (allowed "
                                 f"{allowed[which, r, b] + grid[which, 0, 0] / 2:.2g}; {kind}, compared by blocks)",
                                 int(bad.sum()), kind, worst)
        return True
    # what moved beyond the grid's uncertainty, as a share of what the elements' tolerances allow
    beyond = np.maximum(off - grid / 2, 0)
    if beyond.size and beyond.max() > 0:
        share = beyond / allowed
        which, r, b = np.unravel_index(int(np.argmax(share)), share.shape)
        largest.offer_share(float(share[which, r, b]), kind,
                            f"{where}: block at positions {starts[b]}.. of row {r}: {('sum', 'moment')[which]} "
                            f"{got[which, r, b]:.6g} here, {kept[which, r, b]:.6g} in the reference ({kind}, by blocks)")
    return True


def _row_end(start: int, offsets, n: int) -> int:
    if offsets is None:
        return n
    return int(next(o for o in offsets if o > start))


def compare_held(file: str, here: Path, held: Path, largest: Largest) -> None:
    """The workspace's file against the reference's copy or reduction of the revision's; raises Differs."""
    if held_as(file) == "reduced":
        compare_h5(file, here, held, largest, reduced=compare_reduced, skip_attrs=(REDUCED,))
    else:
        compare_file(file, here, held, largest)



# ---- the revision's reference, as the driver reads it ---------------------------------------------------


def dir_md5(listing: dict[str, str], folder: str) -> str:
    """The md5 DVC records for a folder output (`<md5>.dir`) from its files' md5s ({path under folder: md5})."""
    from dvc_data.hashfile.tree import Tree

    prefix = folder.rstrip("/") + "/"
    tree = Tree.from_list([{"md5": md5, "relpath": path[len(prefix):]} for path, md5 in sorted(listing.items())],
                          hash_name="md5")
    tree.digest()
    return tree.hash_info.value


class RevisionReference:
    """The revision's reference/, read from git through `fetch` (path -> local copy) and trusted only as far as the
    revision's dvc.lock vouches for it: the folder's md5 must be the one the lock records for the reference stage's
    output (else it was edited, truncated or copied from another run), and each output's md5 the one the lock
    records for that output. `problem` is the one line that says why it is not used (None where it is, or where
    the revision has none: a revision made before it is compared from the cache or remote alone)."""

    def __init__(self, fetch, listing, lock: dict, rev: str, folder: str = FOLDER):
        self.folder, self.rev = folder, rev
        self.files: dict[str, dict] = {}
        self.problem: str | None = None
        self.mismatched: list[str] = []
        self._md5s: dict[str, str] = {}  # each file of the folder at the revision, hashed once
        where = f"{folder}/{MANIFEST} at {rev}"
        try:
            present = listing(folder)
        except Exception:  # noqa: BLE001 - no such folder at that revision
            present = {}
        recorded = next((o.get("md5") for st in lock.values() for o in st.get("outs") or [] if o.get("path") == folder),
                        None)
        if not present and recorded is None:
            return  # a revision made before the reference: nothing to say
        if recorded is None:
            self.problem = f"{folder}/ at {rev}: not an output of its dvc.lock (not made by the pipeline): not used"
            return
        try:
            md5s = self._md5s = {p: md5_file(fetch(p)) for p in present}
        except Exception as e:  # noqa: BLE001 - a file git lists but cannot give
            md5s, why = None, f"{type(e).__name__}: {e}"
        else:
            why = "missing" if not md5s else f"md5 {dir_md5(md5s, folder)}"
        if md5s is None or not md5s or dir_md5(md5s, folder) != recorded:
            self.problem = (f"{self._culprit(fetch, md5s or {}) or folder + '/'} at {rev}: {why}, its dvc.lock "
                            f"records {recorded} for the folder (edited, truncated or from another run): not used")
            return
        try:
            manifest = json.loads(fetch(f"{folder}/{MANIFEST}").read_text(encoding="utf-8"))
            if manifest.get("format") != FORMAT:
                raise ValueError(f"format {manifest.get('format')!r}, this code reads {FORMAT}")
            self.files = {str(p): dict(e) for p, e in manifest["files"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self.problem = f"{where}: not a reference manifest ({type(e).__name__}: {e}): not used"
            self.files = {}

    def _culprit(self, fetch, md5s: dict[str, str]) -> str | None:
        """The file of a reference its dvc.lock does not vouch for that is not what its manifest records, if one can
        be named: the manifest itself where it is unreadable, else the first held file of another md5 or missing."""
        try:
            files = json.loads(fetch(f"{self.folder}/{MANIFEST}").read_text(encoding="utf-8"))["files"]
            held = {f"{self.folder}/{p}": e["held_md5"] for p, e in files.items() if e.get("held") != "md5"}
        except Exception:  # noqa: BLE001 - missing, not JSON, not a manifest
            return f"{self.folder}/{MANIFEST}" if md5s else None
        for path, md5 in sorted(held.items()):
            if md5s.get(path) != md5:
                return path
        return None

    def _agrees(self, out_path: str, md5: str, files: dict[str, dict]) -> bool:
        got = (dir_md5({p: e["md5"] for p, e in files.items()}, out_path) if md5.endswith(".dir")
               else files.get(out_path, {}).get("md5"))
        if got != md5 and out_path not in self.mismatched:
            self.mismatched.append(out_path)
        return got == md5

    def listing(self, out_path: str, md5: str) -> tuple[dict[str, str] | None, str]:
        """({file: md5} of the output as the reference records it, "") where it agrees with the lock's `md5`, else
        (None, why)."""
        if self.problem or not self.files:
            return None, self.problem or f"{self.rev} has no reference ({self.folder}/)"
        prefix = out_path.rstrip("/") + "/"
        files = {p: e for p, e in self.files.items() if p == out_path or p.startswith(prefix)}
        if not files:
            return None, f"not in {self.folder}/{MANIFEST} at {self.rev}"
        if not self._agrees(out_path, md5, files):
            return None, f"{self.folder}/{MANIFEST} at {self.rev} records other md5s than its dvc.lock"
        return {p: e["md5"] for p, e in files.items()}, ""

    def held(self, file: str, fetch) -> tuple[Path | None, str]:
        """(the reference's copy or reduction of `file`, "") or (None, why); its md5 checked against the manifest."""
        entry = self.files.get(file)
        if entry is None or entry.get("held") == "md5":
            return None, f"{self.folder}/ at {self.rev} holds its md5 alone"
        try:
            path = fetch(f"{self.folder}/{file}")
        except Exception as e:  # noqa: BLE001
            return None, f"{self.folder}/{file} at {self.rev}: cannot be read ({type(e).__name__})"
        if self._md5s.get(f"{self.folder}/{file}", md5_file(path)) != entry.get("held_md5"):
            return None, f"{self.folder}/{file} at {self.rev}: not the file its manifest records (edited or truncated)"
        return path, ""
