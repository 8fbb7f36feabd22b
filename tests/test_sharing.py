"""Sharing results as DVC users do, with the real `dvc` and `git` in throwaway repositories.

A module-scoped project with one tiny model ("alice") runs the pipeline, changes only
`stages/evaluate.py` and reruns (so extraction keeps an older run than evaluation), commits, pushes to
a bare git remote and a DVC remote (a folder), runs an experiment, publishes it (`dvc exp push`) and
shares the run-cache (`python -m meaningless_tokens.runcache push`). Other clones, each with its own HOME and DVC
cache, then: pull and apply the experiment; restore a colleague's extraction and evaluation from the
run-cache with the model out of reach; rerun everything cold and get the committed dvc.lock. Real
network remotes: an SSH server (Debian's openssh-server, started here on 127.0.0.1 with throwaway
keys) and moto's standalone S3 server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import pytest
import yaml

from tests.dvc_repo import BIN, ROOT, RUN_RECORDS, Repo, exp_table, make_env, params_diff, plot_ids, ran

# runs the pipeline through dvc; one worker's (xdist group): the module's project is built once, for minutes
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sharing")]

M = "tiny-a"
FOLDERS = ("artifacts", "metrics", "reports")
GPU_STAGES = {f"extract@{M}", f"evaluate@{M}"}


def clone(origin: Path, path: Path, home: Path, store: str | Path | None = None) -> Repo:
    """A colleague's clone: own HOME (so its own default store) and own DVC cache."""
    repo = Repo(path, make_env(home, home / "model-cache"))
    home.mkdir(parents=True, exist_ok=True)
    repo.git("clone", "-q", str(origin), str(path), cwd=home)
    if store is not None:
        repo.dvc("remote", "modify", "--local", "localstore", "url", str(store))
    return repo


def lock(text: str) -> dict[str, str]:
    return {o["path"]: o["md5"] for st in yaml.safe_load(text)["stages"].values() for o in st.get("outs", [])}


