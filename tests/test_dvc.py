"""DVC as users drive it: the real `dvc` command on a copy of the project with two tiny models.

The tests' shared tiny pipeline (tests/shared.py: one `dvc repro` of two tiny models for the whole run) is copied
for each test (`pipeline_copy`, tests/conftest.py), so whatever a test runs or breaks there touches no other test and
nothing is put back after it. The cold rerun of a fresh clone is tests/test_sharing.py's (a colleague's clone from a
bare git remote), and so is the span-length experiment (pushed, pulled and restored from the run-cache there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.dvc_repo import BIN, Repo, exp_table, params_diff, plot_ids, ran
from tests.shared import A, B, copy_of_pipeline, readme
from tests.test_explorer import check_loads
from tests.test_report import chromium

# every test here runs (part of) the pipeline through dvc, each in a copy of its own
pytestmark = pytest.mark.slow

STORE = Path(".local/share/meaningless-tokens/dvc-store")  # the default remote, under $HOME
# two points of docs/sharing.md's grid (0,25,55): 55 is the committed run's count, whose experiment reruns nothing (DVC
# finds every stage up to date), so the queue's cost is one experiment's while two are compared
GRID = (0, 55)


@pytest.fixture(scope="module")
def stage_names(tmp_path_factory) -> set[str]:
    """Every stage the tiny pipeline's dvc.yaml defines (foreach expanded), from `dvc stage list` once per worker."""
    r = copy_of_pipeline(tmp_path_factory, tmp_path_factory.mktemp("dvc") / "pipeline")
    names = set(r.stages())
    shutil.rmtree(r.path.parent, ignore_errors=True)
    return names


@pytest.fixture
def clean(pipeline_copy, stage_names) -> Repo:
    """The test's private copy of the tiny pipeline, with the stage sets the assertions name."""
    r = pipeline_copy
    r.all = stage_names
    r.report = {"report"} if "report" in r.all else set()  # the report stage, once dvc.yaml has it
    r.explorer = {"explorer"} & r.all  # reports/explorer.html: reads figures params, attention, activations, stats
    r.reference = {"reference"} & r.all  # reference/: reruns whenever a cached output changes
    return r


# ---- repro, status, minimal reruns --------------------------------------------------------------

@readme
def test_repro_runs_every_stage_once_then_status_is_clean_and_repro_does_nothing(clean):
    repo = clean
    assert repo.first_run == repo.all
    assert {f"{s}@{m}" for s in ("prepare", "extract", "evaluate", "stats") for m in (A, B)} | {"figures"} <= repo.all
    if repo.explorer and chromium():  # the single-prompt page `dvc repro` wrote opens and draws, offline
        check_loads(repo.path / "reports/explorer.html", n_models=2)
    proc = repo.dvc("repro")
    assert ran(proc) == set() and "Data and pipelines are up to date" in proc.stdout
    # new timestamps on every input and output, same bytes: nothing reruns
    for folder in ("data", "stages", "meaningless_tokens", "artifacts", "metrics", "reports"):
        for p in (repo.path / folder).rglob("*"):
            os.utime(p)
    assert repo.status() == {}
    assert repo.repro() == set()


@readme
def test_figure_param_reruns_only_figures_and_report(clean):
    repo = clean
    repo.set_params(figures__dpi=41)
    assert params_diff(repo) == {"figures.dpi": {"old": 40, "new": 41}}
    assert repo.repro() == {"figures"} | repo.report | repo.explorer | repo.reference
    assert repo.status() == {}
    assert repo.repro() == set()


def dry_runs(repo: Repo, changes: dict) -> dict[str, set[str]]:
    """{key: the stages `dvc repro --dry` names for that change alone}; params.yaml is the commit's again after."""
    direct = {}
    for key, value in changes.items():
        repo.set_params(**{key: value})
        direct[key] = repo.repro("--dry")
        repo.git("checkout", "-q", "--", "params.yaml")
    return direct


