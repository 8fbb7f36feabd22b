"""The driver of a scheduled run: the plan from DVC, a Ray task for every stage whose upstream stages are done
(a stage that generates, with `shards`, as shard tasks and a merge), the first failure stops the run in one line, and the
workspace's own `dvc repro` brings every stage in from the run-cache at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens.cluster import graph, timeline, workspace
from meaningless_tokens.cluster.task import Job, StepFailed
from meaningless_tokens.errors import StageError


class ClusterError(StageError):
    """The run could not be scheduled or a stage failed: one line."""


@dataclass
class Options:
    address: str | None = None       # a running Ray cluster (`ray start --head` printed it); None: a local Ray
    targets: tuple[str, ...] = ()    # as `dvc repro [targets]`
    shards: int = 1                  # a stage that generates (evaluate, the sweep) as this many shards and a merge
    gpus: str = "auto"               # auto: model stages on GPUs when runtime.device asks for CUDA; all; none
    num_cpus: int | None = None      # the local Ray's (None: the machine's)
    num_gpus: int | None = None
    object_store_memory: int | None = None
    scratch: Path | None = None      # each node's folder of worktrees and caches (default $TMPDIR/mless-cluster)
    out: Path | None = None          # the timeline's folder (default reports/runs/<stamp>)


# a stage with a journal whose generation a params key can turn off (0: its shards would have nothing to do)
GENERATES = {"sweep": "sweep.accuracy_samples"}


@dataclass
class Asks:
    gpu: bool                        # the model stages ask Ray for a GPU
    vllm: bool                       # evaluate (and the sweep's generation) on vLLM, whose replicas ask for their own
    cpus: float                      # what a model stage on the CPU asks for
    generating: frozenset            # stages with a journal whose generation is on: split with --shards


def requests(root: Path, mode: str, cluster_gpus: float, node_cpus: float, steps) -> Asks:
    """What the tasks ask of Ray: a GPU for the model stages when runtime.device is cuda (auto: if the cluster has
    GPUs; `mode` all or none overrides); a vLLM stage's process holds none (its replicas ask for their own); on the CPU
    a model stage asks runtime.threads CPUs, or every CPU where torch picks (two stages of two threads on two cores
    thrash, 4x slower each: docs/benchmarks.md); which stages' generation is on (GENERATES), to be split."""
    from meaningless_tokens.config import load_params

    params = load_params(root / "params.yaml")
    cpus = min(float(params.runtime.threads or node_cpus), node_cpus) or 1.0
    device = params.runtime.device
    gpu = mode == "all" if mode in ("all", "none") else device == "cuda" or (device == "auto" and cluster_gpus > 0)

    def on(stage: str) -> bool:
        if stage not in GENERATES:
            return True
        section, key = GENERATES[stage].split(".")
        return bool(getattr(getattr(params, section), key))

    generating = frozenset(stage for stage in {s.name.partition("@")[0] for s in steps if s.journal} if on(stage))
    return Asks(gpu, params.evaluate.engine == "vllm", cpus, generating)


def run(root: Path, opts: Options) -> int:
    try:
        import ray
    except ImportError:
        raise ClusterError("mless repro --cluster needs Ray, which `make install-cluster` installs "
                           "(locks/<torch>-cluster.txt)") from None
    root = root.resolve()
    steps = graph.plan(root, list(opts.targets))
    todo, left = graph.to_run(steps)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = opts.out or root / "reports" / "runs" / stamp
    run_id = f"{stamp}-{uuid.uuid4().hex[:6]}"
    scratch = (opts.scratch or workspace.scratch_default()).resolve()
    ray.init(address=opts.address or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             **({} if opts.address else {k: v for k, v in (("num_cpus", opts.num_cpus), ("num_gpus", opts.num_gpus),
                                                            ("object_store_memory", opts.object_store_memory))
                                         if v is not None}))
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        remote = len(nodes) > 1
        # a task fits one node: at most the CPUs of the largest
        asks = requests(root, opts.gpus, ray.cluster_resources().get("GPU", 0),
                        max(n["Resources"].get("CPU", 0) for n in nodes), todo)
        print(f"mless repro --cluster: {len(todo)} of {len(steps)} stages as tasks on {len(nodes)} node(s), "
              f"{ray.cluster_resources().get('CPU', 0):g} CPUs, {ray.cluster_resources().get('GPU', 0):g} GPUs"
              f"{'; model stages on GPUs' if asks.gpu else ''}", flush=True)
        if left:
            print(f"  left to the workspace's dvc repro (an uncached output: DVC keeps no run-cache of it): "
                  f"{', '.join(s.name for s in left)}", flush=True)
        env = dict(os.environ)
        stale = [s.name for s in todo if s.stale]
        if stale:
            print(f"  {len(stale)} stage(s) with a dvc.lock entry whose outputs the DVC cache lacks (a fresh clone): "
                  f"their entries are left out, in the tasks and in the final dvc repro, so that DVC restores them "
                  f"from the run-cache instead of running them again", flush=True)
        if remote and todo:
            share(root, env)
        records, error = [], None
        if todo:
            records, error = _schedule(ray, root, todo, opts, asks, remote, env, run_id, scratch, stale)
        timeline.write(out, records, {"run": run_id, "nodes": len(nodes), "remote": remote, "failed": error})
        if error:
            raise ClusterError(error)
        _clean(ray, {r["node"] for r in records}, scratch / run_id)
    finally:
        ray.shutdown()
    print(f"timeline: {out / timeline.CHART}", flush=True)
    # the workspace's own run: every stage the tasks ran is restored from the run-cache, dvc.lock written here (the
    # stale entries, useless to DVC, are left out first: DVC would run those stages again)
    workspace.forget(root / "dvc.lock", stale)
    final = subprocess.run([sys.executable, "-m", "dvc", "repro", *(["--pull"] if remote else []), *opts.targets],
                           cwd=root, env=env)
    return final.returncode


