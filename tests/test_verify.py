"""`python -m meaningless_tokens.verify`: the workspace's outputs against a revision's, by value, on a real DVC repository.

Each test takes a private copy of the tests' shared tiny pipeline (`pipeline_copy`, tests/conftest.py; tests/shared.py:
two tiny models, the whole pipeline through one `dvc repro`, committed): whatever it edits or breaks there touches no
other test.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from meaningless_tokens.verify import TOLERANCES
from tests.dvc_repo import Repo
from tests.shared import A, SPAN0, copy_of_pipeline, readme

pytestmark = pytest.mark.slow  # runs the pipeline's outputs through dvc and verify


def verify(repo: Repo, *args: str) -> tuple[int, dict[str, dict], str]:
    """(exit status, {output path: row}, verdict line) of `python -m meaningless_tokens.verify --json ARGS`."""
    proc = repo.run("python", "-m", "meaningless_tokens.verify", "--json", *args, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1, 3, 4), proc.stderr
    got = json.loads(proc.stdout)
    return proc.returncode, {row["path"]: row for row in got["outputs"]}, got["verdict"]


def lock_outputs(repo: Repo, text: str | None = None) -> dict[str, str]:
    lock = yaml.safe_load(text if text is not None else (repo.path / "dvc.lock").read_text())
    return {o["path"]: o["md5"] for st in lock["stages"].values() for o in st.get("outs", [])}


def edit_h5(path: Path, name: str, fn) -> None:
    """Rewrite one dataset of an HDF5 file in place (fn: old values -> new values, any shape)."""
    with h5py.File(path, "r+") as f:
        old, attrs = f[name][()], dict(f[name].attrs)
        del f[name]
        f[name] = fn(old)
        f[name].attrs.update(attrs)


@readme
def test_verify_against_itself_is_identical_with_a_row_per_output(pipeline_copy):
    repo = pipeline_copy
    proc = repo.run("python", "-m", "meaningless_tokens.verify")  # the table and verdict a user reads; exit 0
    outputs = lock_outputs(repo)
    rows = [line.split()[0] for line in proc.stdout.splitlines()[1:]
            if line and not line.startswith(("reproduced", " ", "conclusions: "))]
    assert sorted(rows) == sorted(outputs)
    timing = [p for p in outputs if p.startswith("metrics/timing/")]
    assert proc.stdout.strip().endswith(
        f"reproduced: {len(outputs)} outputs, {len(outputs) - len(timing)} identical, 0 within tolerance, 0 differ, "
        f"{len(timing)} run records")
    assert "\nconclusions: every verdict word, sign, Holm decision and pooled decision equal; the largest move of an " \
           "estimate 0 standard errors" in proc.stdout
    code, got, _ = verify(repo, "HEAD")
    assert code == 0 and {r["status"] for p, r in got.items() if p not in timing} == {"identical"}
    # the run's sidecar records the machine facts that explain a float's last digits
    sidecar = json.loads((repo.path / f"metrics/timing/likelihood-{A}.json").read_text())
    assert sidecar["cpu_capability"] and sidecar["threads"] == 1 and sidecar["device"] == "cpu" and sidecar["cpu_model"]


def test_hdf5_values_within_and_beyond_tolerance(pipeline_copy):
    repo = pipeline_copy
    lik, att = repo.path / f"artifacts/likelihood/{A}.h5", repo.path / f"artifacts/attention/{A}.h5"
    rtol, atol = TOLERANCES["loglik"].rtol, TOLERANCES["attention-received"].atol  # recv_*: attention received

    def scale(factor):
        def fn(v):
            v = v.copy()
            v[1] *= factor
            return v
        return fn

    edit_h5(lik, "none/solution/sum", scale(1 + rtol / 4))
    code, got, line = verify(repo)
    row = got[f"artifacts/likelihood/{A}.h5"]
    assert code == 0 and line.startswith("reproduced:") and "1 within tolerance" in line
    assert row["status"] == "within tolerance" and "none/solution/sum[1]" in row["detail"] and "loglik" in row["detail"]
    assert got[f"artifacts/attention/{A}.h5"]["status"] == "identical"

    def nudge(v):  # 3x the element's tolerance
        v = v.copy()
        v[0, 1, 7] += 3 * (atol + TOLERANCES["attention-received"].rtol * abs(v[0, 1, 7]))
        return v

    edit_h5(att, "mless/recv_all", nudge)
    code, got, line = verify(repo)
    row = got[f"artifacts/attention/{A}.h5"]
    # a value beyond its tolerance in a file otherwise alike, the verdict's conclusions all equal: an answer of its own
    assert code == 4 and line.startswith("reproduced in its conclusions: 1 value(s) beyond float noise "
                                         f"(artifacts/attention/{A}.h5: mless/recv_all[0, 1, 7]), every conclusion equal")
    assert "1 beyond tolerance, 0 differ" in line
    assert row["status"] == "beyond tolerance" and row["detail"].startswith("1 value(s) beyond tolerance, the first: "
                                                                            "mless/recv_all[0, 1, 7]: ")
    assert "here" in row["detail"] and "in the revision" in row["detail"]
    # what reads it is judged by what it draws from: the figures, pages and the reference are beyond tolerance too
    assert got["reports/figures"]["status"] == "identical"  # not redrawn: its bytes are the revision's
    # both sides' run facts are printed for an output that is not identical
    proc = repo.run("python", "-m", "meaningless_tokens.verify", check=False)
    assert f"extract@{A}: device cpu; cpu_model" in proc.stdout


def test_damaged_outputs_each_get_a_clear_status(pipeline_copy):
    repo = pipeline_copy
    edit_h5(repo.path / f"artifacts/stats/{A}.h5", "mless/drop", lambda v: v[:, :2])  # a changed shape
    with h5py.File(repo.path / f"artifacts/activations/{A}.h5", "r+") as f:  # a deleted dataset
        del f["none/original/gini"]
    metrics = repo.path / f"metrics/likelihood/{A}.json"  # a metrics key removed
    data = json.loads(metrics.read_text())
    del data["contrasts"]["mless-none"]["answer"]["delta"]
    metrics.write_text(json.dumps(data))
    sweep = repo.path / f"artifacts/sweep/{A}.h5"  # a truncated HDF5 file
    sweep.write_bytes(sweep.read_bytes()[:4000])
    (repo.path / f"artifacts/plots/full/{A}.csv").unlink()  # a deleted output
    code, got, line = verify(repo)
    assert code == 1 and "4 differ" in line and "1 missing" in line
    assert got[f"artifacts/stats/{A}.h5"]["detail"] == "mless/drop: shape (3, 2) here, (3, 4) in the revision"
    assert got[f"artifacts/activations/{A}.h5"]["detail"] == "none/original/gini: in the revision, not here"
    assert got[f"metrics/likelihood/{A}.json"]["detail"] == "key contrasts.mless-none.answer.delta: in the revision, not here"
    assert got[f"artifacts/sweep/{A}.h5"]["detail"].startswith("not a readable HDF5 file here (truncated or corrupt?)")
    assert got[f"artifacts/plots/full/{A}.csv"]["status"] == "missing"
    assert got["reports/report.html"]["status"] == "identical"  # its bytes are the revision's


def test_wall_times_inside_the_verdict_are_not_compared(pipeline_copy):
    """metrics/verdict.json's power section records how long the run took (and what more problems would cost):
    a rerun elsewhere changes them without changing a result; every other number of it is compared."""
    repo = pipeline_copy
    path = repo.path / "metrics/verdict.json"
    original = path.read_text()

    def walk(node, fn, key=""):
        if isinstance(node, dict):
            return {k: walk(v, fn, k) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, fn, key) for v in node]
        return fn(key, node)

    timed = []

    def slower(key, v):
        if ("seconds" in key or "hours" in key) and isinstance(v, (int, float)) and not isinstance(v, bool):
            timed.append(key)
            return v * 3 + 1
        return v

    path.write_text(json.dumps(walk(json.loads(original), slower)))
    code, got, _ = verify(repo)
    row = got["metrics/verdict.json"]
    assert timed and code == 0 and row["status"] == "within tolerance" and row["detail"].startswith("values and attributes equal"), row
    data = json.loads(original)
    data["power"]["likelihood"][A]["mde_nats_per_token"] += 0.01  # a result, not a time
    path.write_text(json.dumps(data))
    code, got, _ = verify(repo)
    row = got["metrics/verdict.json"]  # beyond its tolerance, named; no conclusion rests on it
    assert code == 4 and row["status"] == "beyond tolerance" and f"power.likelihood.{A}.mde_nats_per_token" in row["detail"]


def test_a_revision_made_before_the_reference_is_compared_from_the_cache_alone(pipeline_copy, tmp_path):
    """A revision whose pipeline had no reference stage: what no cache or remote holds is not compared, as it was."""
    repo = pipeline_copy
    branch = repo.git("rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    repo.git("checkout", "-q", "-b", "before-reference")
    try:
        for name in ("dvc.yaml", "dvc.lock"):
            data = yaml.safe_load((repo.path / name).read_text())
            del data["stages"]["reference"]
            (repo.path / name).write_text(yaml.safe_dump(data, sort_keys=False))
        repo.git("rm", "-r", "-q", "reference")
        repo.git("commit", "-q", "-am", "a pipeline without the reference")
        edit_h5(repo.path / f"artifacts/likelihood/{A}.h5", "none/solution/sum", lambda v: v * (1 + 1e-6))
        metrics = repo.path / f"metrics/likelihood/{A}.json"
        metrics.write_text(metrics.read_text())  # unchanged: git holds the revision's copy
        # a workspace verified before, with its cache: DVC's index keeps the revision's folder listings (the figures'),
        # which it does not keep for a file's contents (the likelihood's), so that only the file is out of reach below
        verify(repo)
        repo.dvc("cache", "dir", "--local", str(tmp_path / "empty-cache"))  # no cache, and nothing was pushed
        code, got, line = verify(repo)
        row = got[f"artifacts/likelihood/{A}.h5"]
        assert row["status"] == "not compared" and "no cache or remote" in row["detail"]
        assert "has no reference" in row["detail"] and row["via"] is None
        assert code == 3 and line.startswith("not verified:") and "1 not compared" in line, line
        assert got[f"metrics/likelihood/{A}.json"]["status"] == "identical"  # in git: always comparable
        assert got[f"artifacts/attention/{A}.h5"]["status"] == "identical"  # dvc.lock's hash suffices
    finally:
        repo.git("checkout", "-q", "-f", branch)
        repo.git("branch", "-q", "-D", "before-reference")


def fresh_clone(repo: Repo, tmp_path: Path, rev: str = "HEAD") -> Repo:
    """A clone of `rev` on a machine that never saw the results: no cache, no DVC index, a default remote that
    holds nothing, and the workspace's outputs copied in (a rerun on the same kind of machine: the same bytes)."""
    import shutil

    clone = Repo(tmp_path / "clone", repo.env)
    repo.git("clone", "-q", str(repo.path), str(clone.path))
    clone.git("checkout", "-q", rev)
    for out in lock_outputs(repo):
        src, dest = repo.path / out, clone.path / out
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        elif not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    clone.dvc("cache", "dir", "--local", str(tmp_path / "empty-cache"))
    remote = clone.dvc("remote", "default").stdout.strip()
    clone.dvc("remote", "modify", "--local", remote, "url", str(tmp_path / "empty-remote"))
    return clone


