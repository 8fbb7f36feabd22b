"""Texts in HDF5 artifacts (store.put_texts / store.read_texts): every character round-trips, NUL and lone
surrogates included, which HDF5's variable-length strings cannot hold as they are; ordinary texts are written
byte for byte as plain strings; `make verify` compares texts decoded."""

import json

import h5py
import numpy as np
import pytest

from meaningless_tokens import store
from meaningless_tokens.errors import ArtifactError, Differs
from meaningless_tokens.verify import compare

ORDINARY = ["", "x = \\boxed{3}", "naïve ½ — 数学 \U0001F600", '"\\u0000"', "\x01\x1f\x7f\ufeff\uffff\U0010ffff"]
HOSTILE = ["\x00", "a\x00b", "ends\x00", "\ud800", "lone \udc80 low", "both \x00 and \udfff", "\x00" * 3]


def write(path, **datasets):
    with store.write_h5(path) as f:
        g = f.create_group("none")
        for name, texts in datasets.items():
            store.put_texts(g, name, texts, compress=False)
    return path


def read(path, name):
    with h5py.File(path, "r") as f:
        return store.read_texts(f["none"][name]), dict(f["none"][name].attrs)


def test_h5py_refuses_what_put_texts_escapes(tmp_path):
    """The premise: plain strings with NUL or a lone surrogate cannot be written."""
    for text, error in (("a\x00b", ValueError), ("\udc80", UnicodeEncodeError)):
        with pytest.raises(error):
            with store.write_h5(tmp_path / "plain.h5") as f:
                store.put(f, "t", np.array([text], dtype=object), compress=False)


@pytest.mark.parametrize("shape", [(14,), (7, 2), (2, 7)])
def test_every_text_round_trips_and_only_the_hostile_are_escaped(tmp_path, shape):
    texts = np.array([t for pair in zip(ORDINARY + ORDINARY[:2], HOSTILE) for t in pair], dtype=object).reshape(shape)
    back, attrs = read(write(tmp_path / "t.h5", output=texts.tolist()), "output")
    assert back.shape == shape and back.dtype == object
    assert back.tolist() == texts.tolist()
    assert all(type(t) is str for t in back.ravel())
    flat = [i for i, t in enumerate(texts.ravel()) if t in HOSTILE]
    assert attrs["escaped"].tolist() == flat and attrs["escaped"].dtype == np.int64
    assert attrs["escape"] == store.TEXT_ESCAPE
    with h5py.File(tmp_path / "t.h5", "r") as f:  # what other tools see: the JSON literal, ASCII
        raw = f["none/output"].asstr()[()].ravel()
    assert [json.loads(raw[i]) for i in flat] == [texts.ravel()[i] for i in flat]
    assert all(raw[i].isascii() for i in flat) and raw[flat[0] - 1] == texts.ravel()[flat[0] - 1]


def test_ordinary_texts_are_written_as_plain_strings_byte_for_byte(tmp_path):
    """No escape needed: no new attribute, and the file equals the one plain `put` writes (the earlier format)."""
    new = write(tmp_path / "new.h5", output=ORDINARY, sampled=[ORDINARY[:2], ORDINARY[2:4]])
    with store.write_h5(tmp_path / "plain.h5") as f:
        g = f.create_group("none")
        store.put(g, "output", np.array(ORDINARY, dtype=object), compress=False)
        store.put(g, "sampled", np.array([ORDINARY[:2], ORDINARY[2:4]], dtype=object), compress=False)
    assert new.read_bytes() == (tmp_path / "plain.h5").read_bytes()
    back, attrs = read(new, "output")
    assert attrs == {} and back.tolist() == ORDINARY
    with h5py.File(new, "r") as f:  # a plain file (one written before put_texts) reads the same
        assert store.read_texts(f["none/sampled"]).tolist() == [ORDINARY[:2], ORDINARY[2:4]]


def test_a_text_keeps_its_trailing_nul(tmp_path):
    """numpy's fixed-width str would drop it: read_texts returns str objects."""
    back, _ = read(write(tmp_path / "t.h5", output=["ends\x00", "\x00"]), "output")
    assert back[0] == "ends\x00" and back[1] == "\x00"


