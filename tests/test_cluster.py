"""`mless repro --cluster`: the tiny pipeline's stages as Ray tasks on Ray's multi-node test cluster (two nodes on
this machine, each with one CPU and two GPUs that do not exist), against a serial `dvc repro` of the same change.

One scheduled run serves most tests (module fixture `scheduled`): `extract.showcase`, `evaluate.n_samples` and
`sweep.accuracy_samples` changed, so both models' extraction (a GPU task each), evaluation and sweep (two shard tasks
each, a GPU each, and a merge; the sweep after its model's evaluation, whose kept generations it reads) run, then the
CPU stages; a Ray worker is killed (SIGKILL) in the middle of one stage. The model stages ask for GPUs
(`--gpus all`: the tests' profile runs on the CPU). The second node's tasks have a DVC cache of their own and reach
the first node's outputs through the project's DVC remote (the default, a folder under $HOME).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.dvc_repo import BIN, RUN_RECORDS, ran
from tests.shared import A, B, copy_of_pipeline

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster")]

# evaluate: 18 rows at batch size 9, two batches, two shards; the sweep: 4 problems x counts 0, 10, 55, 12 rows
CHANGE = {"extract__showcase": 2, "evaluate__n_samples": 6, "sweep__accuracy_samples": 4}
OUTPUT_FOLDERS = ("artifacts", "metrics", "reports/figures", "reference", "docs/results")


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine: 1 CPU, 2 declared GPUs and a 100 MB object store each, no dashboard."""
    from ray.cluster_utils import Cluster

    node = dict(num_cpus=1, num_gpus=2, object_store_memory=100 * 2**20)
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def schedule(repo, cluster, tmp: Path, *args: str):
    return repo.run(str(BIN / "mless"), "repro", "--cluster", cluster.address, "--gpus", "all", "--scratch",
                    str(tmp / "scratch"), "--timeline", str(tmp / "timeline"), *args, check=False)


def stage_processes(stage: str):
    return [p for p in psutil.process_iter(["cmdline"]) if f"stages.{stage}" in " ".join(p.info["cmdline"] or [])]


def ray_worker_of(proc: psutil.Process) -> psutil.Process | None:
    for parent in proc.parents():
        if any("ray::" in part or "default_worker.py" in part for part in parent.cmdline()):
            return parent
    return None


def kill_worker_running(stage: str, killed: dict, timeout: float = 240) -> None:
    """SIGKILL the Ray worker whose task runs `python -m stages.<stage>`, once it has started."""
    end = time.time() + timeout
    while time.time() < end and "pid" not in killed:
        for proc in stage_processes(stage):
            try:
                worker = ray_worker_of(proc)
                if worker is not None:
                    killed.update(pid=worker.pid, at=time.time())
                    worker.send_signal(signal.SIGKILL)
                    return
            except psutil.Error:
                continue
        time.sleep(0.05)


def lock_without_run_records(repo) -> dict:
    """dvc.lock less the entries of run records (and the folder `reports`, a dependency of the reference that holds
    the report's pages)."""
    lock = yaml.safe_load((repo.path / "dvc.lock").read_text())
    for st in lock["stages"].values():
        for section in ("outs", "deps"):
            st[section] = [o for o in st.get(section, []) if not o["path"].startswith(RUN_RECORDS)
                           and o["path"] != "reports"]
    return lock


def results(repo) -> dict[str, bytes]:
    return {p: b for p, b in repo.files(*OUTPUT_FOLDERS).items() if not p.startswith(RUN_RECORDS)}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    repo = copy_of_pipeline(tmp_path_factory, tmp_path_factory.mktemp("serial") / "pipeline")
    repo.set_params(**CHANGE)
    repo.ran = repo.repro()
    return repo


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory, cluster):
    tmp = tmp_path_factory.mktemp("scheduled")
    repo = copy_of_pipeline(tmp_path_factory, tmp / "pipeline")
    repo.set_params(**CHANGE)
    repo.lock_before = (repo.path / "dvc.lock").read_bytes()
    killed: dict = {}
    killer = threading.Thread(target=kill_worker_running, args=("stats", killed), daemon=True)
    killer.start()
    repo.proc = schedule(repo, cluster, tmp, "--shards", "2")
    killer.join(timeout=1)
    repo.killed = killed
    repo.timeline = json.loads((tmp / "timeline" / "timeline.json").read_text())
    repo.chart = tmp / "timeline" / "timeline.png"
    return repo


