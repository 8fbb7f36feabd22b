"""Warm start for the stages: `python -m stages.<name> ...` forked from a process that has imported torch and
transformers already, instead of paying those imports (about 4 s) in every model stage of a run.

`stages/__init__.py` calls `delegate()` before a stage module loads. It connects to this environment's server (a
Unix socket keyed by the interpreter, the installed packages, the environment variables and this file, so a server
never serves a process it would not be identical to), hands over its argv, working directory, environment and its
stdin/stdout/stderr, and waits for the exit status; the stage then runs in a fork of the server, with no module of
the project imported before the fork (the stage imports the workspace's code as a fresh interpreter would). The
client forwards SIGINT, SIGTERM and SIGHUP to the stage; if the client dies (SIGKILL), the stage kills itself.
No server yet: the client starts one in the background and runs this stage in-process, cold; the next finds it.
A server with no stage running exits after IDLE seconds. `MLESS_FORKSERVER=0` turns it off (every stage cold);
`MLESS_FORKSERVER_ANY_HOME=1`, with HF_HOME and MPLCONFIGDIR set, lets clients of different HOMEs share a server.
Linux only (fork after torch's import, before any of its thread pools start, as multiprocessing's forkserver).

Stdlib only: the server imports this module by path, and its forks must not hold a stale copy of the project.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback

IDLE = float(os.environ.get("MLESS_FORKSERVER_IDLE", 60))  # seconds with no stage running before the server exits
CONNECT_TIMEOUT = 30.0  # the server forks within milliseconds; past this the stage runs in-process, cold
PRELOAD = ("numpy", "h5py", "ruamel.yaml", "pydantic", "torch", "safetensors", "tokenizers", "transformers",
           "transformers.modeling_utils", "transformers.generation", "transformers.masking_utils",
           "transformers.activations", "transformers.tokenization_utils_tokenizers", "transformers.models.auto",
           "scipy.stats", "statsmodels.stats.meta_analysis", "statsmodels.stats.multitest", "matplotlib",
           "matplotlib.figure", "jinja2")
# variables that differ between stages of one run but change nothing a process imports
VOLATILE = ("_", "PWD", "OLDPWD", "SHLVL", "DVC_STAGE", "DVC_EXP_NAME", "DVC_EXP_BASELINE_REV", "DVC_CHECKPOINT",
            "DVC_ROOT", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "TERM", "COLUMNS", "LINES")
OURS = ("meaningless_tokens", "stages", "tests", "benchmarks")  # the project's packages: never kept across a fork
# a user's own folders: left out of the key with MLESS_FORKSERVER_ANY_HOME=1 where the caller has set the folders a
# preloaded module resolves from them at import (RESOLVED: HF_HOME for huggingface_hub and transformers, MPLCONFIGDIR
# for matplotlib), so that clients differing only in HOME (the tests' repositories, each with its own HOME for DVC's
# default remote under ~: tests/dvc_repo.py) share one server instead of each paying a preload and a cold stage
HOMES = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
RESOLVED = ("HF_HOME", "MPLCONFIGDIR")


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get("MLESS_FORKSERVER", "1") != "0"


def key() -> str:
    """What a server must share with a client to stand in for its start-up: the interpreter, its flags, the
    installed packages (site-packages' listing changes with every install), the environment and this file."""
    import sysconfig

    purelib = sysconfig.get_paths()["purelib"]
    try:
        site = sorted(os.listdir(purelib))
        site_mtime = os.stat(purelib).st_mtime_ns
    except OSError:
        site, site_mtime = [], 0
    # MLESS_* are read by the project's code only, which each fork imports afresh in the client's environment
    env = {k: v for k, v in os.environ.items() if k not in VOLATILE and not k.startswith("MLESS_")}
    if os.environ.get("MLESS_FORKSERVER_ANY_HOME") == "1" and all(os.environ.get(k) for k in RESOLVED):
        env = {k: v for k, v in env.items() if k not in HOMES}
    with open(__file__, "rb") as f:  # a server speaks its own version of the protocol
        own = hashlib.sha256(f.read()).hexdigest()
    parts = [os.path.realpath(sys.executable), sys.prefix, sys.version, repr(sys.flags), purelib, str(site_mtime),
             "\n".join(site), json.dumps(env, sort_keys=True), str(os.getuid()), own]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def socket_dir() -> str:
    """$MLESS_FORKSERVER_DIR, else a private folder in $XDG_RUNTIME_DIR or /tmp (a socket's path has at most 107
    bytes); the servers' sockets and their logs."""
    path = os.environ.get("MLESS_FORKSERVER_DIR") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"meaningless-tokens-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{path}: not a private folder of this user")
    return path


