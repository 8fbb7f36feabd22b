import shutil

import pytest

from stages.config import load_params
from stages.prompts import DatasetError, load_math500


def test_vendored_math500_loads_and_matches_its_sha256(write_params):
    params = load_params(write_params())
    problems, digest = load_math500(params)
    assert digest == "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"
    assert len(problems) == 500
    assert len({p.unique_id for p in problems}) == 500
    assert {p.level for p in problems} == {1, 2, 3, 4, 5}
    assert problems[0].index == 0 and problems[-1].index == 499


def test_altered_dataset_is_refused_by_name(tmp_path, write_params):
    params = load_params(write_params())
    copy = tmp_path / "test.jsonl"
    shutil.copyfile(params.resolve(params.dataset.path), copy)
    with open(copy, "a") as f:
        f.write("\n")
    raw = params.model_dump()
    raw["dataset"]["path"] = str(copy)
    params = load_params(write_params(raw))
    with pytest.raises(DatasetError, match=rf"{copy}: sha256 [0-9a-f]{{64}} != expected 35dc41"):
        load_math500(params)


def test_missing_dataset_names_the_key(write_params, tmp_path):
    raw = load_params(write_params()).model_dump()
    raw["dataset"]["path"] = str(tmp_path / "gone.jsonl")
    with pytest.raises(DatasetError, match="dataset file not found .*dataset.path"):
        load_math500(load_params(write_params(raw)))
