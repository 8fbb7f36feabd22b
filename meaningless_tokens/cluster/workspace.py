"""Where a task runs: the workspace's files (tracked and untracked, not ignored: uncommitted params and code
included) as one snapshot; on each node, one git repository made of it; for each task, a worktree of that
repository whose DVC cache is the node's (the workspace's own cache on the driver's node)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

LOCAL_CONFIG = ".dvc/config.local"  # remotes' credentials and paths: ignored by git, carried beside the snapshot
GIT_ID = ("-c", "user.name=mless", "-c", "user.email=mless@localhost", "-c", "commit.gpgsign=false")


def snapshot(root: Path) -> bytes:
    """A tar of every file git tracks or would track in `root` (as the working tree holds it), with
    .dvc/config.local: what `dvc repro` here would read, without DVC's outputs and cache."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in sorted({p.decode() for p in listed if p} | ({LOCAL_CONFIG} if (root / LOCAL_CONFIG).is_file() else set())):
            path = root / rel
            if path.is_file() or path.is_symlink():  # a tracked file deleted in the working tree is left out
                tar.add(path, arcname=rel, recursive=False)
    return buf.getvalue()


def node_repository(home: Path, data: bytes) -> Path:
    """The snapshot as a git repository under `home` (once per node and run; a file lock for the tasks that
    start together)."""
    from filelock import FileLock

    src = home / "src"
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home / "src.lock")):
        if not (src / ".git").is_dir() or not (home / "src.done").exists():
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir()
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(src, filter="tar")
            git = ["git", *GIT_ID]
            subprocess.run([*git, "init", "-q"], cwd=src, check=True)
            subprocess.run([*git, "add", "-A"], cwd=src, check=True)
            subprocess.run([*git, "commit", "-q", "--no-verify", "-m", "the workspace, as the scheduled run read it"],
                           cwd=src, check=True)
            (home / "src.done").touch()
    return src


def worktree(src: Path, home: Path, step: str, cache: Path, data: bytes) -> Path:
    """A fresh worktree of `src` for one attempt of `step`, its DVC cache `cache` (the remotes of the workspace's
    .dvc/config.local kept)."""
    from filelock import FileLock

    path = home / "tasks" / f"{step.replace('@', '-')}-{uuid.uuid4().hex[:8]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home / "src.lock")):  # git's worktree bookkeeping, one task at a time
        subprocess.run(["git", *GIT_ID, "worktree", "add", "-q", "--detach", str(path)], cwd=src, check=True,
                       capture_output=True)
    local = ""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if LOCAL_CONFIG in tar.getnames():
            local = tar.extractfile(LOCAL_CONFIG).read().decode()
    write_cache_dir(path / LOCAL_CONFIG, local, cache)
    return path


def write_cache_dir(config: Path, text: str, cache: Path) -> None:
    """DVC's local config `text` with `[cache] dir = cache` (configobj, as DVC itself reads it)."""
    from configobj import ConfigObj

    conf = ConfigObj(text.splitlines())
    conf.setdefault("cache", {})["dir"] = str(cache)
    config.parent.mkdir(parents=True, exist_ok=True)
    with open(config, "wb") as f:
        conf.write(f)


def uncached_entry(repo, stage) -> bool:
    """Whether `stage`'s dvc.lock entry names outputs that the DVC cache of `repo` (dvc.repo.Repo) lacks (a fresh
    clone: its lock was written where those outputs were made; or after `dvc gc`). For a stage whose deps, params and
    command match its entry, DVC restores only the entry's outputs, and failing that runs the stage again without
    asking the run-cache (dvc/stage/cache.py `restore`); the same check, made here as DVC makes it."""
    from dvc.stage.serialize import to_single_stage_lockfile

    if not stage.outs or not all(out.hash_info for out in stage.outs):
        return False  # no entry: DVC asks the run-cache already
    try:
        return not repo.stage_cache._create_stage(to_single_stage_lockfile(stage), wdir=stage.wdir).outs_cached()
    except Exception:  # noqa: BLE001 - an entry DVC cannot read back is no use either
        return True


def forget(lock: Path, names: list[str]) -> None:
    """dvc.lock without the entries of `names` (DVC's own YAML round trip): DVC then takes those stages for changed
    and restores them from the run-cache, where a scheduled run's tasks put them."""
    from dvc.utils.serialize import modify_yaml

    if names and lock.is_file():
        with modify_yaml(str(lock)) as data:
            for name in names:
                (data.get("stages") or {}).pop(name, None)


def remove(src: Path, path: Path) -> None:
    """A task's worktree gone (its outputs are in the cache by then, or the task failed)."""
    from filelock import FileLock

    shutil.rmtree(path, ignore_errors=True)
    with FileLock(str(path.parent.parent / "src.lock")):
        subprocess.run(["git", "worktree", "prune"], cwd=src, capture_output=True)


def scratch_default() -> Path:
    return Path(os.environ.get("MLESS_CLUSTER_SCRATCH") or Path(os.environ.get("TMPDIR", "/tmp")) / "mless-cluster")


def clean(home: Path) -> None:
    """A node's folder of a finished run less what it no longer needs (the snapshot's repository, the worktrees and,
    on a node other than the driver's, its DVC cache, whose outputs are on the remote): the tasks' logs stay."""
    for name in ("src", "tasks", "cache", "src.done", "src.lock"):
        path = home / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