def share(root: Path, env: dict) -> None:
    """What the other nodes need: the workspace's outputs and its run-cache, on the DVC remote."""
    for cmd in ([sys.executable, "-m", "dvc", "push", "--quiet"],
                [sys.executable, "-m", "meaningless_tokens.runcache", "push"]):
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode:
            last = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").splitlines()[-1]
            raise ClusterError(f"a run on several nodes exchanges outputs through the project's DVC remote "
                               f"(docs/sharing.md), and `{' '.join(cmd[1:])}` failed: {last}")


def _schedule(ray, root, todo, opts, asks, remote, env, run_id, scratch, stale):
    """Submit each step once its upstream steps are done; (the tasks' records, the first failure or None)."""
    from meaningless_tokens.cluster import task

    data = ray.put(workspace.snapshot(root))
    cache = _cache_dir(root, env)
    driver = ray.get_runtime_context().get_node_id()
    remote_run = ray.remote(task.run)
    names = {s.name for s in todo}
    waiting = {s.name: s for s in todo}
    done: set[str] = set()
    running: dict = {}   # object ref -> (step, kind)
    parts: dict = {}     # evaluate step -> {part name: bytes}
    shards_left: dict = {}
    records, error = [], None

    def submit(step, kind, shard=None, got=None):
        # a vLLM generation (evaluate, a shard) holds no GPU: its replicas are actors that ask for their own
        vllm = asks.vllm and (step.name.startswith("evaluate@") or kind == "shard")
        use_gpu = asks.gpu and step.loads_model and not vllm
        job = Job(run_id, step.name, kind, tuple(u for u in step.upstream if u in names) if kind == "shard"
                  else step.upstream, driver, str(cache), str(scratch), env, remote, use_gpu,
                  tuple(a for a in (*step.ancestors, *step.memos) if a not in names), shard, got or {},
                  step.journal, tuple(m for m in step.memos if m in names), tuple(stale))
        resources = {"num_gpus": 1, "num_cpus": 0} if use_gpu else {"num_cpus": asks.cpus if step.loads_model else 1}
        ref = remote_run.options(**resources, max_retries=2, retry_exceptions=False,
                                 scheduling_strategy="SPREAD").remote(job, data)
        running[ref] = (step, kind)

    def launch_ready():
        for name, step in list(waiting.items()):
            if all(u in done or u not in names for u in (*step.upstream, *step.memos)):
                del waiting[name]
                if opts.shards > 1 and name.partition("@")[0] in asks.generating:
                    shards_left[name] = opts.shards
                    parts[name] = {}
                    for i in range(opts.shards):
                        submit(step, "shard", (i, opts.shards))
                else:
                    submit(step, "stage")

    launch_ready()
    while running and error is None:
        ready, _ = ray.wait(list(running), num_returns=1)
        ref = ready[0]
        step, kind = running.pop(ref)
        try:
            record = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - StepFailed, or a node lost past the retries: one line either way
            cause = getattr(e, "cause", None) or e
            error = str(cause).strip().splitlines()[0] if isinstance(cause, StepFailed) else \
                f"{step.name}: {type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
            break
        part = record.pop("part", None)
        records.append(record)
        what = ("its part generated" if part else "nothing to generate: the run-cache holds the stage") \
            if kind == "shard" else _what(record)
        print(f"  {record['step']}{' shard ' + record['shard'] if record.get('shard') else ''} on "
              f"{record['ip']} ({record['node'][:8]}{', GPU ' + record['gpus'] if record['gpus'] else ''}): "
              f"{what} in {record['end'] - record['start']:.1f} s", flush=True)
        if kind == "shard":
            if part:
                parts[step.name][part[0]] = part[1]
            shards_left[step.name] -= 1
            if shards_left[step.name] == 0:
                submit(step, "merge", got=parts.pop(step.name))
            continue
        done.add(step.name)
        launch_ready()
    for ref in running:
        ray.cancel(ref, force=True)
    return records, error


def _clean(ray, nodes: set[str], run: Path) -> None:
    """Each node's worktrees, snapshot and (off the driver's node) DVC cache of this run removed, by a task pinned
    to that node; the logs stay."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    clean = ray.remote(workspace.clean)
    ray.get([clean.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
             .remote(run / node[:12]) for node in nodes])


def _what(record: dict) -> str:
    ran, restored, own = record["ran"], record["restored"], record["step"]
    return "ran" if own in ran else "restored from the run-cache" if own in restored else "up to date"


def _cache_dir(root: Path, env: dict) -> Path:
    """The workspace's DVC cache (cache.dir if set, else .dvc/cache): the driver's node's tasks share it."""
    proc = subprocess.run([sys.executable, "-m", "dvc", "cache", "dir"], cwd=root, env=env, capture_output=True,
                          text=True)
    path = proc.stdout.strip()
    return Path(path) if proc.returncode == 0 and path else root / ".dvc" / "cache"