def test_model_stage_params_rerun_their_stages_figures_and_report_only(clean):
    """The activations', the sweep's and the likelihood's params, and a display name: DVC's dry run names the stages
    each change alone reads it in; one real `dvc repro` of the four reruns those, then the stages reading their
    outputs (figures, report, explorer, reference), and no other. A label costs no compute: not extract or evaluate
    (hours on a GPU), not stats; prepare (which lists the whole entry, to check it) reruns in seconds and writes the
    same manifest, so nothing after it reruns."""
    repo = clean
    acts, sweeps = {f"activations@{A}", f"activations@{B}"}, {f"sweep@{A}", f"sweep@{B}"}
    liks = {f"likelihood@{A}", f"likelihood@{B}"}
    changes = {"activations__bins": 60, "sweep__counts": [0, 5, 55], "likelihood__n_samples": 4,
               f"models__{A}__display_name": "Renamed model A"}
    direct = dry_runs(repo, changes)
    assert direct == {"activations__bins": acts | repo.explorer, "sweep__counts": sweeps, "likelihood__n_samples": liks,
                      f"models__{A}__display_name": {f"prepare@{A}", "figures"} | repo.report | repo.explorer}
    repo.set_params(**changes)
    assert params_diff(repo) == {"activations.bins": {"old": 360, "new": 60},
                                 "sweep.counts": {"old": "[0, 10, 55]", "new": "[0, 5, 55]"},
                                 "likelihood.n_samples": {"old": 3, "new": 4},
                                 f"models.{A}.display_name": {"old": "Tiny llama", "new": "Renamed model A"}}
    manifest = (repo.path / f"artifacts/models/{A}.json").read_bytes()
    assert repo.repro() == {f"prepare@{A}", "figures"} | acts | sweeps | liks | repo.report | repo.explorer | repo.reference
    assert repo.status() == {}
    # the display name: the same manifest, and no artifact of a model stage holds the label
    assert (repo.path / f"artifacts/models/{A}.json").read_bytes() == manifest
    for artifact in (f"artifacts/attention/{A}.h5", f"artifacts/eval/{A}.h5", f"artifacts/stats/{A}.h5",
                     f"artifacts/activations/{A}.h5"):
        assert b"Tiny llama" not in (repo.path / artifact).read_bytes()
    if repo.report:
        assert "Renamed model A" in (repo.path / "reports/report.md").read_text()
    # the explorer reads none of the sweep's or the likelihood's outputs: it reran for the others only
    explorer_deps = yaml.safe_load((repo.path / "dvc.yaml").read_text())["stages"]["explorer"]["deps"]
    assert not {"artifacts/sweep", "artifacts/likelihood"} & set(explorer_deps)
    for m in (A, B):
        got = json.loads((repo.path / f"metrics/sweep/{m}.json").read_text())
        assert list(got["tokens"]["/"]["counts"]) == ["0", "5", "55"]
        got = json.loads((repo.path / f"metrics/likelihood/{m}.json").read_text())
        assert got["n_problems"] == 4 and set(got["contrasts"]) == {"mless-none", "arm-none"}  # tests/profile.yaml
    shown = json.loads(repo.dvc("metrics", "show", "--json").stdout)
    assert any(f"metrics/likelihood/{A}.json" in json.dumps(v) for v in shown.values())
    # a figure-only param of the activation charts reruns no model stage either (the reference follows their
    # outputs, as the figure param's real rerun above shows)
    repo.set_params(figures__activation_set="after_span")
    assert set(repo.status()) == {"figures"} | repo.report | repo.explorer
    assert repo.repro("--dry") == {"figures"} | repo.report | repo.explorer