def test_the_scheduled_run_gives_the_serial_runs_outputs_and_lock(scheduled, serial):
    assert scheduled.proc.returncode == 0, scheduled.proc.stdout + scheduled.proc.stderr
    assert lock_without_run_records(scheduled) == lock_without_run_records(serial)
    got, want = results(scheduled), results(serial)
    assert sorted(got) == sorted(want)
    assert [p for p in want if got[p] != want[p]] == []
    # the workspace's own dvc repro restored every stage a task ran, and ran only what DVC cannot restore
    assert ran(scheduled.proc) - {"report", "reference"} == {s for s in serial.ran if s not in ("report", "reference")}
    assert "Running stage 'report'" in scheduled.proc.stdout and "Running stage 'extract@" not in scheduled.proc.stdout
    assert scheduled.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tasks_ran_on_both_nodes_and_overlapping_gpu_tasks_on_a_node_saw_different_devices(scheduled):
    tasks = scheduled.timeline["tasks"]
    assert scheduled.timeline["nodes"] == 2 and len({t["node"] for t in tasks}) == 2
    gpu = [t for t in tasks if t["gpus"]]
    assert {t["step"] for t in gpu} >= {f"extract@{A}", f"extract@{B}", f"evaluate@{A}", f"evaluate@{B}"}
    overlapping = [(s, t) for s in gpu for t in gpu if s is not t and s["node"] == t["node"]
                   and s["start"] < t["end"] and t["start"] < s["end"]]
    assert overlapping, "no two GPU tasks overlapped on one node"
    assert all(s["gpus"] != t["gpus"] for s, t in overlapping)
    assert {t["gpus"] for t in gpu} <= {"0", "1"}
    assert all(t["gpus"] == "" for t in tasks if not t["step"].startswith(("extract@", "evaluate@", "sweep@",
                                                                         "explorer")))


def test_a_node_fetched_through_the_dvc_remote_what_another_node_made(scheduled):
    tasks = scheduled.timeline["tasks"]
    made_on = {t["step"]: t["node"] for t in tasks if t["kind"] != "shard" and t["step"] in t["ran"]}
    fetched = [(t["step"], s) for t in tasks for s in t["restored"] if s in made_on and made_on[s] != t["node"]]
    assert fetched, made_on
    assert scheduled.timeline["remote"] is True


@pytest.mark.parametrize("stage, rows", [("evaluate", 18), ("sweep", 12)])
def test_evaluate_and_the_sweep_ran_as_shards_merged_without_a_copy_by_hand(stage, rows, scheduled):
    tasks = scheduled.timeline["tasks"]
    for m in (A, B):
        shards = [t for t in tasks if t["kind"] == "shard" and t["step"] == f"{stage}@{m}"]
        assert sorted(t["shard"] for t in shards) == ["0/2", "1/2"]
        merge = [t for t in tasks if t["kind"] == "merge" and t["step"] == f"{stage}@{m}"]
        assert len(merge) == 1 and merge[0]["start"] >= max(t["end"] for t in shards)
        assert f"merged {rows} generations from 2 shard parts" in Path(merge[0]["log"]).read_text()
        if stage == "sweep":  # after evaluate of its model, as a serial run (evaluate's kept rows are its to take)
            evaluated = [t for t in tasks if t["kind"] == "merge" and t["step"] == f"evaluate@{m}"][0]
            assert min(t["start"] for t in shards) >= evaluated["end"]
            assert all(f"evaluate@{m}" in t["restored"] for t in shards), [t["restored"] for t in shards]


def test_a_killed_worker_is_retried_and_the_outputs_are_the_same_bytes(scheduled, serial):
    assert "pid" in scheduled.killed, "no stats stage was seen running"
    assert scheduled.proc.returncode == 0
    stats = [t for t in scheduled.timeline["tasks"] if t["step"].startswith("stats@")]
    assert len(stats) == 2 and scheduled.killed["pid"] not in {t["pid"] for t in stats}
    assert any(t["end"] > scheduled.killed["at"] for t in stats)
    for m in (A, B):
        p = f"artifacts/stats/{m}.h5"
        assert (scheduled.path / p).read_bytes() == (serial.path / p).read_bytes()