def test_with_no_cache_or_remote_every_output_is_compared_from_the_reference(pipeline_copy, tmp_path):
    """A fresh clone elsewhere: the revision's cached outputs are nowhere, its reference (in git) stands for them."""
    repo = fresh_clone(pipeline_copy, tmp_path)
    code, got, line = verify(repo)  # the same bytes: dvc.lock's md5s, the figures' listing from the reference
    assert code == 0 and line.startswith("reproduced:") and "not compared" not in line, line
    att = f"artifacts/attention/{A}.h5"

    def shifted(factor):
        def fn(v):  # one prompt's positions of layer 0, head 1, each moved by `factor` times its tolerance
            v = v.copy()
            with h5py.File(repo.path / att) as f:
                start, end = f["mless/offsets"][1:3]
            tol = TOLERANCES["attention-received"]
            v[0, 1, start:end] += factor * (tol.atol + tol.rtol * np.abs(v[0, 1, start:end]))
            return v
        return fn

    edit_h5(repo.path / f"artifacts/likelihood/{A}.h5", "none/solution/sum", lambda v: v * (1 + 1e-6))
    edit_h5(repo.path / att, "mless/recv_all", shifted(0.3))
    figure = next((repo.path / "reports/figures").glob("*.png"))
    figure.write_bytes(figure.read_bytes() + b"\0")  # a figure's bytes, drawn from the same values
    code, got, line = verify(repo)
    assert code == 0 and line.startswith("reproduced:") and "not compared" not in line, (line, got)
    for path in (f"artifacts/likelihood/{A}.h5", att):
        assert got[path]["status"] == "within tolerance" and got[path]["via"] == "reference", got[path]
    assert got["reports/figures"]["status"] == "within tolerance" and got["reports/figures"]["via"] == "reference"
    proc = repo.run("python", "-m", "meaningless_tokens.verify", check=False)
    assert f"{att}" in proc.stdout and "within tolerance (reference)" in proc.stdout
    edit_h5(repo.path / att, "mless/recv_all", shifted(3 / 0.3))  # now 3x in all
    code, got, line = verify(repo)
    assert code == 4 and got[att]["status"] == "beyond tolerance" and got[att]["via"] == "reference"
    assert "the first: mless/recv_all[0, 1]: positions " in got[att]["detail"] and "prompt 1's 0.." in got[att]["detail"]