def test_extraction_and_evaluation_params_rerun_their_branches_only_in_an_experiment(clean):
    """One model's layers and the generation length in one `dvc exp run`: the model's extraction branch (prepare
    checks the entry in seconds and writes the same manifest, which does not hold layers), every model's evaluation
    and the sweep (it reads the generation params, for its optional accuracy sweep, but, that sweep being off here,
    writes the same bytes), and the stages reading their outputs; nothing of the other model's extraction, no
    activations or likelihood."""
    repo = clean
    direct = dry_runs(repo, {f"models__{A}__layers": [0, 1], "evaluate__max_new_tokens": 4})
    assert direct == {f"models__{A}__layers": {f"prepare@{A}", f"extract@{A}", "figures"} | repo.report | repo.explorer,
                      "evaluate__max_new_tokens": {f"evaluate@{A}", f"evaluate@{B}", f"sweep@{A}", f"sweep@{B}"}}
    proc = repo.dvc("exp", "run", "-n", "layers-tokens", "-S", f"models.{A}.layers=[0,1]",
                    "-S", "evaluate.max_new_tokens=4")
    accuracy_changed = repo.git("diff", "--quiet", "--", "metrics/accuracy", check=False).returncode != 0
    assert ran(proc) == ({f"prepare@{A}", f"extract@{A}", f"stats@{A}", f"evaluate@{A}", f"evaluate@{B}", f"sweep@{A}",
                          f"sweep@{B}", "figures"} | repo.report | repo.explorer | repo.reference)
    assert repo.status() == {}
    assert params_diff(repo) == {f"models.{A}.layers": {"old": "[0, 1, 2]", "new": "[0, 1]"},
                                 "evaluate.max_new_tokens": {"old": 8, "new": 4}}
    diff = json.loads(repo.dvc("metrics", "diff", "--json").stdout)
    if accuracy_changed:  # with at most 4 new tokens instead of 8, fewer tokens are generated
        assert any(k.startswith("mean_tokens.") for k in diff[f"metrics/accuracy/{A}.json"])


# ---- plots --------------------------------------------------------------------------------------

def test_plots_show_renders_the_attention_and_accuracy_tables(clean, tmp_path):
    repo = clean
    plots = json.loads(repo.dvc("plots", "show", "--json").stdout)["data"]
    assert set(plots) == plot_ids(A, B)
    for plot_id, [plot] in plots.items():
        rows = (repo.path / plot_id).read_text().splitlines()[1:]
        values = plot["content"]["data"]["values"]
        # one bar per row (accuracy, likelihood contrasts); or none, mless, mful; or drop, top drop, span mass
        fields = 1 if plot_id == "reports/accuracy.csv" or "/likelihood/" in plot_id else 3
        assert len(values) == fields * len(rows) and plot["revisions"] == ["workspace"]
    acc = {(v["model"], v["condition"]): v for v in plots["reports/accuracy.csv"][0]["content"]["data"]["values"]}
    for m in (A, B):
        metrics = json.loads((repo.path / f"metrics/accuracy/{m}.json").read_text())
        for c in ("none", "mless", "mful"):
            assert float(acc[(m, c)]["accuracy"]) == pytest.approx(metrics["accuracy"][c])
            assert int(acc[(m, c)]["correct"]) == metrics["correct"][c]
    repo.dvc("plots", "show", "-o", str(tmp_path / "show"))
    html = (tmp_path / "show" / "index.html").read_text()
    anchors = [f"vegaEmbed('#{re.sub(r'[/.]', '_', plot_id)}'" for plot_id in plot_ids(A, B)]
    for needle in [*anchors, "Attention each original token receives", "MATH-500 accuracy", f"{B} / mful"]:
        assert needle in html


# ---- sharing ----------------------------------------------------------------------------------------

def test_push_clone_pull_gives_identical_results_and_no_rerun(clean, tmp_path):
    repo = clean
    # the committed default remote: a folder under the user's home, the same for every clone
    assert f"url = ~/{STORE}" in (repo.path / ".dvc/config").read_text()
    assert repo.dvc("config", "core.remote").stdout.strip() == "localstore"
    repo.dvc("push")
    assert any((Path(repo.env["HOME"]) / STORE).rglob("*"))
    clone = Repo(tmp_path / "clone", repo.env)
    repo.git("clone", "-q", str(repo.path), str(clone.path))
    clone.dvc("pull")
    assert clone.status() == {}
    folders = ("artifacts", "metrics", "reports")
    mine, theirs = repo.files(*folders), clone.files(*folders)
    assert sorted(theirs) == sorted(mine)
    assert [p for p in mine if mine[p] != theirs[p]] == []
    assert any(p.startswith("reports/") for p in theirs) and any(p.startswith("metrics/") for p in theirs)
    assert clone.repro() == set()


