"""The reference (meaningless_tokens/verify/reference.py): what it is sure to catch, and what it must let pass.

Synthetic HDF5 files shaped like the pipeline's (ragged attention rows cut by `offsets`, causal attention matrices,
float16 activations, small per-problem datasets, integers and texts), reduced as the reference stage reduces them,
then changed in the ways the reference promises to see (a whole row moved by 3x its tolerance, one element, mass
moved within a row with its sum kept) and in the way a rerun on other float kernels moves them (every element
within its tolerance). The revision's reference as `make verify` reads it: missing, truncated, from another run,
hand-edited.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from meaningless_tokens import store
from meaningless_tokens.errors import Differs
from meaningless_tokens.verify import TOLERANCES, Largest
from meaningless_tokens.verify import reference as ref

ATT, ACT, LIK = "artifacts/attention/m.h5", "artifacts/activations/m.h5", "artifacts/likelihood/m.h5"
LENGTHS = (70, 45, 101, 33, 88)  # prompts of a ragged attention axis


def softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def write_attention(path: Path, rng) -> None:
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    with store.write_h5(path) as f:
        f.attrs["provenance"] = json.dumps({"stage": "extract", "params": {"layers": [0, 1, 2]}})
        g = f.create_group("mless")
        store.put(g, "offsets", offsets)
        store.put(g, "input_ids", rng.integers(0, 5000, offsets[-1]).astype(np.int32))
        # each prompt's positions of one layer and head: shares of attention, summing to about 1 per prompt
        recv = np.concatenate([softmax(rng.normal(size=(3, 9, n))) for n in LENGTHS], axis=-1)
        store.put(g, "recv_all", recv.astype(np.float32))
        store.put(g, "span_mass", rng.random((3, 9)))  # small: held whole
        store.put_texts(g, "span_text", ["/" * 55, "un café", "x"])
        n = 90
        scores = np.where(np.tril(np.ones((n, n), bool)), rng.normal(size=(2, 3, n, n)), -np.inf)
        store.put(f.create_group("showcase/000"), "mless", softmax(scores).astype(np.float32))


def write_activations(path: Path, rng) -> None:
    with store.write_h5(path) as f:
        g = f.create_group("showcase/000/mless")
        store.put(g, "z", rng.normal(scale=0.5, size=(1, 40, 384)).astype(np.float16))
        store.put(f.create_group("mless/original"), "gini", rng.random((20, 1)))  # one problem per row: whole
        store.put(f, "bin_edges", np.linspace(-5, 5, 361))


def write_likelihood(path: Path, rng) -> None:
    with store.write_h5(path) as f:
        store.put(f.create_group("none/solution"), "sum", -rng.random(100) * 60)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{output name: (the file, its reduction)}."""
    base = tmp_path_factory.mktemp("reference")
    rng = np.random.default_rng(0)
    out = {}
    for name, write in ((ATT, write_attention), (ACT, write_activations), (LIK, write_likelihood)):
        src, held = base / "src" / name, base / "held" / name
        src.parent.mkdir(parents=True, exist_ok=True)
        held.parent.mkdir(parents=True, exist_ok=True)
        write(src, rng)
        ref.reduce_h5(name, src, held)
        out[name] = (src, held)
    return out


def changed(files, tmp_path, name: str, dataset: str, fn) -> Path:
    """A copy of the output `name` with `fn(values)` written over one dataset."""
    src = files[name][0]
    copy = tmp_path / Path(name).name
    shutil.copy(src, copy)
    with h5py.File(copy, "r+") as f:
        f[dataset][...] = fn(f[dataset][()].astype(np.float64)).astype(f[dataset].dtype)
    return copy


def compare(files, name: str, here: Path) -> Largest:
    largest = Largest()
    ref.compare_held(name, here, files[name][1], largest)
    return largest


def tol(kind: str, x):
    t = TOLERANCES[kind]
    return t.atol + t.rtol * np.abs(x)


# ---- what it holds -------------------------------------------------------------------------------------


def test_large_floats_are_reduced_small_data_and_everything_else_held_whole(files):
    with h5py.File(files[ATT][1]) as f:
        assert ref.REDUCED in f["mless/recv_all"].attrs and ref.REDUCED in f["showcase/000/mless"].attrs
        how = json.loads(f["mless/recv_all"].attrs[ref.REDUCED])
        assert how["rows"] == "offsets" and how["block"] == 32 and how["kind"] == "attention-received"
        # blocks never straddle two prompts: 70 + 45 + 101 + 33 + 88 positions in 3 + 2 + 4 + 2 + 3 blocks
        assert f["mless/recv_all"].shape == (2, 27, 14)
        for held_whole in ("mless/offsets", "mless/input_ids", "mless/span_mass", "mless/span_text"):
            assert ref.REDUCED not in f[held_whole].attrs
        assert json.loads(f.attrs["provenance"])["stage"] == "extract"
    with h5py.File(files[ACT][1]) as f:
        assert json.loads(f["showcase/000/mless/z"].attrs[ref.REDUCED])["rows"] == "last axis"
        assert ref.REDUCED not in f["mless/original/gini"].attrs
    assert files[ATT][1].stat().st_size < files[ATT][0].stat().st_size / 3


