"""The warm-start server (meaningless_tokens/forkserver.py): a stage forked from it writes what a cold process
writes, exits with its status, prints its lines, dies with its client, and the server leaves when idle."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from meaningless_tokens.config import load_params
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the warm start forks: Linux only")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A socket folder of the test's own (short: a socket's path has at most 107 bytes), so its server is the
    test's; a short idle time."""
    run = Path(tempfile.mkdtemp(prefix="mfs-", dir="/tmp"))
    yield {**os.environ, "MLESS_FORKSERVER_DIR": str(run), "MLESS_FORKSERVER": "1", "MLESS_FORKSERVER_IDLE": "5",
           "PYTHONPATH": str(ROOT)}
    shutil.rmtree(run, ignore_errors=True)


def servers(env: dict) -> list[Path]:
    return sorted(Path(env["MLESS_FORKSERVER_DIR"]).glob("*.sock"))


def starting(env: dict) -> bool:
    """Whether a server process of this test's socket folder is alive (still importing torch and transformers)."""
    folder = env["MLESS_FORKSERVER_DIR"].encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and folder in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def wait_for_server(env: dict, timeout: float = 60, loaded: float = 600) -> None:
    """Until a server listens: `timeout` seconds for one to start, longer (up to `loaded`) while a started one is
    alive and still importing (minutes on two cores that other tests load); a server that died names its log."""
    start = time.monotonic()
    while not servers(env):
        waited = time.monotonic() - start
        if waited > timeout and not (waited < loaded and starting(env)):
            logs = "".join(p.read_text(errors="replace") for p in Path(env["MLESS_FORKSERVER_DIR"]).glob("*.log"))
            raise AssertionError(f"no server listening after {waited:.0f} s; its log: {logs or '(empty)'}")
        time.sleep(0.2)