# ---- bad input ------------------------------------------------------------------------------------

def test_pull_from_a_missing_remote_or_of_data_never_pushed_fails_with_dvcs_message(clean, tmp_path):
    repo = clean
    clone = Repo(tmp_path / "clone", repo.env)
    repo.git("clone", "-q", str(repo.path), str(clone.path))
    proc = clone.dvc("pull", "-r", "nosuch", check=False)
    assert proc.returncode != 0 and "remote 'nosuch' doesn't exist" in proc.stderr
    # a remote that holds nothing of this project (never pushed there)
    clone.dvc("remote", "modify", "--local", "localstore", "url", str(tmp_path / "empty-store"))
    proc = clone.dvc("pull", check=False)
    assert proc.returncode != 0
    assert "failed to pull data from the cloud" in proc.stderr
    assert "do not exist neither locally nor on remote" in proc.stderr
    assert not (clone.path / f"artifacts/attention/{A}.h5").exists()
    assert "deleted" in json.dumps(clone.status())  # nothing pulled is taken as present
    # no remote configured at all
    clone.dvc("remote", "remove", "localstore")
    proc = clone.dvc("pull", check=False)
    assert proc.returncode != 0 and "no default remote set" in proc.stderr


def test_deleted_artifact_is_reported_and_checked_out_again(clean):
    repo = clean
    h5 = repo.path / f"artifacts/attention/{A}.h5"
    data = h5.read_bytes()
    h5.unlink()
    status = repo.status()
    assert {"changed outs": {f"artifacts/attention/{A}.h5": "deleted"}} in status[f"extract@{A}"]
    assert f"stats@{A}" in status and f"extract@{B}" not in status
    proc = repo.dvc("checkout")
    assert h5.read_bytes() == data and repo.status() == {}, proc.stdout


def test_failed_stage_leaves_nothing_registered(clean):
    repo = clean
    lock = (repo.path / "dvc.lock").read_bytes()
    repo.set_params(figures__layer=3)  # not extracted: figures refuses it
    proc = repo.dvc("repro", check=False)
    assert proc.returncode != 0
    assert "figures.layer: layer 3 was not extracted" in proc.stderr
    assert "failed to reproduce 'figures'" in proc.stderr
    assert (repo.path / "dvc.lock").read_bytes() == lock
    assert "figures" in repo.status()
    assert not [p for p in repo.path.rglob("*.partial")]