# ---- client -----------------------------------------------------------------------------------------------

def delegate(module: str) -> None:
    """Run `python -m <module>` (this process's command line) in a fork of the server and exit with its
    status; return (run it here) when there is no server to use, after starting one for the next stage."""
    if not enabled() or sys.orig_argv[1:3] != ["-m", module]:  # interpreter flags: run as asked, here
        return
    try:
        path = os.path.join(socket_dir(), key() + ".sock")
    except OSError:
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        _start_server(path)
        return
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        request = json.dumps({"module": module, "argv": sys.argv[:1] + sys.orig_argv[3:], "cwd": os.getcwd(),
                              "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [len(request).to_bytes(8, "big")], [0, 1, 2])
        conn.sendall(request)
        replies = conn.makefile("rb")  # buffered: a quick stage's status may come in the same read as its pid
        pid = int(replies.readline())
    except (OSError, ValueError):  # no stage started: run it here
        conn.close()
        return
    conn.settimeout(None)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: _forward(pid, s))
    try:
        status = replies.readline().strip()
    except OSError:
        status = b""
    if not status:  # the stage died without a status: killed
        print(f"error: the stage's process (pid {pid}, forked by the warm-start server) ended without an exit "
              f"status (killed?)", file=sys.stderr)
        os._exit(1)
    os._exit(int(status))


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _start_server(path: str) -> None:
    if len(os.fsencode(path)) > 100:  # bind() would refuse it (and the temporary name is longer)
        return
    try:
        with open(path.removesuffix(".sock") + ".log", "ab") as log:  # the server's own faults, if any
            subprocess.Popen([sys.executable, __file__, "serve", path], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=log, cwd="/", start_new_session=True, close_fds=True)
    except OSError:
        pass


# ---- server -----------------------------------------------------------------------------------------------

def serve(path: str) -> None:
    sys.path[:] = [p for p in sys.path if p not in ("", os.path.dirname(__file__))]
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a package this environment lacks: its stages import it cold
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(16)
    os.replace(tmp, path)  # atomic: a client finds a listening socket or none; an older server is left idle
    mine = os.stat(path)
    listener.settimeout(1.0)
    children: set[int] = set()
    last = time.monotonic()
    try:
        while True:
            for pid in list(children):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    children.discard(pid)
                    last = time.monotonic()
            if not children and time.monotonic() - last > IDLE:
                break
            if not children and not _still(path, mine):  # replaced or removed: a newer server serves this key
                break
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                _child(conn)  # never returns
            conn.close()
            children.add(pid)
            last = time.monotonic()
    finally:
        if _still(path, mine):
            try:
                os.unlink(path)
            except OSError:
                pass


def _still(path: str, mine: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(path), mine)
    except OSError:
        return False


def _child(conn: socket.socket) -> None:
    code = 1
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        head, fds, _, _ = socket.recv_fds(conn, 8, 3)
        size = int.from_bytes(head, "big")
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                os._exit(1)
            body += chunk
        request = json.loads(body)
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        conn.settimeout(None)
        conn.sendall(f"{os.getpid()}\n".encode())
        threading.Thread(target=_die_with_client, args=(conn,), daemon=True).start()
        code = _run(request)
    except BaseException:  # noqa: BLE001 - the protocol failed: the client reports it
        os._exit(1)
    try:
        conn.sendall(f"{code}\n".encode())
    finally:
        os._exit(code)


def _die_with_client(conn: socket.socket) -> None:
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _run(request: dict) -> int:
    """The stage as `python -m module` in the client's directory, environment and standard streams."""
    import io
    import runpy

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for name in [m for m in sys.modules if m.split(".")[0] in OURS]:
        del sys.modules[name]
    sys.path.insert(0, request["cwd"])
    sys.argv = list(request["argv"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=sys.stdout.encoding,
                                  errors=sys.stdout.errors, line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=sys.stderr.encoding,
                                  errors="backslashreplace", line_buffering=True, write_through=unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