def test_a_hand_edited_reference_is_one_line_and_its_rows_are_not_compared(pipeline_copy, tmp_path):
    repo = pipeline_copy
    branch = repo.git("rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    held = repo.path / "reference" / f"artifacts/likelihood/{A}.h5"
    repo.git("checkout", "-q", "-b", "edited-reference")
    try:
        held.write_bytes(held.read_bytes()[:-100])  # truncated, and committed so
        repo.git("commit", "-q", "-am", "a damaged reference")
        clone = fresh_clone(repo, tmp_path, "edited-reference")
    finally:
        repo.git("checkout", "-q", "-f", branch)
        repo.git("branch", "-q", "-D", "edited-reference")
    edit_h5(clone.path / f"artifacts/likelihood/{A}.h5", "none/solution/sum", lambda v: v * (1 + 1e-6))
    code, got, line = verify(clone)
    # the likelihood's file, and the figures' listing (a folder: its files' md5s are in the reference alone)
    assert code == 3 and {p for p, r in got.items() if r["status"] == "not compared"} == {
        f"artifacts/likelihood/{A}.h5", "reports/figures"}, line
    row = got[f"artifacts/likelihood/{A}.h5"]
    assert "edited, truncated or from another run" in row["detail"]
    proc = clone.run("python", "-m", "meaningless_tokens.verify", check=False)
    notes = [x for x in proc.stdout.splitlines() if x.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"note: reference/artifacts/likelihood/{A}.h5 at HEAD: md5 "), proc.stdout


def test_a_page_drawn_by_moved_code_is_compared_by_what_it_prints(pipeline_copy):
    """The report's code moved (its dep's md5 differs) while its inputs reproduced: the page reproduces when it
    prints the same, the module paths it names and the run records set aside; a printed result moved differs."""
    import re

    repo = pipeline_copy
    lock = yaml.safe_load((repo.path / "dvc.lock").read_text())
    dep = next(d for d in lock["stages"]["report"]["deps"] if d["path"] == "meaningless_tokens/report")
    dep["md5"] = "0" * 32 + ".dir"  # the code differs from the revision's
    (repo.path / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    page = repo.path / "reports/report.md"
    original = page.read_text()
    module = re.search(r"meaningless_tokens/[\w/]+\.py", original)
    assert module, "the report names no module"
    page.write_text(original.replace(module[0], "meaningless_tokens/moved/" + Path(module[0]).name))
    code, got, line = verify(repo)
    row = got["reports/report.md"]
    assert code == 0 and row["status"] == "within tolerance", (line, row)
    assert "drawn by other code (meaningless_tokens/report)" in row["detail"]
    assert got["reports/report.html"]["status"] == "identical"
    number = re.search(r"(?<![\w.])\+(\d+)\.(\d) %", original)  # a printed drop, "+16.6 %"
    page.write_text(original.replace(number[0], f"+{int(number[1]) + 1}.{number[2]} %", 1))
    code, got, line = verify(repo)
    row = got["reports/report.md"]
    assert code == 1 and row["status"] == "differs" and re.match(r"line \d+: ", row["detail"]), row
    assert "drawn by other code (meaningless_tokens/report)" in row["detail"]


def test_an_experiment_reports_exactly_what_its_parameter_changed(tmp_path_factory, tmp_path):
    repo = copy_of_pipeline(tmp_path_factory, tmp_path / "pipeline", experiment=True)
    repo.dvc("exp", "apply", SPAN0)  # the pipeline's experiment (tests/shared.py): prompt.mless.count=0
    before, after = lock_outputs(repo, repo.git("show", "HEAD:dvc.lock").stdout), lock_outputs(repo)
    changed = {p for p in after if after[p] != before[p] and not p.startswith("metrics/timing/")}
    code, got, line = verify(repo, "HEAD")
    assert code == 1 and line.startswith("not reproduced:")
    # made from other params: an artifact differs (its provenance), a metrics file's moved values are beyond tolerance
    assert {p for p, r in got.items() if r["status"] in ("differs", "beyond tolerance")} == changed
    assert got[f"artifacts/attention/{A}.h5"]["status"] == "differs"
    assert {p for p, r in got.items() if r["status"] == "identical"} == {
        p for p in after if p not in changed and not p.startswith("metrics/timing/")}
    assert f"artifacts/sweep/{A}.h5" not in changed  # the sweep sets its own span lengths
    assert any("params.prompt.mless.count: 0 here, 55 in the revision" in r["detail"] for r in got.values())
    # the experiment against itself, by name: reproduced
    code, got, line = verify(repo, SPAN0)
    assert code == 0 and "0 differ" in line


def test_the_documented_tolerances_are_the_declared_ones():
    """docs/sharing.md's table of tolerances lists every kind of TOLERANCES with its atol and rtol."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "sharing.md").read_text()
    section = text.split("### Tolerances and their basis", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].strip("`") in TOLERANCES:
            rows[cells[0].strip("`")] = (float(cells[1]), float(cells[2]))
    assert rows == {k: (t.atol, t.rtol) for k, t in TOLERANCES.items()}


def test_a_key_only_the_workspace_has_is_added_not_a_difference(pipeline_copy):
    repo = pipeline_copy
    metrics = repo.path / f"metrics/likelihood/{A}.json"
    data = json.loads(metrics.read_text())
    data["contrasts"]["mless-none"]["answer"]["new_statistic"] = 0.5  # what a newer stage records beside the others
    metrics.write_text(json.dumps(data))
    with h5py.File(repo.path / f"artifacts/activations/{A}.h5", "r+") as f:
        f["none/original"].create_dataset("new_measure", data=[1.0, 2.0])
    code, got, line = verify(repo)
    assert code == 0 and line.startswith("reproduced: "), line
    row = got[f"metrics/likelihood/{A}.json"]
    assert row["status"] == "within tolerance" and "added here: key contrasts.mless-none.answer.new_statistic" in row["detail"]
    assert "added here: none/original/new_measure" in got[f"artifacts/activations/{A}.h5"]["detail"]


def test_reruns_under_other_float_kernels_reproduce_and_the_calibration_measures_them(pipeline_copy):
    """The shared tiny pipeline's numerically sensitive stages rerun under torch's portable kernels and oneMKL's
    compatible code path (`python -m meaningless_tokens.verify.calibrate`, one model's stages): each variant's outputs,
    put in the workspace, reproduce the committed run, and the table names every kind it measured."""
    repo = pipeline_copy
    variants = ("aten-default", "mkl-compatible")
    proc = repo.run("python", "-m", "meaningless_tokens.verify.calibrate", "--variants", ",".join(variants),
                    "--models", A, "--keep", "--out", "calibration.md", "--json", "calibration.json")
    assert "Traceback" not in proc.stderr
    got = json.loads((repo.path / "calibration.json").read_text())
    assert sorted(got["runs"]) == sorted(variants) and not got["skipped"]
    table = (repo.path / "calibration.md").read_text()
    assert all(f"| {v} | " in table for v in variants) and "| `attention` |" in table
    for v in variants:
        measured = got["measured"][f"{v} / committed"]
        assert not measured["differs"], measured["differs"]
        assert all(share <= 1 for share, _ in measured["by_kind"].values()), measured["by_kind"]
        tree = repo.path / ".calibrate" / v / "tree"
        for out in lock_outputs(repo):
            if (tree / out).is_file():
                (repo.path / out).write_bytes((tree / out).read_bytes())
        code, rows, line = verify(repo)
        assert code == 0 and line.startswith("reproduced: "), (v, line)
        assert any(r["status"] == "within tolerance" for r in rows.values()) or all(
            r["status"] in ("identical", "run record") for r in rows.values())
    assert repo.git("status", "--porcelain", ".calibrate").stdout == ""  # the copies are git's ignored files