def test_a_params_key_a_stage_lists_must_exist(clean):
    """DVC refuses a stage whose listed key is missing; the model's prepare (which lists the entry whole) runs
    first and names every missing key with the flags that add it, instead of DVC, one stage at a time."""
    repo = clean
    raw = yaml.safe_load((repo.path / "params.yaml").read_text())
    del raw["models"][B]["trust_remote_code"]  # listed by extract, activations, evaluate... of tiny-b
    del raw["models"][B]["layers"]
    (repo.path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    lock = (repo.path / "dvc.lock").read_bytes()
    proc = repo.dvc("repro", check=False)
    assert proc.returncode != 0
    assert (f"models.{B}: trust_remote_code, layers missing; DVC needs every key the stages list" in proc.stderr
            and f"dvc exp run -S '+models.{B}.trust_remote_code=false' -S '+models.{B}.layers=[0, 1, 2]'" in proc.stderr)
    assert "are missing from 'params.yaml'" not in proc.stderr  # DVC's own refusal never came
    assert ran(proc) == {f"prepare@{B}"} and (repo.path / "dvc.lock").read_bytes() == lock


def test_a_model_with_only_the_required_keys_is_completed_by_the_flags_its_error_names(clean, tiny_dirs):
    """issue 47: `dvc exp run -S` with the schema's required keys alone; the first error's flags complete it."""
    repo = clean
    folder = tiny_dirs["gemma3"]
    given = ["-S", "+models.mine.display_name=Mine", "-S", "+models.mine.source.kind=local_dir",
             "-S", f"+models.mine.source.path={folder}"]
    proc = repo.dvc("exp", "run", *given, "prepare@mine", check=False)
    assert proc.returncode != 0 and "are missing from 'params.yaml'" not in proc.stderr
    flags = re.search(r"dvc exp run ((?:-S '[^']+' ?)+)", proc.stderr).group(1)
    args = [a for pair in re.findall(r"(-S) '([^']+)'", flags) for a in pair]
    assert {a.split("=")[0] for a in args[1::2]} == {f"+models.mine.{k}" for k in
                                                      ("family", "trust_remote_code", "template", "layers", "heads", "arm")}
    proc = repo.dvc("exp", "run", *args, "prepare@mine", "extract@mine")  # the workspace kept the first three keys
    assert ran(proc) == {"prepare@mine", "extract@mine"}
    assert (repo.path / "artifacts/attention/mine.h5").is_file()


def test_a_folder_added_by_the_command_runs_through_dvc_and_joins_the_verdict(clean, tiny_dirs):
    """issue 47's done-when in a test repository: `mless add-model` on a model folder, one `dvc exp run`, and the
    model's column in docs/results.md's verdict table beside the others; no stage of the other models reruns."""
    repo = clean
    out = repo.run(str(BIN / "mless"), "add-model", "added", "--local", str(tiny_dirs["gemma3"]),
                   "--display-name", "Added gemma3", "--outcomes").stdout
    assert "gemma3" in out and "dvc exp run" in out
    proc = repo.dvc("exp", "run")
    model_stages = {f"{s}@added" for s in ("prepare", "extract", "stats", "activations", "sweep", "evaluate", "likelihood")}
    assert model_stages <= ran(proc)
    assert not {s for s in ran(proc) if s.endswith((f"@{A}", f"@{B}"))}
    header = next(line for line in (repo.path / "docs/results.md").read_text().splitlines() if line.startswith("| the paper's claim"))
    assert header.index("Tiny llama") < header.index("Tiny qwen2") < header.index("Added gemma3")


# ---- experiments queued and compared -----------------------------------------------------------------

def start_queue(repo: Repo) -> None:
    """`dvc queue start`, its output to a file: the worker it leaves running holds the stdout and stderr it was given,
    so a pipe would stay open (and `dvc queue start` seem to hang) until the worker exits, which an idle DVC worker
    has been seen not to do."""
    log = repo.path / ".dvc/tmp/queue-start.log"
    with open(log, "w") as out:
        proc = subprocess.run([str(BIN / "dvc"), "queue", "start"], cwd=repo.path, env=repo.env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=120)
    assert proc.returncode == 0, log.read_text()


def run_grid(repo: Repo) -> dict:
    """The DVC-native grid of docs/sharing.md: queue one experiment per count, run the queue, wait for it, stop the
    queue's worker."""
    queued = repo.dvc("exp", "run", "--queue", "-S", f"prompt.mless.count={','.join(map(str, GRID))}")
    start_queue(repo)
    deadline, idle, restarts = time.monotonic() + 900, 0, 0
    try:
        while True:
            status = repo.dvc("queue", "status").stdout
            if not re.search(r"\b(Queued|Running)\b", status) or time.monotonic() > deadline:
                break
            # DVC's queue worker can stop as it finishes a task while the next is still queued (seen under load):
            # after 10 s of queued tasks and no worker, a user starts it again, and so does the test
            idle = idle + 1 if "Running" not in status and "Worker status: 0 active, 0 idle" in status else 0
            if idle >= 5 and restarts < 2:
                start_queue(repo)
                idle, restarts = 0, restarts + 1
            time.sleep(2)
    finally:  # a worker left idle is no process of the test's to leave behind
        repo.dvc("queue", "stop", check=False)
    return {"queued": queued.stdout, "queue_status": status}


def test_span_grid_as_queued_experiments_compared(tmp_path_factory, tmp_path):
    """docs/sharing.md's grid over any param: `dvc exp run --queue -S 'prompt.mless.count=0,25,55'`, `dvc queue
    start`, then `dvc exp show`, `dvc params diff`, `dvc metrics diff` and `dvc plots diff` across the queued
    experiments (two experiments compared, as a user compares any two). In a copy of the pipeline that ran the
    count 0 before (tests/shared.py, SPAN0): the queued run restores those stages from the run-cache."""
    other = copy_of_pipeline(tmp_path_factory, tmp_path / "pipeline", experiment=True)
    got = run_grid(other)
    queued = re.findall(r"Queued experiment '([^']+)' for future execution", got["queued"])
    assert len(queued) == len(GRID), got["queued"]
    assert len(re.findall(r"\bSuccess\b", got["queue_status"])) == len(GRID), got["queue_status"]
    exps = exp_table(other)  # the grid's and SPAN0
    by_count = {e["params"]["params.yaml"]["data"]["prompt"]["mless"]["count"]: name for name, e in exps.items()
                if name in queued}
    assert set(by_count) == set(GRID)
    for count, name in by_count.items():
        data = exps[name]
        acc = data["metrics"][f"metrics/accuracy/{A}.json"]["data"]
        assert acc["n_problems"] == 3 and set(acc["accuracy"]) == {"none", "mless", "mful"}
        if count == 0:  # the mless prompt is the none prompt, so is its generation
            assert acc["accuracy"]["mless"] == acc["accuracy"]["none"]
        assert data["metrics"][f"metrics/sweep/{A}.json"]["data"]["tokens"]["/"]["counts"]["55"]["span_tokens"] > 0
    names = [by_count[c] for c in GRID]
    log = other.dvc("queue", "logs", by_count[0])
    restored = set(re.findall(r"Stage '([^']+)' is cached - skipping run", log.stdout + log.stderr))
    assert {f"extract@{A}", f"evaluate@{A}", f"extract@{B}", f"evaluate@{B}"} <= restored, log.stdout
    assert params_diff(other, *names) == {"prompt.mless.count": {"old": GRID[0], "new": GRID[1]}}
    metrics = json.loads(other.dvc("metrics", "diff", *names, "--all", "--json").stdout)
    assert {f"metrics/accuracy/{m}.json" for m in (A, B)} <= set(metrics)
    assert set(names) <= set(other.dvc("exp", "ls", "--name-only").stdout.split())  # docs/sharing.md's `$(dvc exp ls ...)`
    plots = json.loads(other.dvc("plots", "diff", *names, "--json").stdout)["data"]
    assert set(plots) == plot_ids(A, B)
    for plot_id, [plot] in plots.items():
        assert plot["revisions"] == names
        assert {v["rev"] for v in plot["content"]["data"]["values"]} == set(names)
    values = plots[f"artifacts/plots/full/{A}.csv"][0]["content"]["data"]["values"]
    length = {c: len({v["position"] for v in values if v["rev"] == by_count[c]}) for c in GRID}
    assert length[0] < length[55]  # a longer span: longer prompts
    mless = {c: [float(v["mless"]) for v in values if v["rev"] == by_count[c] and v["mless"] != "nan"] for c in GRID}
    none = [float(v["none"]) for v in values if v["rev"] == by_count[0] and v["none"] != "nan"]
    assert mless[0] == none  # count 0: the mless curve is the none curve
    other.dvc("plots", "diff", *names, "-o", str(tmp_path / "grid"))
    html = (tmp_path / "grid" / "index.html").read_text()
    assert all(f'"rev": "{n}"' in html for n in names)