@pytest.fixture(scope="module")
def alice(tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("sharing")
    models = base / "models"  # a copy the run-cache test can take away
    shutil.copytree(tiny_dirs["llama"], models / "llama")
    r = Repo.create(base / "alice", base / "home-alice", base / "model-cache", {M: ("llama", models / "llama")})
    r.base, r.models, r.store, r.origin = base, models, base / "store", base / "origin.git"
    r.dvc("remote", "modify", "--local", "localstore", "url", str(r.store))
    r.first = r.repro()
    r.git("add", "-A")
    r.git("commit", "-q", "-m", "results")
    # a code change to evaluation only: extraction does not rerun, so its committed artifact was made
    # at an older commit than a fresh clone's run (the case where a git commit inside artifacts broke
    # reproducibility)
    with open(r.path / "stages/evaluate.py", "a") as f:
        f.write("\n# a comment: evaluation's code changed, extraction's did not\n")
    r.git("commit", "-q", "-am", "evaluate.py: a comment")
    r.second = r.repro()
    r.git("add", "-A")
    r.git("commit", "-q", "-m", "results after the evaluate.py change")
    r.committed = {p: b for p, b in r.files(*FOLDERS).items()}
    r.run("git", "init", "-q", "--bare", "-b", "main", str(r.origin))
    r.git("remote", "add", "origin", str(r.origin))
    r.git("push", "-q", "origin", "main")
    r.dvc("push")
    # a colleague's cold rerun from a fresh clone, beside the experiment below (own copy of nothing
    # but git: no outputs, no cache; every stage in a fresh interpreter, without the warm-start server)
    cold = clone(r.origin, base / "cold", base / "home-cold", store=base / "cold-store")
    cold.env = {**cold.env, "MLESS_FORKSERVER": "0"}
    r.cold = cold
    pool = ThreadPoolExecutor(1)
    r.cold_run = pool.submit(lambda: (cold.repro(), (cold.path / "dvc.lock").read_text()))
    started = time.perf_counter()
    r.exp = ran(r.dvc("exp", "run", "-n", "span5", "-S", "prompt.mless.count=5"))
    r.exp_seconds = time.perf_counter() - started
    r.exp_files = r.files(*FOLDERS)
    r.exp_push = r.dvc("exp", "push", "origin", "span5")
    r.runcache_push = r.run(str(BIN / "python"), "-m", "meaningless_tokens.runcache", "push")
    yield r
    pool.shutdown(wait=True)


def test_code_change_reran_evaluation_only(alice):
    assert GPU_STAGES <= alice.first
    # the sweep shares the library's engines (meaningless_tokens/engines/), not the evaluate stage's module
    assert alice.second == {f"evaluate@{M}", "report"} | ({"figures", "reference"} & alice.second)
    assert f"extract@{M}" not in alice.second


# ---- 1. experiments --------------------------------------------------------------------------------

def test_published_experiment_is_pulled_listed_and_applied_with_nothing_rerun(alice, tmp_path):
    assert alice.exp >= GPU_STAGES and "Pushed experiment span5" in alice.exp_push.stdout
    bob = clone(alice.origin, tmp_path / "bob", tmp_path / "home-bob", store=alice.store)
    proc = bob.dvc("exp", "pull", "origin", "span5")
    assert "span5" in proc.stdout + proc.stderr
    exps = exp_table(bob)
    assert "span5" in exps
    assert exps["span5"]["params"]["params.yaml"]["data"]["prompt"]["mless"]["count"] == 5
    accuracy = exps["span5"]["metrics"][f"metrics/accuracy/{M}.json"]["data"]
    assert accuracy == json.loads(alice.exp_files[f"metrics/accuracy/{M}.json"])
    bob.dvc("exp", "apply", "span5")
    mine = bob.files(*FOLDERS)
    assert sorted(mine) == sorted(alice.exp_files)
    assert [p for p in mine if mine[p] != alice.exp_files[p]] == []  # metrics, plot tables, report: same bytes
    assert bob.status() == {}
    assert bob.repro() == set()
    plots = json.loads(bob.dvc("plots", "show", "--json").stdout)["data"]
    assert f"artifacts/plots/original/{M}.csv" in plots and "reports/accuracy.csv" in plots


def test_span_length_experiment(alice, tmp_path):
    """The experiment as its author compares it with the commit: exp show, params, metrics and plots diff."""
    # the model's branch; not prepare, nor the sweep, whose own grid replaces the span count
    assert alice.exp == set(alice.stages()) - {f"prepare@{M}", f"sweep@{M}"}
    assert alice.status() == {}
    span = exp_table(alice)["span5"]
    assert span["params"]["params.yaml"]["data"]["prompt"]["mless"]["count"] == 5
    assert span["metrics"][f"metrics/accuracy/{M}.json"]["data"]["n_problems"] == 3
    assert params_diff(alice, "HEAD", "span5") == {"prompt.mless.count": {"old": 55, "new": 5}}
    metrics = json.loads(alice.dvc("metrics", "diff", "HEAD", "span5", "--all", "--json").stdout)
    assert f"metrics/accuracy/{M}.json" in metrics
    plots = json.loads(alice.dvc("plots", "diff", "HEAD", "span5", "--json").stdout)["data"]
    assert set(plots) == plot_ids(M)
    values = plots[f"artifacts/plots/full/{M}.csv"][0]["content"]["data"]["values"]
    positions = {rev: {v["position"] for v in values if v["rev"] == rev} for rev in ("HEAD", "span5")}
    assert 0 < len(positions["span5"]) < len(positions["HEAD"])  # a shorter span: shorter prompts
    alice.dvc("plots", "diff", "HEAD", "span5", "-o", str(tmp_path / "diff"))
    html = (tmp_path / "diff" / "index.html").read_text()
    assert '"rev": "HEAD"' in html and '"rev": "span5"' in html and f"{M} / mless" in html


def test_runcache_push_to_a_missing_or_unreachable_remote_fails_with_dvcs_message(alice):
    python = str(BIN / "python")
    proc = alice.run(python, "-m", "meaningless_tokens.runcache", "push", "-r", "nosuch", check=False)
    assert proc.returncode == 1
    assert proc.stderr == "ERROR: failed to push the run-cache - config file error: remote 'nosuch' doesn't exist\n"
    alice.dvc("remote", "add", "--local", "-f", "nothing-there", f"ssh://root@127.0.0.1:{free_port()}/srv/store")
    proc = alice.run(python, "-m", "meaningless_tokens.runcache", "push", "-r", "nothing-there", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    # DVC's own line per record it could not send, then one line saying the push failed
    assert re.fullmatch(r"ERROR: failed to push the run-cache - .*Connect call failed.*",
                        proc.stderr.splitlines()[-1]), proc.stderr


def test_pulling_an_experiment_that_does_not_exist_fails_and_changes_nothing(alice, tmp_path):
    bob = clone(alice.origin, tmp_path / "bob", tmp_path / "home-bob", store=alice.store)
    def workspace():  # tracked changes, untracked files and every output (.dvc/tmp is DVC's own)
        return bob.git("status", "--porcelain", "-uall").stdout, sorted(bob.files(*FOLDERS))

    before = workspace()
    proc = bob.dvc("exp", "pull", "origin", "no-such-exp", check=False)
    assert proc.returncode != 0
    assert "no-such-exp" in proc.stderr and "ERROR" in proc.stderr, proc.stderr
    assert workspace() == before
    assert bob.git("for-each-ref", "refs/exps").stdout == ""
    proc = bob.dvc("exp", "apply", "no-such-exp", check=False)
    assert proc.returncode != 0 and "no-such-exp" in proc.stderr
    assert workspace() == before


# ---- 2. the run-cache: a colleague's GPU stages without a GPU -------------------------------------

def test_run_cache_restores_extraction_and_evaluation_without_loading_a_model(alice, tmp_path):
    assert re.search(r"\d+ run-cache records and \d+ files pushed", alice.runcache_push.stdout)
    alice.cold_run.result(timeout=900)  # the cold clone uses the model: take it away only after that run
    carol = clone(alice.origin, tmp_path / "carol", tmp_path / "home-carol", store=alice.store)
    carol.set_params(prompt__mless__count=5)  # alice's experiment: she already ran these stages
    hidden = alice.models.with_name("models-hidden")
    alice.models.rename(hidden)  # any model load would now fail
    try:
        started = time.perf_counter()
        # not --allow-missing: that skips a stage whose inputs did not change (the sweep: it does not read the
        # span count) without fetching its outputs, and the figures, which read them, would then fail
        proc = carol.dvc("repro", "--pull")
        seconds = time.perf_counter() - started
    finally:
        hidden.rename(alice.models)
    out = proc.stdout + proc.stderr
    for stage in GPU_STAGES:
        assert f"Stage '{stage}' is cached - skipping run, checking out outputs" in out, out
        assert f"Running stage '{stage}'" not in out
    assert "python -m stages.extract" not in out and "python -m stages.evaluate" not in out
    # not only the model stages: every stage but the report and the reference is restored. They write into git
    # (`cache: false`: docs/results.md and docs/results/, reference/), which keeps DVC from recording a run-cache
    # entry for them: they rerun, in seconds, from the restored artifacts and load no model (the models are hidden)
    restored = set(re.findall(r"Stage '([^']+)' is cached - skipping run", out))
    assert restored >= GPU_STAGES | {f"stats@{M}", f"activations@{M}", "figures", "explorer"}, out
    assert set(re.findall(r"Running stage '([^']+)'", out)) <= {"report", "reference"}, out
    assert (carol.path / f"artifacts/sweep/{M}.h5").read_bytes() == alice.exp_files[f"artifacts/sweep/{M}.h5"]
    # the restored timing sidecars are alice's, byte for byte: these stages did not run here
    for f in (f"metrics/timing/extract-{M}.json", f"metrics/timing/evaluate-{M}.json"):
        assert (carol.path / f).read_bytes() == alice.exp_files[f]
    for f in (f"artifacts/attention/{M}.h5", f"artifacts/eval/{M}.h5", f"metrics/accuracy/{M}.json"):
        assert (carol.path / f).read_bytes() == alice.exp_files[f], f
    assert (carol.path / "reports/report.html").is_file()
    assert carol.status() == {}
    # far less than alice's experiment took (it ran the two stages and loaded the model twice)
    print(f"repro --pull: {seconds:.1f} s; alice's experiment: {alice.exp_seconds:.1f} s")
    assert seconds < alice.exp_seconds


def test_repro_pull_from_a_store_without_the_run_cache_fails_and_records_nothing(alice, tmp_path):
    dave = clone(alice.origin, tmp_path / "dave", tmp_path / "home-dave", store=tmp_path / "empty-store")
    dave.set_params(prompt__mless__count=5)
    lock_before = (dave.path / "dvc.lock").read_bytes()
    proc = dave.dvc("pull", "--run-cache", check=False)  # nothing was ever pushed there
    assert proc.returncode != 0
    assert "failed to pull data from the cloud" in proc.stderr, proc.stderr
    hidden = alice.models.with_name("models-hidden")
    alice.cold_run.result(timeout=900)
    alice.models.rename(hidden)
    try:
        proc = dave.dvc("repro", "--pull", "--allow-missing", check=False)
    finally:
        hidden.rename(alice.models)
    assert proc.returncode != 0
    # no run-cache record: the stage must run, and DVC first needs its missing input (the manifest)
    assert "Some of the cache files do not exist neither locally nor on remote" in proc.stderr
    assert re.search(r"ERROR: failed to reproduce '(extract|evaluate)@tiny-a': Checkout failed for following "
                     r"targets:\nartifacts/models/tiny-a.json", proc.stderr), proc.stderr
    assert (dave.path / "dvc.lock").read_bytes() == lock_before
    assert not list(dave.path.rglob("*.partial"))
    assert not (dave.path / f"artifacts/attention/{M}.h5").exists()


# ---- 6. a fresh clone's cold repro reproduces the committed dvc.lock -------------------------------

def test_cold_repro_in_a_fresh_clone_reproduces_the_committed_lock(alice):
    ran_there, lock_text = alice.cold_run.result(timeout=900)
    assert ran_there == set(alice.stages())  # no outputs and no cache there: every stage ran, each cold
    committed = lock(alice.git("show", "main:dvc.lock").stdout)
    got = lock(lock_text)
    assert set(got) == set(committed)
    changed = sorted(p for p in committed if committed[p] != got[p])
    # only the run times differ, and what prints them: the report, and the verdict's power lines (their cost)
    assert all(p.startswith(RUN_RECORDS) for p in changed), changed
    # the attention file was made before the evaluate.py commit and again in the clone: same bytes
    assert (alice.cold.path / f"artifacts/attention/{M}.h5").read_bytes() == \
        alice.committed[f"artifacts/attention/{M}.h5"]
    with h5py.File(alice.cold.path / f"artifacts/attention/{M}.h5", "r") as f:
        prov = json.loads(f.attrs["provenance"])
    assert "git_commit" not in prov and prov["stage"] == "extract"
    packages = {f"meaningless_tokens/{pkg}/{p.name}" for pkg in ("models", "store")
                for p in (ROOT / "meaningless_tokens" / pkg).glob("*.py")}
    assert set(prov["code_sha256"]) == {"stages/extract.py", "meaningless_tokens/measures/extract.py", "meaningless_tokens/capture.py",
                                        "meaningless_tokens/dataset.py", "meaningless_tokens/prompts.py", "meaningless_tokens/stage.py"} | packages
    # the commit that ran is in the run's sidecar: alice's evaluation ran at the evaluate.py commit
    sidecar = json.loads(alice.committed[f"metrics/timing/evaluate-{M}.json"])
    head = alice.git("rev-parse", "HEAD~1").stdout.strip()
    assert sidecar["git_commit"] == head and sidecar["git_dirty"] is False
    extract_sidecar = json.loads(alice.committed[f"metrics/timing/extract-{M}.json"])
    assert extract_sidecar["git_commit"] == alice.git("rev-parse", "HEAD~3").stdout.strip()


# ---- 5. modes ----------------------------------------------------------------------------------------

def test_pipeline_outputs_are_readable_by_the_group(alice):
    modes = {str(p.relative_to(alice.path)): p.stat().st_mode & 0o777
             for folder in FOLDERS for p in (alice.path / folder).rglob("*") if p.is_file()}
    assert modes and {m for m in modes.values()} == {0o644}, {p: oct(m) for p, m in modes.items() if m != 0o644}


# ---- 4. dvc plots show, offline ----------------------------------------------------------------------

def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not chromium(), reason="Debian chromium not installed (apt-get install chromium)")
def test_plots_show_draws_offline_in_headless_chromium(alice, tmp_path):
    from playwright.sync_api import sync_playwright

    proc = alice.dvc("plots", "show", "-o", str(tmp_path / "plots"))
    page_path = tmp_path / "plots" / "index.html"
    html = page_path.read_text()
    assert "cdn.jsdelivr.net" not in html and 'data-package="vega-embed"' in html
    n_plots = html.count("vegaEmbed('#")
    assert n_plots == 5, proc.stdout  # attention (original, full), span sweep, likelihood, accuracy
    failed, requests, errors = [], [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(),
                                     args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("requestfailed", lambda r: failed.append((r.url, r.failure)))
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route(re.compile(r"^(https?|wss?|ftp):"), lambda route: route.abort())
        page.goto(page_path.as_uri(), wait_until="load")
        page.wait_for_function(f"document.querySelectorAll('.vega-embed svg.marks').length >= {n_plots}",
                               timeout=30_000)
        svgs = page.evaluate("Array.from(document.querySelectorAll('.vega-embed svg.marks'))"
                             ".map(s => [s.querySelectorAll('path, rect').length, s.getBoundingClientRect().width])")
        titles = page.evaluate("Array.from(document.querySelectorAll('.vega-embed svg.marks .role-title-text'))"
                               ".map(t => t.textContent)")
        browser.close()
    assert failed == [] and errors == [], (failed, errors)
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests
    assert len(svgs) == n_plots and all(marks > 0 and width > 100 for marks, width in svgs), svgs
    assert any("MATH-500 accuracy" in t for t in titles), titles


def test_the_plots_template_inlines_the_pinned_vendored_builds():
    import hashlib

    from tests.dvc_repo import ROOT

    vendor = ROOT / "vendor" / "vega"
    record = json.loads((vendor / "vendor.json").read_text())
    html = (vendor / "template.html").read_text()
    assert "{plot_divs}" in html and "{scripts}" not in html  # dvc-render's CDN scripts stay out
    assert "../vendor/vega/template.html" in (ROOT / ".dvc" / "config").read_text()
    for name, info in record.items():
        m = re.search(rf'<script data-package="{name}" data-version="{info["version"]}">\n(.*?)\n</script>', html, re.S)
        assert m, name
        assert hashlib.sha256((m.group(1) + "\n").encode()).hexdigest() == info["sha256"], name
        licence = (vendor / info["license"].split()[0]).read_text()
        assert "Redistribution and use in source and binary forms" in licence


# ---- 3. network remotes: SSH and S3 -----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """Debian's sshd on 127.0.0.1, a throwaway host key, user key and store folder; root only."""
    if os.geteuid() != 0:
        pytest.skip("the SSH remote test starts sshd on 127.0.0.1, which needs root (run make test as root)")
    exe = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.access(exe, os.X_OK):
        pytest.skip("openssh-server not installed (make test installs it with apt; or apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key", "wrong_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key, "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    log = d / "sshd.log"  # a file, not a pipe nobody reads (a full pipe would block sshd)
    with open(log, "w") as err:
        proc = subprocess.Popen([exe, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for_port(port, proc, "sshd", log)
        yield {"port": port, "dir": d, "url": f"ssh://root@127.0.0.1:{port}{d / 'store'}"}
    finally:
        proc.terminate()
        proc.wait(10)


def test_ssh_remote_push_and_pull_byte_identical(alice, sshd, tmp_path):
    alice.dvc("remote", "add", "--local", "-f", "ssh", sshd["url"])
    alice.dvc("remote", "modify", "--local", "ssh", "keyfile", str(sshd["dir"] / "user_key"))
    proc = alice.dvc("push", "-r", "ssh", "--all-branches")  # main's results and the workspace's experiment
    assert re.search(r"\d+ files? pushed", proc.stdout), proc.stdout
    assert any((sshd["dir"] / "store" / "files" / "md5").rglob("*"))
    erin = clone(alice.origin, tmp_path / "erin", tmp_path / "home-erin")
    erin.dvc("remote", "add", "--local", "-d", "ssh", sshd["url"])
    erin.dvc("remote", "modify", "--local", "ssh", "keyfile", str(sshd["dir"] / "user_key"))
    erin.dvc("pull")
    theirs = erin.files(*FOLDERS)
    # erin has main's results (alice's workspace holds her experiment's)
    main = alice.committed
    assert sorted(theirs) == sorted(main) and [p for p in main if main[p] != theirs[p]] == []
    assert erin.status() == {} and erin.repro() == set()
    # wrong credentials: a key the server does not accept; nothing is checked out
    frank = clone(alice.origin, tmp_path / "frank", tmp_path / "home-frank")
    frank.dvc("remote", "add", "--local", "-d", "ssh", sshd["url"])
    frank.dvc("remote", "modify", "--local", "ssh", "keyfile", str(sshd["dir"] / "wrong_key"))
    proc = frank.dvc("pull", check=False)
    assert proc.returncode != 0
    assert "failed to pull data from the cloud" in proc.stderr and "Permission denied" in proc.stderr, proc.stderr
    assert not (frank.path / f"artifacts/attention/{M}.h5").exists() and not list(frank.path.rglob("*.partial"))
    assert not (frank.path / ".dvc" / "cache" / "files").exists() or not any((frank.path / ".dvc/cache/files").rglob("*"))


def test_push_to_an_unreachable_ssh_host_fails_with_dvcs_message(alice, sshd):
    port = free_port()  # nothing listens there
    alice.dvc("remote", "add", "--local", "-f", "ssh-down", f"ssh://root@127.0.0.1:{port}/srv/store")
    alice.dvc("remote", "modify", "--local", "ssh-down", "keyfile", str(sshd["dir"] / "user_key"))
    before = alice.git("status", "--porcelain").stdout
    proc = alice.dvc("push", "-r", "ssh-down", check=False)
    assert proc.returncode != 0
    assert "ERROR" in proc.stderr and re.search(r"Connect(ion)? (call failed|refused)|connection refused", proc.stderr, re.I), proc.stderr
    assert alice.git("status", "--porcelain").stdout == before
    assert alice.status() == {}


@pytest.fixture(scope="module")
def s3_server():
    """moto's standalone S3 server on 127.0.0.1 (what DVC's own S3 tests use) with one bucket."""
    pytest.importorskip("moto.server", reason="moto[server] not installed (the test layer: make install-test)")
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="team-bucket")
    yield url
    server.stop()


def test_s3_remote_push_and_pull_byte_identical(alice, s3_server, tmp_path):
    def configure(repo: Repo, default: bool) -> None:
        repo.dvc("remote", "add", "--local", *(["-d"] if default else []), "-f", "s3", "s3://team-bucket/meaningless-tokens")
        repo.dvc("remote", "modify", "--local", "s3", "endpointurl", s3_server)
        repo.dvc("remote", "modify", "--local", "s3", "access_key_id", "testing")
        repo.dvc("remote", "modify", "--local", "s3", "secret_access_key", "testing")
        repo.dvc("remote", "modify", "--local", "s3", "region", "us-east-1")

    configure(alice, default=False)
    proc = alice.dvc("push", "-r", "s3", "--all-branches")  # main's results and the workspace's experiment
    assert re.search(r"\d+ files? pushed", proc.stdout), proc.stdout
    gina = clone(alice.origin, tmp_path / "gina", tmp_path / "home-gina")
    configure(gina, default=True)
    gina.dvc("pull")
    theirs = gina.files(*FOLDERS)
    assert sorted(theirs) == sorted(alice.committed)
    assert [p for p in theirs if theirs[p] != alice.committed[p]] == []
    assert gina.status() == {} and gina.repro() == set()