def test_bad_texts_and_damaged_escapes_name_the_file_and_dataset(tmp_path):
    with pytest.raises(TypeError, match=r"t\.h5: /none/output: element \[1, 0\] is a NoneType, not a str"):
        write(tmp_path / "t.h5", output=[["a"], [None]])
    assert not (tmp_path / "t.h5").exists()
    path = write(tmp_path / "d.h5", output=["a\x00", "b", "c\udc80"], ids=["x"])
    with h5py.File(path, "r+") as f:
        f["none/ids"].attrs["escaped"] = np.array([0])
        f["numbers"] = np.arange(3)
    with h5py.File(path, "r") as f:
        with pytest.raises(ArtifactError, match=r"d\.h5: /none/ids: attributes escape=None and escaped do not"):
            store.read_texts(f["none/ids"])
        with pytest.raises(ArtifactError, match=r"d\.h5: /numbers: not a dataset of texts"):
            store.read_texts(f["numbers"])
    for bad, message in ((np.array([0, 5]), r"attribute escaped is not a list of distinct element indices below 3"),
                         (np.array([0, 0]), r"attribute escaped is not a list of distinct element indices below 3"),
                         (np.array([1]), r"element 1 \(attribute escaped\) is not a JSON string literal: 'b'")):
        with h5py.File(path, "r+") as f:
            f["none/output"].attrs["escaped"] = bad
        with h5py.File(path, "r") as f, pytest.raises(ArtifactError, match=r"d\.h5: /none/output: " + message):
            store.read_texts(f["none/output"])


def test_verify_compares_texts_decoded(tmp_path):
    a = write(tmp_path / "a.h5", output=["x\x00", "y"])
    b = write(tmp_path / "b.h5", output=["x\x00", "y"])
    compare.compare_h5("eval.h5", a, b, compare.Largest())
    # the same texts, escaped at other elements (another writer): equal by value
    with h5py.File(b, "r+") as f:
        del f["none/output"]
        ds = f["none"].create_dataset("output", data=np.array([json.dumps("x\x00"), json.dumps("y")], dtype=object))
        ds.attrs["escape"], ds.attrs["escaped"] = store.TEXT_ESCAPE, np.array([0, 1])
    compare.compare_h5("eval.h5", a, b, compare.Largest())
    c = write(tmp_path / "c.h5", output=["x\x00\x00", "y"])
    with pytest.raises(Differs, match=r"eval\.h5: none/output\[0\]: 'x\\x00' here, 'x\\x00\\x00' in the revision"):
        compare.compare_h5("eval.h5", a, c, compare.Largest())


def test_the_journal_keeps_any_text_a_model_writes(tmp_path):
    """A resumed run reads back exactly what was generated: NUL and a lone surrogate included."""
    from meaningless_tokens import engines

    texts = ["a\x00b", "lone \ud800 surrogate", "plain ü"]
    recs = [engines.Record(k, "none", t, 3, "length", t, False, None, False, 0.1) for k, t in enumerate(texts)]
    path = tmp_path / "journal.jsonl"
    engines.Journal(path, "key").append(recs)
    assert [r.output for r in engines.Journal(path, "key").records.values()] == texts


def test_a_datasets_texts_are_stored_whatever_they_hold(tmp_path):
    """An artifact's /problems group (every model stage writes one) keeps a dataset's ids, subjects and answers
    exactly, NUL included."""
    from meaningless_tokens.dataset import Problem, put_problems

    chosen = [Problem(0, "id\x000", "p", None, "4\x00", "Alge\x00bra", 1), Problem(1, "id1", "q", None, "5", None, None)]
    path = tmp_path / "problems.h5"
    with store.write_h5(path) as f:
        put_problems(f, chosen, with_answer=True)
    with h5py.File(path, "r") as f:
        assert store.read_texts(f["problems/unique_id"]).tolist() == ["id\x000", "id1"]
        assert store.read_texts(f["problems/subject"]).tolist() == ["Alge\x00bra", ""]
        assert store.read_texts(f["problems/answer"]).tolist() == ["4\x00", "5"]