def test_the_same_file_gives_the_same_bytes_and_passes_unchanged(files, tmp_path):
    again = tmp_path / "again.h5"
    ref.reduce_h5(ATT, files[ATT][0], again)
    assert again.read_bytes() == files[ATT][1].read_bytes()
    for name in files:
        assert compare(files, name, files[name][0]).share < 0  # nothing moved


# ---- a whole row: caught at 3x its tolerance, let through at 0.3x ---------------------------------------


ROWS = [
    (ATT, "mless/recv_all", lambda x: (np.s_[1, 4, 115:216])),  # prompt 2 of layer 1, head 4
    (ATT, "showcase/000/mless", lambda x: np.s_[1, 2, 60, :]),  # one query's attention over the keys
    (ACT, "showcase/000/mless/z", lambda x: np.s_[0, 17, :]),  # one token's activations
    (ACT, "mless/original/gini", lambda x: np.s_[7, :]),  # one problem of an activations dataset (held whole)
    (LIK, "none/solution/sum", lambda x: np.s_[42]),  # one problem of a likelihood dataset (held whole)
]


@pytest.mark.parametrize("name,dataset,row", ROWS, ids=[r[1] for r in ROWS])
@pytest.mark.parametrize("sign", [1, -1])
def test_a_whole_row_moved_by_3x_its_tolerance_differs_and_by_0_3x_does_not(files, tmp_path, name, dataset, row, sign):
    kind = ref.kind_of(name, dataset)

    def moved(factor):
        def fn(x):
            x = x.copy()
            x[row(x)] += sign * factor * tol(kind, x[row(x)])
            return x
        return fn

    with pytest.raises(Differs, match=dataset):
        compare(files, name, changed(files, tmp_path, name, dataset, moved(3)))
    assert compare(files, name, changed(files, tmp_path, name, dataset, moved(0.3))).share <= 1


def test_every_element_within_its_tolerance_never_differs(files, tmp_path):
    """A rerun on other float kernels: each element anywhere within 0.95x its tolerance, at random."""
    rng = np.random.default_rng(1)
    for name, dataset, _ in ROWS:
        kind = ref.kind_of(name, dataset)
        noisy = changed(files, tmp_path, name, dataset,
                        lambda x: x + rng.uniform(-0.95, 0.95, x.shape) * tol(kind, x) * (x.dtype != np.float16))
        compare(files, name, noisy)
    # float16 keeps 11 bits: its elements move by whole ulps, so round each move to one within tolerance
    x16 = h5py.File(files[ACT][0])["showcase/000/mless/z"][()]
    step = np.spacing(x16).astype(np.float64)
    moves = np.floor(tol("activation", x16) * 0.95 / step) * step * rng.choice([-1, 1], x16.shape)
    compare(files, ACT, changed(files, tmp_path, ACT, "showcase/000/mless/z", lambda x: x + moves))


# ---- one element, and mass moved within a row ---------------------------------------------------------


def worst_case(x, sl, kind, away):
    """The other elements of the block moved by 0.95x their tolerance, against the change (`away`: its sign)."""
    x[sl] -= away * 0.95 * tol(kind, x[sl])


@pytest.mark.parametrize("name,dataset,at", [(ATT, "mless/recv_all", (2, 3, 130)),
                                             (ATT, "showcase/000/mless", (0, 1, 80, 40)),
                                             (ACT, "showcase/000/mless/z", (0, 9, 200))])
