"""The fault model (docs/faults.md), case by case: each fault gives the correct result or one `error:` line with
exit status 2, never exit 0 with a wrong number, never a traceback or a crash, and leaves no output that a later
stage or DVC would trust."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from meaningless_tokens import engines
from meaningless_tokens.config import load_params
from stages import evaluate
from tests.conftest import ROOT, spelled_out
from tests.test_evaluate import tiny_eval_params


def stage(module, params, *args, model="tiny", **kw):
    """`python -m stages.<module>` as DVC runs it: (exit status, stdout, stderr)."""
    cmd = [sys.executable, "-m", f"stages.{module}", *(["--model", model] if model else []), "--params",
           str(params.file), *args]
    p = subprocess.run(cmd, cwd=params.file.parent, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, **kw)
    return p.returncode, p.stdout, p.stderr


def one_error_line(err: str) -> str:
    """The stage's stderr holds exactly one `error:` line and no traceback; returns that line."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


# ---- a journal survives any kill ---------------------------------------------------------------------

def test_journal_cuts_a_torn_last_line_and_keeps_appending(tmp_path, capsys):
    path = tmp_path / "j.jsonl"
    rec = [engines.Record(i, "none", f"out {i}", 1, "eos", "", False, None, False, 0.1) for i in range(3)]
    engines.Journal(path, "k").append(rec[:2])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"index": 2, "condition": "no')  # a kill in the middle of writing a line
    j = engines.Journal(path, "k")
    assert "cut a torn last line" in capsys.readouterr().err
    assert path.read_bytes() == whole and list(j.records) == [(0, "none"), (1, "none")]
    j.append(rec[2:])
    assert list(engines.Journal(path, "k").records) == [(0, "none"), (1, "none"), (2, "none")]
    # a whole record without its newline is cut too: the next one would be glued onto it
    path.write_bytes(whole + json.dumps(dataclasses.asdict(rec[2])).encode())
    assert list(engines.Journal(path, "k").records) == [(0, "none"), (1, "none")] and path.read_bytes() == whole
    path.write_bytes(b'{"version": 1, "ke')  # killed while writing the header: nothing was saved
    assert engines.Journal(path, "k").records == {} and not path.exists()


def _evaluate(params_file, root, err_file, env):
    """A forkserver child: `python -m stages.evaluate` on the tiny model, stderr to `err_file` (the server is a
    fresh interpreter: nothing of the test process's torch state comes along)."""
    os.environ.update(env)
    os.chdir(root)
    fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    sys.stderr = open(2, "w", closefd=False)
    sys.exit(evaluate.main(["--model", "tiny", "--params", str(params_file)]))


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_evaluate_killed_at_random_moments_ends_with_the_uninterrupted_result(tiny_dirs, write_params, cache_dir,
                                                                             tmp_path):
    """SIGKILL at random moments of a running evaluate, again and again, each run resuming the last one's
    journal; the run that finally completes writes the uninterrupted run's bytes. The runs are processes forked
    from a server that has imported torch and transformers once (a fresh interpreter spends seconds on that)."""
    import multiprocessing

    params = tiny_eval_params(write_params, tiny_dirs, n_samples=6, max_new_tokens=16, batch_size=1)
    root = params.file.parent
    journal, out = root / "artifacts/eval/.journal/tiny.jsonl", root / "artifacts/eval/tiny.h5"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["stages.evaluate", "transformers", "transformers.models.llama.modeling_llama"])
    env = {"MLESS_CACHE": str(cache_dir)}

    def start(where, err):
        p = ctx.Process(target=_evaluate, args=(params.file, where, err, env))
        p.start()
        return p

    reference = evaluate.run(params, "tiny", root=tmp_path / "ref").read_bytes()
    seed = int(os.environ.get("FAULT_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    kills, sizes = 0, []
    for k in range(int(os.environ.get("FAULT_KILLS", 10))):
        err = tmp_path / f"run{k}.err"
        proc = start(root, err)
        while proc.exitcode is None and not journal.is_file():  # model loading is not the interesting part
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.25))
        if proc.exitcode is not None:
            break
        proc.kill()
        proc.join(60)
        text = err.read_text() if err.exists() else ""
        assert "Traceback" not in text and "damaged journal" not in text, (seed, text)
        kills += 1
        sizes.append(journal.stat().st_size if journal.is_file() else 0)
        assert not out.exists(), seed
    proc.join(300)
    if proc.exitcode is None or not out.exists():
        proc = start(root, tmp_path / "last.err")
        proc.join(300)
    assert proc.exitcode == 0, (seed, (tmp_path / "last.err").read_text())
    assert out.read_bytes() == reference, f"FAULT_SEED={seed}: {kills} kills, journal sizes {sizes}"
    assert not journal.exists()
    assert kills >= 3, f"FAULT_SEED={seed}: the run finished before it was killed often enough ({kills})"


# ---- nothing wrong passes as right ---------------------------------------------------------------------

