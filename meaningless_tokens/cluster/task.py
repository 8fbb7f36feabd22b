"""What one Ray task does: one stage through DVC in a worktree of its own (or one shard of a stage that generates,
evaluate or the sweep, or the merge of its shards), and the record of what it did for the timeline. Runs on whichever
node Ray chose; imports Ray only for where it is."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from meaningless_tokens.cluster import workspace

RAN = re.compile(r"^Running stage '([^']+)'", re.M)
RESTORED = re.compile(r"^Stage '([^']+)' is cached - skipping run", re.M)
# what names the failure: a stage's own `error: ...` line, else DVC's
STAGE_ERROR = re.compile(r"^error: (.*)$", re.M)
DVC_ERROR = re.compile(r"^ERROR: .*$", re.M)


@dataclass
class Job:
    """What the driver hands a task (plain data: it crosses the network)."""
    run: str                         # the run's id: its folder under the scratch folder of every node
    step: str                        # the DVC stage (`evaluate@tiny-a`)
    kind: str                        # "stage", "shard" (stages.<stage> --shard I/N: a part) or "merge" (the stage)
    upstream: tuple[str, ...]
    driver_node: str                 # Ray's node id of the driver: its tasks share the workspace's DVC cache
    workspace_cache: str
    scratch: str
    env: dict                        # the driver's environment (threads, HOME, the model cache, ...): a serial run's
    remote: bool                     # several nodes: pull what is missing from the DVC remote, push what was made
    gpu: bool
    present: tuple[str, ...] = ()    # stages upstream that are up to date in the workspace: checked out, not rerun
    shard: tuple[int, int] | None = None
    parts: dict = field(default_factory=dict)  # merge: part file name -> bytes
    journal: str | None = None       # the stage's journal (a store.PATHS kind): where the parts lie
    memos: tuple[str, ...] = ()      # stages this run ran whose outputs the stage reads where present: restored first
    forget: tuple[str, ...] = ()     # dvc.lock entries whose outputs no cache holds (graph.Step.stale)


@dataclass
class Record:
    """One task's row of the timeline."""
    step: str
    kind: str
    node: str
    ip: str
    gpus: str                        # CUDA_VISIBLE_DEVICES the stage saw ("" for a CPU task)
    start: float
    end: float
    ran: list
    restored: list
    pid: int
    shard: str | None = None
    log: str = ""


class StepFailed(RuntimeError):
    """A stage's own failure (not the node's): one line naming the stage and the node; not retried."""