def stage(module: str, *args: str, env: dict, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"stages.{module}", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, **kw)


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_a_forked_stage_writes_the_cold_bytes_and_passes_on_status_and_lines(tiny_dirs, write_params, cache_dir,
                                                                              tmp_path, env):
    raw = load_params(write_params()).model_dump()
    raw["extract"].update(n_samples=2, showcase=1)
    raw["models"] = {"tiny": {"display_name": "Tiny llama", "family": "llama", "trust_remote_code": False,
                              "template": None, "layers": [0, 1], "heads": "all", "arm": {},
                              "source": {"kind": "local_dir", "path": str(tiny_dirs["llama"])}}}
    params = load_params(write_params(raw))
    root = params.file.parent
    # idle long enough to outlive the first stage's own cold run: on two loaded cores the server is ready and
    # idle before that run ends (the folder's removal at teardown ends it)
    env = {**env, "MLESS_CACHE": str(cache_dir), "MLESS_FORKSERVER_IDLE": "600"}
    out = root / "artifacts/attention/tiny.h5"
    cold = stage("extract", "--model", "tiny", "--params", str(params.file), env={**env, "MLESS_FORKSERVER": "0"},
                 cwd=root)
    assert cold.returncode == 0, cold.stderr
    reference = out.read_bytes()
    assert not servers(env)  # turned off: none started
    first = stage("extract", "--model", "tiny", "--params", str(params.file), env=env, cwd=root)
    assert first.returncode == 0, first.stderr  # no server yet: this one ran here and started one
    wait_for_server(env)
    out.unlink()
    warm = stage("extract", "--model", "tiny", "--params", str(params.file), env=env, cwd=root)
    assert warm.returncode == 0, warm.stderr
    assert out.read_bytes() == reference
    assert "tiny: 2 problems x 3 conditions" in warm.stdout
    # a refusal: its one line on the client's stderr and status 2
    bad = stage("extract", "--model", "nope", "--params", str(params.file), env=env, cwd=root)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "nope" in bad.stderr
    assert len(servers(env)) == 1  # one server served them all


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_a_killed_client_takes_its_stage_with_it_and_the_server_leaves_when_idle(tmp_path, env):
    pkg = tmp_path / "stages"
    pkg.mkdir()
    (pkg / "__init__.py").write_text((ROOT / "stages/__init__.py").read_text())
    (pkg / "sleeper.py").write_text("import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    (pkg / "status.py").write_text("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(7)\n")
    first = stage("status", env=env, cwd=tmp_path)
    assert (first.returncode, first.stdout, first.stderr) == (7, "to stdout\n", "to stderr\n")
    wait_for_server(env)
    warm = stage("status", env=env, cwd=tmp_path)
    assert (warm.returncode, warm.stdout, warm.stderr) == (7, "to stdout\n", "to stderr\n")
    client = subprocess.Popen([sys.executable, "-m", "stages.sleeper"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, text=True)
    pid = int(client.stdout.readline())
    assert pid != client.pid  # the stage runs in the server's fork, not in the client
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the stage outlived its killed client"
        time.sleep(0.05)
    deadline = time.monotonic() + 60
    while servers(env):  # MLESS_FORKSERVER_IDLE=5 s with no stage running
        assert time.monotonic() < deadline, "the idle server did not leave"
        time.sleep(0.5)


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_sigint_reaches_the_forked_stage(tmp_path, env):
    pkg = tmp_path / "stages"
    pkg.mkdir()
    (pkg / "__init__.py").write_text((ROOT / "stages/__init__.py").read_text())
    (pkg / "sleeper.py").write_text(
        "import os, sys, time\n"
        "try:\n    print(os.getpid(), flush=True)\n    time.sleep(600)\nexcept KeyboardInterrupt:\n    print('interrupted', file=sys.stderr)\n    sys.exit(130)\n")
    starter = subprocess.Popen([sys.executable, "-m", "stages.sleeper"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, text=True)
    starter.stdout.readline()  # the first ran here (and started the server): stop it
    starter.kill()
    starter.wait()
    wait_for_server(env)
    client = subprocess.Popen([sys.executable, "-m", "stages.sleeper"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = int(client.stdout.readline())
    assert pid != client.pid
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=30)
    assert client.returncode == 130 and "interrupted" in err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by the server) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_homes_share_a_server_only_where_the_caller_set_the_folders_imports_read(monkeypatch, tmp_path):
    """The tests' throwaway repositories differ in HOME (DVC's default remote under ~): with
    MLESS_FORKSERVER_ANY_HOME=1 and the folders a preloaded module resolves at import set (HF_HOME, MPLCONFIGDIR)
    they share one server's key; without the opt-in, or with one of those folders left to follow HOME, each HOME has
    its own."""
    from meaningless_tokens import forkserver

    def key(home: str, **env) -> str:
        for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME", "MPLCONFIGDIR",
                    "MLESS_FORKSERVER_ANY_HOME"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HOME", home)
        monkeypatch.setenv("XDG_CACHE_HOME", f"{home}/.cache")
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        return forkserver.key()

    shared = {"MLESS_FORKSERVER_ANY_HOME": "1", "HF_HOME": str(tmp_path / "hf"), "MPLCONFIGDIR": str(tmp_path / "mpl")}
    assert key("/a", **shared) == key("/b", **shared)
    assert key("/a", **shared) != key("/a", **{**shared, "HF_HOME": str(tmp_path / "other")})
    assert key("/a", **{**shared, "MLESS_FORKSERVER_ANY_HOME": "0"}) != key("/b", **{**shared, "MLESS_FORKSERVER_ANY_HOME": "0"})
    no_hf = {k: v for k, v in shared.items() if k != "HF_HOME"}
    assert key("/a", **no_hf) != key("/b", **no_hf)
    no_mpl = {k: v for k, v in shared.items() if k != "MPLCONFIGDIR"}
    assert key("/a", **no_mpl) != key("/b", **no_mpl)