def test_one_element_moved_beyond_the_stated_threshold_differs(files, tmp_path, name, dataset, at):
    kind = ref.kind_of(name, dataset)
    x0 = h5py.File(files[name][0])[dataset][()].astype(np.float64)
    block = ref.block_of(kind)
    row_start = 115 if dataset == "mless/recv_all" else 0  # the prompt's first position, or the row's
    first = row_start + (at[-1] - row_start) // block * block
    sl = (*at[:-1], slice(first, first + block))
    # the stated threshold: twice the block's tolerance plus the grid (guarantees(); with rtol, of the block's values)
    threshold = 2 * tol(kind, x0[sl]).sum() + ref.grids(kind)[0]
    assert ref.guarantees(kind, np.abs(x0[sl]).sum())["element"] == pytest.approx(threshold, rel=1e-2)
    threshold = ref.guarantees(kind, np.abs(x0[sl]).sum())["element"]

    def moved(size):
        def fn(x):
            x = x.copy()
            worst_case(x, sl, kind, 1)
            x[at] += size
            return x
        return fn

    step = float(np.spacing(np.float16(x0[at] + threshold))) if kind == "activation" else 0
    with pytest.raises(Differs, match="sum"):
        compare(files, name, changed(files, tmp_path, name, dataset, moved(threshold * 1.02 + 2 * step)))
    compare(files, name, changed(files, tmp_path, name, dataset, moved(0)))  # the worst case alone passes


@pytest.mark.parametrize("gap", [1, 7, 31, 60])
def test_mass_moved_within_a_row_with_its_sum_kept_differs_above_the_stated_threshold(files, tmp_path, gap):
    """Attention rows sum to 1: moving weight from one key to another keeps the sum, which a row's sum cannot see."""
    name, dataset = ATT, "showcase/000/mless"
    m = ref.guarantees("attention", abs_sum=1.0)["moved"] * 1.02  # a block of weights sums to at most 1
    i = 3

    def moved(x):
        x = x.copy()
        x[1, 0, 85, i] -= m
        x[1, 0, 85, i + gap] += m
        return x

    x0 = h5py.File(files[name][0])[dataset][()]
    assert moved(x0.astype(np.float64))[1, 0, 85].sum() == pytest.approx(x0[1, 0, 85].sum(), abs=1e-6)
    with pytest.raises(Differs, match="moment|sum"):
        compare(files, name, changed(files, tmp_path, name, dataset, moved))


def test_the_stated_thresholds(files):
    """docs/sharing.md states these for attention weights (a block's weights sum to at most 1): one element above
    2.0e-2, mass moved above 0.29; for the attention received, 2.9e-2 plus 0.016 x the block's sum (the tolerances
    the calibration set: twice what MKL_CBWR=COMPATIBLE moved element by element, each threshold with them)."""
    g = ref.guarantees("attention", abs_sum=1.0)
    assert g["element"] == pytest.approx(2.05e-2, rel=0.01) and g["moved"] == pytest.approx(0.285, rel=0.01)
    assert g["row"] == 1.125
    assert ref.guarantees("attention-received")["element"] == pytest.approx(2.9e-2, rel=0.01)
    assert ref.guarantees("attention-received", 100.0)["element"] == pytest.approx(1.64, rel=0.01)


# ---- what is held whole is compared as from the cache ---------------------------------------------------


def test_integers_texts_attributes_and_objects_are_compared_exactly(files, tmp_path):
    copy = changed(files, tmp_path, ATT, "mless/input_ids", lambda x: x + (np.arange(x.size) == 9))
    with pytest.raises(Differs, match=r"mless/input_ids\[9\]"):
        compare(files, ATT, copy)
    shutil.copy(files[ATT][0], copy)
    with h5py.File(copy, "r+") as f:  # what only the workspace has is added, not a difference; in the revision only: one
        f["mless/recv_all"].attrs["note"] = "added"
        f["mless/recv_all_noise"] = np.zeros(3)
        f["mless"].create_group("new")["x"] = np.zeros(2)
    largest = compare(files, ATT, copy)
    assert largest.added == [f"{ATT}: mless/new", f"{ATT}: mless/recv_all_noise", f"{ATT}: mless/recv_all attribute note"]
    shutil.copy(files[ATT][0], copy)
    with h5py.File(copy, "r+") as f:
        del f["mless/span_mass"]
    with pytest.raises(Differs, match="mless/span_mass: in the revision, not here"):
        compare(files, ATT, copy)
    with pytest.raises(Differs, match="shape"):
        compare(files, ATT, _rewritten(files, tmp_path, "mless/recv_all", lambda x: x[..., :-1]))


def _rewritten(files, tmp_path, dataset, fn) -> Path:
    copy = tmp_path / "rewritten.h5"
    shutil.copy(files[ATT][0], copy)
    with h5py.File(copy, "r+") as f:
        values, attrs = fn(f[dataset][()]), dict(f[dataset].attrs)
        del f[dataset]
        f[dataset] = values
        f[dataset].attrs.update(attrs)
    return copy


# ---- the revision's reference as verify reads it --------------------------------------------------------


