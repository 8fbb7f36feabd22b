"""Bad input read back (docs/faults.md): a NaN in an artifact or a metrics file, another model's file in place, a
value of the wrong type in params.yaml, a damaged model folder, a deleted or hand-edited reference. Each is one
`error:` line naming the file and the key (or one verify row) with exit status 2, never a number that passes as
right; where the line says "run: X", running X puts the state right."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from meaningless_tokens import add_model
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ArtifactError, ConfigError, ModelSourceError, NonFiniteError, StageError
from tests import shared
from tests.shared import A, B
from tests.test_faults import one_error_line
from tests.test_verify import verify

ROOT = Path(__file__).resolve().parent.parent


def set_value(path: Path, name: str, index, value=np.nan) -> None:
    """One element of dataset `name` of an HDF5 file set in place (its checksum recomputed, as an edit by h5py)."""
    with h5py.File(path, "r+") as f:
        data = f[name][()]
        data[index] = value
        f[name][...] = data


def stage(repo, module: str, *args: str):
    return repo.run("python", "-m", f"stages.{module}", *args, check=False)


# ---- a NaN is refused where it is read -------------------------------------------------------------------

def test_a_nan_in_a_statistic_is_refused_by_figures_and_report_and_dvc_repro_restores_it(pipeline_copy):
    repo = pipeline_copy
    stats = f"artifacts/stats/{A}.h5"
    set_value(repo.path / stats, "mless/drop_pct", (0, 0))
    for module in ("figures", "report"):
        proc = stage(repo, module)
        assert proc.returncode == 2, proc.stderr
        line = one_error_line(proc.stderr)
        assert line.startswith(f"error: {repo.path / stats}: /mless/drop_pct: non-finite value nan at index [0, 0]"), line
        assert "run" in line and "dvc repro" in line
    before = {p: (repo.path / p).read_bytes() for p in ("reports/report.md", "metrics/verdict.json")}
    proc = repo.dvc("repro", check=False)  # the line's command: the stage whose output changed runs again
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(repo.path / stats) as f:
        assert np.isfinite(f["mless/drop_pct"][()]).all()
    assert {p: (repo.path / p).read_bytes() for p in before} == before


def test_a_nan_in_a_verdicts_interval_is_one_line_naming_file_and_dataset(pipeline_copy):
    repo = pipeline_copy
    stats = repo.path / f"artifacts/stats/{A}.h5"
    with h5py.File(stats) as f:
        shape = f["mless/layer_drop_pct_ci"].shape
    set_value(stats, "mless/layer_drop_pct", ..., np.nan)
    set_value(stats, "mless/layer_drop_pct_ci", ..., np.nan)
    proc = stage(repo, "report")
    assert proc.returncode == 2 and "ValueError" not in proc.stderr, proc.stderr
    line = one_error_line(proc.stderr)
    assert f"{stats}: /mless/layer_drop_pct" in line and "non-finite value nan at index [0" in line, (line, shape)


def test_another_models_metrics_are_refused_naming_both(pipeline_copy):
    repo = pipeline_copy
    mine, theirs = (repo.path / f"metrics/accuracy/{m}.json" for m in (A, B))
    shutil.copy(theirs, mine)
    for module in ("figures", "report"):
        proc = stage(repo, module)
        assert proc.returncode == 2, proc.stderr
        assert one_error_line(proc.stderr) == (
            f"error: {mine}: written for model '{B}', read as model '{A}' (another model's file copied in place?); "
            f"run: dvc repro evaluate@{A}")
    assert repo.dvc("repro", f"evaluate@{A}", check=False).returncode == 0  # the line's command
    assert json.loads(mine.read_text())["model"] == A
    assert stage(repo, "figures").returncode == 0


def test_every_metrics_file_records_its_stage_and_model(pipeline_copy):
    files = sorted((pipeline_copy.path / "metrics").rglob("*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        if path.name == "verdict.json":
            assert data["stage"] == "report", path
            continue
        kind, stem = path.parent.name, path.stem
        stage_name, model = stem.split("-", 1) if kind == "timing" else ({"accuracy": "evaluate"}.get(kind, kind), stem)
        assert (data["stage"], data["model"]) == (stage_name, model), path


# ---- every artifact kind the report reads: a NaN, a truncated file, another model's file -------------------

# kind -> (file of model A, a float dataset (or key) its reader reads, or the group whose first one it reads, the reader)
def _readers():
    from meaningless_tokens.results import load
    from meaningless_tokens.store import read_metrics

    return {
        "stats": (f"artifacts/stats/{A}.h5", "mless/drop_pct", load.load_stats),
        "activations": (f"artifacts/activations/{A}.h5", "mless/", load.load_activations),
        "sweep": (f"artifacts/sweep/{A}.h5", "token_0/drop_heads_pct", load.load_sweep),
        "likelihood": (f"artifacts/likelihood/{A}.h5", "contrasts/", load.load_likelihood),
        "eval": (f"artifacts/eval/{A}.h5", "", lambda p: load.load_datasets(p, "eval")),
        "metrics/accuracy": (f"metrics/accuracy/{A}.json", "mean_tokens.none", read_metrics),
        "metrics/likelihood": (f"metrics/likelihood/{A}.json", None, read_metrics),
        "metrics/sweep": (f"metrics/sweep/{A}.json", None, read_metrics),
    }


def _first_float(path: Path, under: str) -> str | None:
    """The first floating-point dataset of an HDF5 file under the group `under` ("": anywhere); None: it holds none
    (the evaluation file: counts, grades and texts)."""
    found = []
    with h5py.File(path) as f:
        f.visititems(lambda k, o: found.append(k) if isinstance(o, h5py.Dataset) and o.dtype.kind == "f"
                     and o.ndim and o.size and k.startswith(under) and not found else None)
    return found[0] if found else None


def _first_float_key(data, key: str = "") -> str:
    if isinstance(data, float):
        return key
    for k, v in (data.items() if isinstance(data, dict) else ()):
        found = _first_float_key(v, f"{key}.{k}" if key else k)
        if found:
            return found
    return ""


def _set_json(path: Path, key: str, value) -> None:
    data = json.loads(path.read_text())
    node = data
    *parents, last = key.split(".")
    for k in parents:
        node = node[k]
    node[last] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("fault", ["nan", "truncated", "another model"])
def test_every_artifact_kind_refuses_each_fault_in_one_line(pipeline_copy, fault):
    repo = pipeline_copy
    checked = []
    for kind, (rel, key, read) in _readers().items():
        path = repo.path / rel
        whole = path.read_bytes()
        if fault == "nan":
            if path.suffix == ".h5":
                key = key if key and not key.endswith("/") else _first_float(path, key or "")
                if key is None:
                    continue
                with h5py.File(path) as f:
                    index = (0,) * f[key].ndim
                set_value(path, key, index)
            else:
                key = key or _first_float_key(json.loads(whole))
                _set_json(path, key, float("nan"))
        elif fault == "truncated":
            path.write_bytes(whole[: len(whole) // 2])
        else:
            shutil.copy(repo.path / rel.replace(A, B), path)
        with pytest.raises(StageError, match=".") as e:
            read(path)
            pytest.fail(f"{kind}: {fault} ({key}) read as valid")
        line = str(e.value)
        assert "\n" not in line and str(path) in line, (kind, line)
        if fault == "nan":
            assert isinstance(e.value, NonFiniteError) and key.split(".")[-1].split("/")[-1] in line, (kind, line)
        if fault == "another model":
            assert f"'{B}'" in line and f"'{A}'" in line, (kind, line)
        path.write_bytes(whole)
        read(path)  # put back: read as before
        checked.append(kind)
    assert len(checked) >= 7, checked


# ---- strict types in params ------------------------------------------------------------------------------

def _leaves(node, key=""):
    """(dotted key, value) of every scalar or list leaf of a params mapping."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    else:
        yield key, node


