"""A throwaway copy of the project as a git + DVC repository, driven by the real `dvc` command.

Used by tests/test_dvc.py: the project's tracked files (and untracked ones under stages/ and meaningless_tokens/) are copied
into a new folder, without any outputs, with a tiny params.yaml whose models are tiny local models.
Every command runs with HOME pointing into the test's folder, so the default remote
(`~/.local/share/...` in .dvc/config) resolves there and nothing touches the user's own store.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests import params
from tests.params import PROFILE, ROOT

BIN = Path(sys.executable).parent
# outputs and files the pipeline does not need; the copy starts with no outputs at all
SKIP = ("artifacts/", "metrics/", "reports/", "reference/", "tests/", "benchmarks/", ".ci/", "dvc.lock")
# what records a run rather than a result, by path prefix: the timing sidecars, and the pages and verdict lines that
# print the run's cost (set aside where two runs are compared byte for byte: tests/test_cluster.py, test_sharing.py,
# benchmarks/bench_cluster.py)
RUN_RECORDS = ("metrics/timing", "reports/report.", "docs/results.md", "metrics/verdict.json")


def project_files() -> list[str]:
    """Tracked files, plus untracked (not ignored) files under stages/ and meaningless_tokens/ (modules not yet
    committed)."""
    def ls(*args: str) -> list[str]:
        return subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.split("\0")
    files = [f for f in ls() if f] + [f for f in ls("--others", "--exclude-standard", "--", "stages", "meaningless_tokens") if f]
    return sorted({f for f in files if not f.startswith(SKIP) and (ROOT / f).is_file()})


def output_folders() -> list[str]:
    """The artifact folders a fresh clone has (each holds a tracked .gitignore; plot tables aside): a stage may
    depend on one that no stage of the run writes (the report on artifacts/arm_tuning, empty by default)."""
    out = subprocess.run(["git", "ls-files", "-z", "artifacts"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\0")
    return sorted(str(Path(f).parent) for f in out if f.endswith("/.gitignore") and not f.startswith("artifacts/plots/"))


def tiny_params(models: dict[str, tuple[str, Path]]) -> dict:
    """The CPU profile with the tests' own profile (tests/profile.yaml) laid over it, and tiny local models (every
    key dvc.yaml lists spelled out: `dvc exp run -S` sets them), each evaluated and scored."""
    return params.build("profiles/cpu.yaml", params.read(PROFILE), models={
        name: params.spelled_out(params.tiny_model(family, path)) for name, (family, path) in models.items()})


class Repo:
    def __init__(self, path: Path, env: dict[str, str]):
        self.path, self.env = path, env

    @classmethod
    def create(cls, path: Path, home: Path, model_cache: Path, models: dict[str, tuple[str, Path]]) -> "Repo":
        path.mkdir(parents=True)
        for f in project_files():
            (path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, path / f)
        for folder in output_folders():  # as in a fresh clone, without the entries of the project's own models
            (path / folder).mkdir(parents=True, exist_ok=True)
            (path / folder / ".gitignore").touch()
        params.write(path / "params.yaml", tiny_params(models))
        home.mkdir(parents=True, exist_ok=True)
        repo = cls(path, make_env(home, model_cache))
        repo.git("init", "-q", "-b", "main")
        repo.git("config", "user.name", "Test")
        repo.git("config", "user.email", "test@example.com")
        repo.git("add", "-A")
        repo.git("commit", "-q", "-m", "baseline: tiny profile")
        return repo

    def run(self, *cmd: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), cwd=cwd or self.path, env=self.env, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def git(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run("git", *args, **kw)

    def dvc(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(str(BIN / "dvc"), *args, **kw)

    def repro(self, *args: str) -> set[str]:
        """`dvc repro`; the stages that ran (restored from the run cache counts as ran)."""
        return ran(self.dvc("repro", *args))

    def status(self) -> dict:
        return json.loads(self.dvc("status", "--json").stdout or "{}")

    def lock_hashes(self) -> dict[str, str]:
        """{out path: md5} of every output in dvc.lock."""
        lock = yaml.safe_load((self.path / "dvc.lock").read_text())
        return {o["path"]: o["md5"] for st in lock["stages"].values() for o in st.get("outs", [])}

    def stages(self) -> list[str]:
        """Every stage name dvc.yaml defines (foreach expanded), e.g. extract@tiny-a."""
        out = self.dvc("stage", "list", "--name-only").stdout
        return out.split()

    def set_params(self, **changes) -> None:
        """Change params.yaml: keys are dotted paths with '__' for '.', e.g. figures__dpi=50."""
        raw = yaml.safe_load((self.path / "params.yaml").read_text())
        for key, value in changes.items():
            *parents, last = key.split("__")
            node = raw
            for p in parents:
                node = node[p]
            node[last] = value
        (self.path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def files(self, *folders: str) -> dict[str, bytes]:
        """{relative path: bytes} of every file under the folders."""
        out = {}
        for folder in folders:
            for p in sorted((self.path / folder).rglob("*")):
                if p.is_file() and ".gitignore" != p.name:
                    out[str(p.relative_to(self.path))] = p.read_bytes()
        return out


def params_diff(repo: "Repo", *revs: str) -> dict[str, dict]:
    """{dotted key: {"old": ..., "new": ...}} of params.yaml from `dvc params diff` (lists as text)."""
    out = json.loads(repo.dvc("params", "diff", *revs, "--json").stdout)
    return {k: {"old": v["old"], "new": v["new"]} for k, v in out.get("params.yaml", {}).items()}


def plot_ids(*models: str) -> set[str]:
    """The `dvc plots` ids of a tiny project with `models`: each model's attention, sweep and likelihood tables, and
    the accuracy table."""
    return {f"artifacts/plots/{kind}/{m}.csv" for kind in ("original", "full", "sweep", "likelihood")
            for m in models} | {"reports/accuracy.csv"}


def exp_table(repo: "Repo") -> dict[str, dict]:
    """{experiment name: its data (params, metrics)} from `dvc exp show --json`."""
    rows = json.loads(repo.dvc("exp", "show", "--json").stdout)
    return {rev["name"]: rev["data"] for row in rows for exp in row.get("experiments") or [] for rev in exp["revs"]}


RAN = re.compile(r"^(?:Running stage '([^']+)'|Stage '([^']+)' is cached - skipping run)", re.M)


def ran(proc: subprocess.CompletedProcess) -> set[str]:
    return {a or b for a, b in RAN.findall(proc.stdout + proc.stderr)}


# huggingface_hub's folder, the same for every test repository (offline: nothing is downloaded into it)
HF_HOME = Path(tempfile.gettempdir()) / f"meaningless-tokens-tests-hf-{os.getuid()}"


def make_env(home: Path, model_cache: Path) -> dict[str, str]:
    import matplotlib

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "GIT_"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),                       # the default remote `~/...` resolves here
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        MPLCONFIGDIR=matplotlib.get_cachedir(),  # reuse the font cache instead of rebuilding it
        # one warm-start server for every repository of the run (meaningless_tokens/forkserver.py): the HOMEs differ,
        # the folders the preloaded modules read at import (HF_HOME, MPLCONFIGDIR) do not
        HF_HOME=str(HF_HOME),
        MLESS_FORKSERVER_ANY_HOME="1",
        MLESS_FORKSERVER_IDLE="300",  # a test between two stage runs can take more than the default minute
        MLESS_CACHE=str(model_cache),
        DVC_NO_ANALYTICS="1",
        HF_HUB_OFFLINE="1",
        GIT_AUTHOR_NAME="Test", GIT_AUTHOR_EMAIL="test@example.com",
        GIT_COMMITTER_NAME="Test", GIT_COMMITTER_EMAIL="test@example.com",
        GIT_CONFIG_NOSYSTEM="1",
    )
    return env