def test_non_finite_values_are_refused_with_file_dataset_and_index(tmp_path):
    import numpy as np

    from meaningless_tokens.store import put, write_h5
    from meaningless_tokens.errors import NonFiniteError

    out = tmp_path / "artifacts/stats/tiny.h5"
    data = np.zeros((3, 4))
    data[1, 2] = np.nan
    with pytest.raises(NonFiniteError, match=r"artifacts/stats/tiny.h5: /none/drop: non-finite value nan at index "
                                             r"\[1, 2\] \(1 of 12 values\)"):
        with write_h5(out) as f:
            put(f.create_group("none"), "drop", data)
    assert not out.exists() and list(out.parent.iterdir()) == []  # no output, no temporary file


def _write_artifact(path, model="tiny", stage="stats", kind="stats", values=None, params=None):
    import numpy as np

    from meaningless_tokens.store import put, put_json_attr, write_h5

    with write_h5(path) as f:
        f.attrs["kind"], f.attrs["model"] = kind, model
        put_json_attr(f, "provenance", {"stage": stage, **({"params": params} if params is not None else {})})
        put(f, "values", np.arange(64, dtype=np.float64) if values is None else values)
    return path


def test_fletcher32_makes_a_flipped_byte_a_read_error_and_keeps_values(tmp_path):
    import numpy as np

    from meaningless_tokens.store import read_h5
    from meaningless_tokens.errors import ArtifactError

    values = np.linspace(0, 1, 64)
    path = _write_artifact(tmp_path / "artifacts/stats/tiny.h5", values=values)
    with read_h5(path, "stats") as f:
        assert f["values"].fletcher32 and np.array_equal(f["values"][()], values)  # the same values, bit for bit
        offset = f["values"].id.get_chunk_info(0).byte_offset
    raw = bytearray(path.read_bytes())
    raw[offset + 100] ^= 0x01  # one bit of one float
    path.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=r"tiny.h5: cannot read .*filter returned failure during read.*corrupt or truncated"):
        with read_h5(path, "stats") as f:
            f["values"][()]


def test_another_models_or_stages_artifact_is_refused(tmp_path, write_params, capsys):
    from meaningless_tokens.store import read_h5
    from meaningless_tokens.errors import ArtifactError

    wrong_model = _write_artifact(tmp_path / "artifacts/stats/tiny.h5", model="other")
    with pytest.raises(ArtifactError, match=r"tiny.h5: written for model 'other', read as model 'tiny'"):
        with read_h5(wrong_model, "stats"):
            pass
    wrong_stage = _write_artifact(tmp_path / "artifacts/attention/tiny.h5", kind="attention", stage="sweep")
    with pytest.raises(ArtifactError, match=r"tiny.h5: written by stage 'sweep', expected 'extract'"):
        with read_h5(wrong_stage, "attention"):
            pass


def test_an_artifact_made_with_other_params_is_refused_naming_the_key(tiny_dirs, write_params, tmp_path):
    """An attention file whose recorded params (extract's dvc.yaml keys) differ from today's: a stale file, or one
    another experiment made, copied in place. stats refuses it in one line naming the first differing key."""
    from meaningless_tokens.store import read_h5, stage_params
    from meaningless_tokens.errors import ArtifactError

    params = tiny_eval_params(write_params, tiny_dirs)
    made = stage_params(params, "extract", "tiny")
    assert made["extract"]["seed"] == 0
    made["extract"]["seed"] = 7
    path = _write_artifact(params.file.parent / "artifacts/attention/tiny.h5", kind="attention", stage="extract",
                           params=made)
    code, out, err = stage("stats", params)
    assert code == 2 and one_error_line(err) == f"error: {path}: made with other params (extract.seed: 7 vs 0)"
    assert not (params.file.parent / "artifacts/stats/tiny.h5").exists()
    made["extract"]["seed"], made["models"]["tiny"]["source"]["path"] = 0, "/elsewhere"
    _write_artifact(path, kind="attention", stage="extract", params=made)
    with pytest.raises(ArtifactError, match=r'made with other params \(models.tiny.source.path: "/elsewhere" vs '):
        with read_h5(path, "attention", params=params):
            pass
    made["models"]["tiny"]["source"]["path"] = params.models["tiny"].source.path
    _write_artifact(path, kind="attention", stage="extract", params=made)
    with read_h5(path, "attention", params=params) as f:  # today's params: accepted
        assert f.attrs["model"] == "tiny"


# ---- filesystem faults are one line ----------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root and mount(8) needed; skipped where they are not)."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                                           capture_output=True).returncode:
        pytest.skip("no tmpfs mount here (needs root and mount): the full-disk cases are untested")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