def _wrong(value):
    """A value of another type than `value` that no schema type of it accepts."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, str):
        return 1.5 if value != "auto" else True
    if isinstance(value, list):
        return {"not": "a list"}
    return None


def test_every_params_key_refuses_a_value_of_the_wrong_type_in_one_line(tmp_path):
    """Every leaf of params.yaml given a value of another type (a count `true`, a flag 1, a text 1.5, a list a
    mapping): one error naming the file, the key, the value as written and what was expected."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    file = tmp_path / "params.yaml"
    checked = 0
    for key, value in _leaves(raw):
        if value is None:
            continue  # null: any value of the key's own type is accepted
        changed = json.loads(json.dumps(raw))
        node = changed
        *parents, last = key.split(".")
        for k in parents:
            node = node[k]
        node[last] = _wrong(value)
        file.write_text(yaml.safe_dump(changed, sort_keys=False))
        with pytest.raises(ConfigError) as e:
            load_params(file)
        lines = str(e.value).splitlines()
        assert any(line.startswith(f"{file}: {key}") for line in lines), (key, str(e.value))
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("key,value,expected", [
    ("stats.n_boot", True, "stats.n_boot: Input should be a valid integer (got True)"),
    ("figures.dpi", True, "figures.dpi: Input should be a valid integer (got True)"),
    ("figures.n_heads", 2.0, "figures.n_heads: Input should be a valid integer (got 2.0)"),
    ("evaluate.batch_size", True, "evaluate.batch_size: Input should be a valid integer (or 'auto') (got True)"),
    ("extract.n_samples", "5", "extract.n_samples: Input should be a valid integer (got '5')"),
    ("activations.range", [True, 1.5], "activations.range.0: Input should be a valid number (got True)"),
])
def test_a_count_is_an_integer_not_true_nor_a_float(tmp_path, key, value, expected):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    section, name = key.split(".")
    raw[section][name] = value
    file = tmp_path / "params.yaml"
    file.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as e:
        load_params(file)
    assert str(e.value) == f"{file}: {expected}"


