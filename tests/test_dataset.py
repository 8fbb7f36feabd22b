import shutil

import pytest

from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500, load_problems, require_field, select_problems
from meaningless_tokens.errors import DatasetError


def test_vendored_math500_loads_and_matches_its_sha256(write_params):
    params = load_params(write_params())
    problems, digest = load_math500(dataset_spec(params.dataset, params.file))
    assert digest == "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"
    assert len(problems) == 500
    assert len({p.unique_id for p in problems}) == 500
    assert {p.level for p in problems} == {1, 2, 3, 4, 5}
    assert problems[0].index == 0 and problems[-1].index == 499


def test_altered_dataset_is_refused_by_name(tmp_path, write_params):
    params = load_params(write_params())
    copy = tmp_path / "test.jsonl"
    shutil.copyfile(dataset_spec(params.dataset, params.file).path, copy)
    with open(copy, "a") as f:
        f.write("\n")
    raw = params.model_dump()
    raw["dataset"]["path"] = str(copy)
    params = load_params(write_params(raw))
    with pytest.raises(DatasetError, match=rf"{copy}: sha256 [0-9a-f]{{64}} != expected 35dc41"):
        load_math500(dataset_spec(params.dataset, params.file))


def test_missing_dataset_names_the_key(write_params, tmp_path):
    raw = load_params(write_params()).model_dump()
    raw["dataset"]["path"] = str(tmp_path / "gone.jsonl")
    with pytest.raises(DatasetError, match="dataset file not found .*dataset.path"):
        params = load_params(write_params(raw))
        load_math500(dataset_spec(params.dataset, params.file))


AIME25 = "dee94372847a43a5eb6b0a439047efa82f3804db221a55dc640053425315dd4b"


def _with(write_params, **dataset):
    """The dataset spec of a params file whose `dataset` section is `dataset` over the defaults."""
    raw = load_params(write_params()).model_dump()
    raw["dataset"] = {"benchmark": "math500", "path": None, "sha256": None, "format": "auto", "fields": None,
                      "filter": None, **dataset}
    params = load_params(write_params(raw))
    return dataset_spec(params.dataset, params.file)


def test_vendored_aime_files_load_with_their_fields(write_params):
    problems, digest = load_problems(_with(write_params, benchmark="aime2024"))
    assert len(problems) == 90 and digest.startswith("025484a9")
    assert problems[0].answer == "116" and problems[0].unique_id == "0" and problems[0].solution
    assert {p.answer for p in problems} >= {"033", "004"} and problems[0].level is None
    only_2024 = load_problems(_with(write_params, benchmark="aime2024", filter={"field": "url", "contains": "2024_AIME"}))[0]
    assert len(only_2024) == 30 and only_2024[0].index == 60  # indices stay the file's rows
    problems, digest = load_problems(_with(write_params, benchmark="aime2025"))
    assert len(problems) == 30 and digest == AIME25
    assert problems[19].answer == "336^\\circ" and problems[0].solution is None and problems[0].unique_id == "0"
    assert problems[0].row().keys() == {"problem", "answer", "solution", "level", "subject", "id"}
    # no level: a seeded uniform subset instead of a stratified one; a stage that needs a field says so
    chosen = select_problems(problems, 7, 0)
    assert len(chosen) == 7 and chosen == select_problems(problems, 7, 0) and chosen != problems[:7]
    with pytest.raises(DatasetError, match="evaluate.n_samples: asked for 31 problems; the dataset has 30"):
        select_problems(problems, 31, 0, "evaluate.n_samples")
    with pytest.raises(DatasetError, match=r"aime2025.jsonl: row 1 has no 'solution': likelihood needs it .*dataset.fields.solution"):
        require_field(_with(write_params, benchmark="aime2025"), problems, "solution", "likelihood")


def test_a_local_csv_with_a_field_mapping_and_a_filter(write_params, tmp_path):
    import hashlib
    f = tmp_path / "mine.csv"
    f.write_text("q,a,year\nWhat is 1+1?,2,2024\nWhat is 2+2?,004,2023\n", encoding="utf-8")
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    spec = _with(write_params, benchmark="other", path=str(f), sha256=sha, fields={"problem": "q", "answer": "a"},
                 filter={"field": "year", "equals": "2023"})
    problems, _ = load_problems(spec)
    assert [(p.index, p.problem, p.answer) for p in problems] == [(1, "What is 2+2?", "004")]  # "004" stays a string


def test_bad_field_mapping_or_file_names_the_key_and_the_file(write_params, tmp_path):
    # AIME 2025's file has `question`, not `problem`
    bad = _with(write_params, benchmark="other", path=str(tmp_path / "x.jsonl"), sha256=AIME25,
                fields={"problem": "problem", "answer": "answer"})
    shutil.copyfile(_with(write_params, benchmark="aime2025").path, tmp_path / "x.jsonl")
    with pytest.raises(DatasetError, match=r"x.jsonl: no column 'problem' \(.*params.yaml: dataset.fields.problem\); "
                                            r"the file's columns: \['question', 'answer'\]"):
        load_problems(bad)
    bad = _with(write_params, benchmark="aime2024", filter={"field": "year", "contains": "2024"})
    with pytest.raises(DatasetError, match=r"no column 'year' \(.*dataset.filter.field\)"):
        load_problems(bad)
    with pytest.raises(DatasetError, match=r"gone.parquet: dataset file not found \(.*: dataset.path\)"):
        load_problems(_with(write_params, benchmark="aime2024", path=str(tmp_path / "gone.parquet")))
    with pytest.raises(Exception, match="benchmark 'other' needs path, sha256, fields"):
        _with(write_params, benchmark="other")