FULL_DISK_SCRIPT = """
import sys
import numpy as np
from meaningless_tokens import cli
from meaningless_tokens.store import put, put_json_attr, write_h5

def run(params):
    with write_h5(sys.argv[1]) as f:
        f.attrs["kind"] = "stats"
        put(f, "big", np.random.default_rng(0).random((1024, 1024)))  # 8 MiB, gzip cannot squeeze random floats
sys.exit(cli.main("faults", None, run, sys.argv[2:], per_model=False))
"""


def test_full_disk_is_one_error_line_not_a_crash(small_disk, tmp_path):
    out = small_disk / "artifacts/stats/tiny.h5"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"previous output")
    (out.parent / ".tiny.h5.killed.partial").write_bytes(b"x" * 4096)  # a killed run's temporary file
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, str(out), "--params", str(ROOT / "params.yaml")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
        assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
        assert one_error_line(p.stderr) == f"error: {out}: No space left on device"
        assert out.read_bytes() == b"previous output"
        assert sorted(x.name for x in out.parent.iterdir()) == ["tiny.h5"]  # the stale and the new partial gone


def test_read_only_model_cache_and_output_folder_are_one_error_line(small_disk, tiny_dirs, write_params, monkeypatch,
                                                                   capsys):
    from meaningless_tokens.errors import OutputError
    from stages import prepare

    params = tiny_eval_params(write_params, tiny_dirs)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    monkeypatch.setenv("MLESS_CACHE", str(small_disk / "cache"))
    assert prepare.main(["--model", "tiny", "--params", str(params.file)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {small_disk / 'cache'}") and line.endswith(": Read-only file system"), line
    monkeypatch.setenv("MLESS_CACHE", str(params.file.parent / "cache"))
    assert prepare.main(["--model", "tiny", "--params", str(params.file)]) == 0
    capsys.readouterr()
    with pytest.raises(OutputError) as e:
        prepare.run(params, "tiny", root=small_disk)
    assert str(e.value) == f"{small_disk / 'artifacts'}: Read-only file system"  # the folder it could not make


# ---- config check catches what a stage would -------------------------------------------------------------

def test_config_check_catches_duplicate_keys_empty_model_lists_and_missing_files(write_params, capsys):
    import yaml

    from meaningless_tokens import config

    path = write_params()

    def check(text):
        path.write_text(text)
        assert config.main(["check", str(path)]) == 2
        return one_error_line(capsys.readouterr().err)

    good = path.read_text()
    twice = good.replace("\nevaluate:\n", "\nevaluate:\n  seed: 1\n", 1)  # evaluate.seed follows further down
    lines = twice.splitlines()
    start = lines.index("evaluate:")
    first, second = [k + 1 for k, ln in enumerate(lines) if k > start and ln.startswith("  seed:")][:2]
    assert check(twice) == f"error: {path}: evaluate.seed: given twice (lines {first} and {second}); YAML keys are " \
        "unique: keep one"
    raw = yaml.safe_load(good)
    for key in ("evaluate", "likelihood"):
        bad = {**raw, key: {**raw[key], "models": []}}
        assert check(yaml.safe_dump(bad, sort_keys=False)) == f"error: {path}: {key}.models: empty; the stages that " \
            f"read it need at least one model (e.g. {list(raw['models'])[:1]})"
    bad = {**raw, "prompt": {**raw["prompt"], "mful": {**raw["prompt"]["mful"], "text_file": "no/such.txt"}}}
    assert check(yaml.safe_dump(bad, sort_keys=False)) == \
        f"error: {path}: prompt.mful.text_file: {path.parent / 'no/such.txt'} does not exist"


def test_weights_overwritten_in_place_are_rehashed_and_their_nan_refused(tiny_dirs, write_params, cache_dir,
                                                                        tmp_path, capsys):
    """The issue's case: bytes of model.safetensors overwritten, size and mtime kept. The digest is recomputed (its
    memo is keyed on inode and ctime too) and the probe, comparing NaN-aware, refuses the model in one line."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from meaningless_tokens import models
    from stages import extract, prepare

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dirs["llama"], model_dir)
    raw = load_params(write_params()).model_dump()
    raw["models"] = {"tiny": spelled_out({"display_name": "Tiny llama", "family": "llama", "layers": [0, 1],
                                          "heads": "all", "source": {"kind": "local_dir", "path": str(model_dir)}})}
    params = load_params(write_params(raw))
    before = models.prepare(params, "tiny").weights_sha256
    weights = model_dir / "model.safetensors"
    st = weights.stat()
    tensors = load_file(weights)
    name = next(k for k in tensors if "layers.0.self_attn.q_proj" in k)
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size and weights.stat().st_mtime_ns == st.st_mtime_ns
    assert extract.main(["--model", "tiny", "--params", str(params.file)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "non-finite values" in line and "layer 0" in line, line
    assert not (params.file.parent / "artifacts/attention/tiny.h5").exists()
    assert prepare.main(["--model", "tiny", "--params", str(params.file)]) == 2
    capsys.readouterr()
    assert models.cache.describe_dir(model_dir, cache_dir, False)["weights_sha256"] != before