def test_a_failing_stage_stops_the_run_in_one_line_and_a_rerun_runs_only_it_and_what_follows(
        tmp_path, cluster, tmp_path_factory):
    """figures.sweep_layers [0, 7] (the tiny models' layers are 0-2) passes the params' schema and fails in figures,
    the one stage that draws the layer sweep; the statistics, changed too (stats.n_boot), succeed before it."""
    repo = copy_of_pipeline(tmp_path_factory, tmp_path / "pipeline")
    repo.set_params(stats__n_boot=40, figures__sweep_layers=[0, 7])
    lock, outputs = (repo.path / "dvc.lock").read_bytes(), repo.files(*OUTPUT_FOLDERS)
    proc = schedule(repo, cluster, tmp_path / "first")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: figures on node"), errors[0]
    assert "figures.sweep_layers: layer 7 was not extracted" in errors[0], errors[0]
    assert (repo.path / "dvc.lock").read_bytes() == lock and repo.files(*OUTPUT_FOLDERS) == outputs
    first = json.loads((tmp_path / "first" / "timeline" / "timeline.json").read_text())
    done_first = {t["step"] for t in first["tasks"] if t["step"] in t["ran"]}
    assert first["failed"] and {f"stats@{A}", f"stats@{B}"} <= done_first
    repo.set_params(figures__sweep_layers=[0, 1])
    proc = schedule(repo, cluster, tmp_path / "second")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = json.loads((tmp_path / "second" / "timeline" / "timeline.json").read_text())
    ran_again = {t["step"] for t in second["tasks"] if t["step"] in t["ran"]}
    assert "figures" in ran_again and ran_again <= {"figures", "explorer"}
    restored = {t["step"] for t in second["tasks"] if t["step"] in t["restored"]}
    assert {f"stats@{A}", f"stats@{B}"} <= restored
    assert repo.status() == {}


def test_a_lock_entry_whose_outputs_no_cache_holds_is_left_out_so_that_dvc_asks_the_run_cache(tmp_path,
                                                                                             tmp_path_factory):
    """A fresh clone: dvc.lock was written where its outputs were made, and this DVC cache lacks them (here stats@A's
    timing sidecar, recorded with another run's bytes, and its outputs gone from the workspace). DVC runs such a
    stage again though the run-cache holds it; the scheduler leaves the entry out (in each task's worktree and before
    the workspace's final `dvc repro`), and DVC restores the stage from the run-cache."""
    from meaningless_tokens.cluster import graph, workspace

    repo = copy_of_pipeline(tmp_path_factory, tmp_path / "pipeline")
    stage, lock_path = f"stats@{A}", repo.path / "dvc.lock"
    lock = yaml.safe_load(lock_path.read_text())
    for out in lock["stages"][stage]["outs"]:
        if out["path"].startswith("metrics/timing/"):
            out["md5"] = "0" * 32  # another machine's run record
        (repo.path / out["path"]).unlink()
    lock_path.write_text(yaml.safe_dump(lock, sort_keys=False))
    stale = lock_path.read_bytes()
    assert [s.name for s in graph.plan(repo.path) if s.stale] == [stage]

    assert "Running stage 'stats@" in repo.dvc("repro", stage).stdout  # DVC's own way: the stage runs again
    lock_path.write_bytes(stale)
    for out in lock["stages"][stage]["outs"]:
        (repo.path / out["path"]).unlink()
    workspace.forget(lock_path, [stage])
    assert stage not in yaml.safe_load(lock_path.read_text())["stages"]
    proc = repo.dvc("repro", stage)
    assert f"Stage '{stage}' is cached - skipping run" in proc.stdout and "Running stage" not in proc.stdout
    # the stage up to date, its entry written again (the report, which prints the control run's cost, may differ)
    assert stage not in repo.status() and stage in yaml.safe_load(lock_path.read_text())["stages"]