def test_dvc_exp_run_with_true_as_a_count_fails_naming_the_key(pipeline_copy):
    repo = pipeline_copy
    proc = repo.dvc("exp", "run", "-S", "stats.n_boot=true", f"stats@{A}", check=False)
    assert proc.returncode != 0
    assert "stats.n_boot: Input should be a valid integer (got True)" in proc.stdout + proc.stderr


# ---- a bad model folder ------------------------------------------------------------------------------------

@pytest.fixture
def project(tmp_path, cache_dir):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


def test_a_bad_model_folder_is_one_line_naming_the_file(tiny_dirs, project, tmp_path, capsys):
    before = project.read_text()

    def refused(folder: Path) -> str:
        assert add_model.main(["add-model", "mine", "--local", str(folder), "--params", str(project)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
        assert project.read_text() == before
        return err

    def copy(name: str) -> Path:
        return Path(shutil.copytree(tiny_dirs["llama"], tmp_path / name))

    bad_json = copy("bad-json")
    (bad_json / "config.json").write_text("{ not json")
    assert f"{bad_json / 'config.json'}: not JSON (Expecting property name enclosed in double quotes at line 1 " \
           "column 3)" in refused(bad_json)
    a_list = copy("a-list")
    (a_list / "config.json").write_text("[1, 2]")
    assert f"{a_list / 'config.json'}: expected a JSON object, found list" in refused(a_list)
    truncated = copy("truncated")
    weights = next(truncated.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1000])
    line = refused(truncated)
    assert f"{weights}: truncated:" in line and "not supported" not in line, line
    garbage = copy("garbage")
    weights = next(garbage.glob("*.safetensors"))
    weights.write_bytes(b"\xff" * 64)
    assert f"{weights}: not a safetensors file, or truncated" in refused(garbage)
    a_file = tmp_path / "a-file"
    a_file.write_text("weights")
    assert f"{a_file} is a file, not a model folder" in refused(a_file)


def test_prepare_refuses_a_malformed_config_in_one_line(tiny_dirs, write_params, cache_dir, tmp_path):
    from tests.test_evaluate import tiny_eval_params
    from tests.test_faults import stage as run_stage

    folder = Path(shutil.copytree(tiny_dirs["llama"], tmp_path / "model"))
    (folder / "config.json").write_text("{ not json")
    params = tiny_eval_params(write_params, {**tiny_dirs, "llama": folder})
    code, _, err = run_stage("prepare", params)
    assert code == 2 and f"{folder / 'config.json'}: not JSON" in one_error_line(err)
    with pytest.raises(ModelSourceError):
        from meaningless_tokens.models.sources import read_config

        read_config("tiny", folder / "config.json")


# ---- hints that work: the reference -----------------------------------------------------------------------

def test_a_deleted_reference_is_told_the_command_that_restores_it(pipeline_copy):
    repo = pipeline_copy
    shutil.rmtree(repo.path / "reference")
    code, got, line = verify(repo)
    row = got["reference"]
    assert row["status"] == "missing" and "restore it: git checkout -- reference" in row["detail"], row
    repo.run(*row["detail"].split("restore it: ")[1].rstrip(")").split())  # the row's command
    code, got, line = verify(repo)
    assert code == 0 and got["reference"]["status"] == "identical", line


def test_a_hand_edited_reference_in_the_workspace_is_said_to_be_so(pipeline_copy):
    repo = pipeline_copy
    manifest = repo.path / "reference" / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(data, indent=2) + "\n")  # the same content, edited by hand
    code, got, line = verify(repo)
    row = got["reference"]
    assert code == 1 and row["status"] == "differs", (line, row)
    assert "changed after its stage wrote it" in row["detail"] and "git checkout -- reference" in row["detail"], row
    repo.git("checkout", "--", "reference")
    code, got, line = verify(repo)
    assert code == 0, line


def test_metrics_reading_names_the_key_of_a_non_finite_value(tmp_path):
    from meaningless_tokens.store import read_metrics, write_metrics

    path = tmp_path / "metrics" / "likelihood" / "m.json"
    path.parent.mkdir(parents=True)
    with pytest.raises(NonFiniteError, match=r"m.json: contrasts.mless-none.delta: non-finite value nan"):
        write_metrics(path, {"contrasts": {"mless-none": {"delta": float("nan")}}})
    assert not path.exists()
    write_metrics(path, {"contrasts": {"mless-none": {"delta": 0.5, "ci95": [0.1, 0.9]}}})
    assert read_metrics(path)["model"] == "m"
    whole = path.read_text()
    path.write_text(whole.replace("0.9", "Infinity"))
    with pytest.raises(NonFiniteError, match=r"contrasts.mless-none.ci95.1: non-finite value inf.*dvc repro "
                                             r"likelihood@m"):
        read_metrics(path)
    other = tmp_path / "metrics" / "sweep" / "m.json"
    other.parent.mkdir()
    other.write_text(whole)
    with pytest.raises(ArtifactError, match=r"written by stage 'likelihood', expected 'sweep'"):
        read_metrics(other)
