"""The fault model (docs/faults.md), case by case: each fault gives the correct result or one `error:` line with
exit status 2, never exit 0 with a wrong number, never a traceback or a crash, and leaves no output that a later
stage or DVC would trust."""

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
from tests.conftest import ROOT


def tiny_eval_params(write_params, tiny_dirs, **evaluate_cfg):
    raw = load_params(write_params()).model_dump()
    raw["evaluate"].update(dict(n_samples=4, max_new_tokens=12, batch_size=3, stop_at_boxed=True) | evaluate_cfg)
    raw["models"] = {"tiny": {"display_name": "Tiny llama", "family": "llama",
                              "source": {"kind": "local_dir", "path": str(tiny_dirs["llama"])}}}
    return load_params(write_params(raw))


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
    path.write_bytes(whole + json.dumps(engines.asdict(rec[2])).encode())
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


def test_evaluate_killed_at_random_moments_ends_with_the_uninterrupted_result(tiny_dirs, write_params, cache_dir,
                                                                             tmp_path):
    """SIGKILL at random moments of a running evaluate, again and again, each run resuming the last one's
    journal; the run that finally completes writes the uninterrupted run's bytes. The runs are processes forked
    from a server that has imported torch and transformers once (a fresh interpreter spends seconds on that)."""
    import multiprocessing

    params = tiny_eval_params(write_params, tiny_dirs, n_samples=8, max_new_tokens=24, batch_size=2)
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
    for k in range(10):
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