def _pdeathsig():
    """The child dies with the task's worker (a SIGKILL of the worker runs no handler); prctl looked up here, in
    the parent. None without prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def child():
        os.setsid()
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    return child


def _reap(pids: Path, step: str) -> None:
    """Kill what an earlier attempt of `step` left running (its worker was killed: the stage in its session may
    outlive it)."""
    for f in pids.glob(f"{step.replace('@', '-')}.*.pgid"):
        try:
            os.killpg(int(f.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        f.unlink(missing_ok=True)


def run(job: Job, data: bytes) -> Record:
    import ray

    start = time.time()
    ctx = ray.get_runtime_context()
    node = ctx.get_node_id()
    gpus = ",".join(str(g) for g in ray.get_gpu_ids()) if job.gpu else ""
    home = Path(job.scratch) / job.run / node[:12]
    cache = Path(job.workspace_cache) if node == job.driver_node else home / "cache"
    src = workspace.node_repository(home, data)
    ws = workspace.worktree(src, home, job.step, cache, data)
    workspace.forget(ws / "dvc.lock", list(job.forget))
    env = {k: v for k, v in job.env.items() if not k.startswith("RAY_") and k != "CUDA_VISIBLE_DEVICES"}
    if job.gpu:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    elif "CUDA_VISIBLE_DEVICES" in job.env:
        env["CUDA_VISIBLE_DEVICES"] = job.env["CUDA_VISIBLE_DEVICES"]
    env.pop("DVC_STAGE", None)
    env["RAY_ADDRESS"] = ctx.gcs_address  # the vLLM engine's replicas join this cluster (engines/vllm.py)
    pids = home / "pgids"
    pids.mkdir(parents=True, exist_ok=True)
    tag = f"{job.step}.{job.shard[0]}" if job.kind == "shard" else job.step  # an attempt's processes, by step
    _reap(pids, tag)
    log = home / "logs" / f"{ws.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out: list[str] = []
    part = None

    def sh(*cmd: str, check: bool = True) -> None:
        proc = subprocess.Popen(cmd, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_pdeathsig())
        pgid = pids / f"{tag.replace('@', '-')}.{proc.pid}.pgid"
        pgid.write_text(str(proc.pid))
        text, _ = proc.communicate()
        pgid.unlink(missing_ok=True)
        out.append(f"$ {' '.join(cmd)}\n{text}")
        log.write_text("\n".join(out))
        if proc.returncode and check:
            line = (STAGE_ERROR.findall(text) or DVC_ERROR.findall(text) or [f"exit status {proc.returncode}"])[-1]
            raise StepFailed(f"{job.step}{f' shard {job.shard[0]}/{job.shard[1]}' if job.shard else ''} on node "
                             f"{ray.util.get_node_ip_address()} ({node[:8]}): {line.strip()} (log: {log})")

    dvc = [sys.executable, "-m", "dvc"]
    pull = ["--pull"] if job.remote else []
    try:
        if job.present:  # their outputs as the workspace has them (dvc.lock's), so that `dvc repro` does not rerun them
            # (a stage pulled, not run, has no run-cache record); one missing from the cache is DVC's to deal with
            sh(*dvc, "pull" if job.remote else "checkout", *job.present, check=False)
        stage, _, model = job.step.partition("@")
        if job.memos or (job.kind == "shard" and job.upstream):  # restored from the run-cache, as upstream stages are
            sh(*dvc, "repro", *pull, *job.memos, *(job.upstream if job.kind == "shard" else ()))
        if job.kind == "shard":
            if not _restorable(ws, job.step):
                sh(sys.executable, "-m", f"stages.{stage}", "--model", model,
                   "--shard", f"{job.shard[0]}/{job.shard[1]}")
                part = _part(_journal(ws, job.journal, model), *job.shard)
        else:
            if job.kind == "merge":
                folder = _journal(ws, job.journal, model).parent
                folder.mkdir(parents=True, exist_ok=True)
                for name, content in job.parts.items():
                    (folder / name).write_bytes(content)
            sh(*dvc, "repro", *pull, job.step)
            if job.remote:  # the outputs and run-cache record for the other nodes (and the workspace's final pull)
                sh(sys.executable, "-m", "meaningless_tokens.runcache", "push")
    finally:
        workspace.remove(src, ws)
    text = "\n".join(out)
    record = Record(job.step, job.kind, node, ray.util.get_node_ip_address(), gpus, start, time.time(),
                    RAN.findall(text), RESTORED.findall(text), os.getpid(),
                    f"{job.shard[0]}/{job.shard[1]}" if job.shard else None, str(log))
    return asdict(record) | ({"part": part} if job.kind == "shard" else {})


def _restorable(ws: Path, step: str) -> bool:
    """Whether the run-cache already holds `step` for these inputs (its upstream restored): its shards need not
    run, the merge restores it."""
    from dvc.repo import Repo

    try:
        with contextlib.chdir(ws), Repo(str(ws)) as repo:  # DVC reads a stage's name against the working folder
            stage = repo.stage.collect(step)[0]
            stage.save_deps()
            return repo.stage_cache._load(stage) is not None
    except Exception:  # noqa: BLE001 - an answer of "no" only costs the shards' run
        return False


def _part(journal: Path, index: int, count: int) -> tuple[str, bytes]:
    from meaningless_tokens.engines.journal import part_path

    path = part_path(journal, index, count)
    return path.name, path.read_bytes()


def _journal(ws: Path, kind: str, model: str) -> Path:
    """The stage's journal for `model` in the worktree (`kind`: its store.PATHS entry, the one table of paths)."""
    from meaningless_tokens.store import PATHS

    return ws / PATHS[kind].format(name=model)