@pytest.fixture
def revision(tmp_path, files):
    """A revision's tree (reference/ and the outputs it describes) and the lock that vouches for it."""
    root = tmp_path / "rev"
    for name, (src, _) in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / name)
    (root / "reports/figures").mkdir(parents=True)
    (root / "reports/figures/a.png").write_bytes(b"png")
    outputs = [*files, "reports/figures/a.png"]
    ref.write(root, outputs, root / "reference")
    return root


def lock_of(root: Path, edit=lambda outs: outs) -> dict:
    folder = {p.relative_to(root).as_posix(): ref.md5_file(p) for p in (root / "reference").rglob("*") if p.is_file()}
    outs = [{"path": n, "md5": ref.md5_file(root / n)} for n in (ATT, ACT, LIK)]
    outs.append({"path": "reports/figures", "md5": ref.dir_md5({"reports/figures/a.png": ref.md5_file(
        root / "reports/figures/a.png")}, "reports/figures")})
    outs.append({"path": "reference", "md5": ref.dir_md5(folder, "reference")})
    return {"stage": {"outs": edit(outs)}}


def reader(root: Path, lock: dict) -> ref.RevisionReference:
    def listing(folder):
        return {p.relative_to(root).as_posix(): {} for p in (root / folder).rglob("*") if p.is_file()}
    return ref.RevisionReference(lambda p: root / p, listing, lock, "REV")


def test_a_sound_reference_lists_every_output_and_holds_its_files(revision):
    r = reader(revision, lock_of(revision))
    assert r.problem is None
    lock = {o["path"]: o["md5"] for o in lock_of(revision)["stage"]["outs"]}
    listed, why = r.listing("reports/figures", lock["reports/figures"])
    assert listed == {"reports/figures/a.png": ref.md5_file(revision / "reports/figures/a.png")} and why == ""
    held, why = r.held(ATT, lambda p: revision / p)
    assert held == revision / "reference" / ATT and why == ""
    assert r.held("reports/figures/a.png", lambda p: revision / p)[0] is None  # figures: md5 alone


@pytest.mark.parametrize("damage,expected", [
    ("truncated", f"reference/{ATT} at REV: md5 .* its dvc.lock records .* for the folder \\(edited, truncated or "
                  f"from another run\\): not used"),
    ("edited", "reference/ at REV: md5 .* \\(edited, truncated or from another run\\): not used"),
    ("garbled", f"reference/{ref.MANIFEST} at REV: md5 .* \\(edited, truncated or from another run\\): not used"),
    ("missing", "reference/ at REV: missing, its dvc.lock records .* for the folder .*: not used"),
    ("unlocked", "reference/ at REV: not an output of its dvc.lock \\(not made by the pipeline\\): not used"),
])
def test_a_damaged_reference_is_one_line_and_nothing_of_it_is_used(revision, damage, expected):
    import re

    lock = lock_of(revision)
    held = revision / "reference" / ATT
    if damage == "truncated":
        held.write_bytes(held.read_bytes()[:5000])
    elif damage == "edited":
        manifest = revision / "reference" / ref.MANIFEST
        data = json.loads(manifest.read_text())
        data["files"][LIK]["md5"] = "0" * 32
        manifest.write_text(json.dumps(data))
    elif damage == "garbled":
        (revision / "reference" / ref.MANIFEST).write_text('{"format": 1, "files": ')
    elif damage == "missing":
        shutil.rmtree(revision / "reference")
    else:
        lock = lock_of(revision, lambda outs: [o for o in outs if o["path"] != "reference"])
    r = reader(revision, lock)
    assert r.problem and re.fullmatch(expected, r.problem), r.problem
    assert r.listing(ATT, ref.md5_file(revision / ATT)) == (None, r.problem)


def test_a_reference_from_before_another_outputs_rerun_leaves_that_output_not_compared(revision):
    """The lock records another md5 for one output (a stage rerun alone, the reference not after it): that output
    is not compared from the reference, the others are."""
    lock = lock_of(revision, lambda outs: [{**o, "md5": "f" * 32} if o["path"] == LIK else o for o in outs])
    r = reader(revision, lock)
    assert r.problem is None
    assert r.listing(LIK, "f" * 32) == (None, f"reference/{ref.MANIFEST} at REV records other md5s than its dvc.lock")
    assert r.mismatched == [LIK]
    assert r.listing(ATT, ref.md5_file(revision / ATT))[0] is not None


def test_a_revision_made_before_the_reference_has_none_and_says_nothing(tmp_path):
    r = reader(tmp_path, {"stage": {"outs": [{"path": ATT, "md5": "0" * 32}]}})
    assert r.problem is None and r.listing(ATT, "0" * 32) == (None, "REV has no reference (reference/)")
