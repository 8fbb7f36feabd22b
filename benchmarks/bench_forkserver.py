"""Benchmark: a model stage started cold (a fresh interpreter importing torch and transformers) against the same
stage forked from the warm-start server (meaningless_tokens/forkserver.py), side by side in one run.

    python benchmarks/bench_forkserver.py                      # extract, activations, sweep of the four models
    python benchmarks/bench_forkserver.py --stages extract --models smollm2-135m --repeats 3

Runs in a scratch copy of the project (its tracked files and the prepared models' manifests; the model cache is
the user's, warm), so the workspace's outputs and timings stay as they are. Each (stage, model) runs cold and warm
in turn, `--repeats` times, alternating which goes first; prints the wall time of each process, the totals, the
ratio and the seconds saved per stage. Needs `dvc repro` (or `dvc pull`) to have prepared the models.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def scratch_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    for manifest in (ROOT / "artifacts/models").glob("*.json"):
        (dest / "artifacts/models").mkdir(parents=True, exist_ok=True)
        shutil.copy2(manifest, dest / "artifacts/models" / manifest.name)


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=["extract", "activations", "sweep"])
    ap.add_argument("--models", nargs="+", default=None, help="default: every model of params.yaml")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from meaningless_tokens.config import load_params
    from meaningless_tokens.forkserver import socket_dir

    models = args.models or list(load_params(ROOT / "params.yaml").models)
    missing = [m for m in models if not (ROOT / "artifacts/models" / f"{m}.json").is_file()]
    if missing:
        sys.exit(f"artifacts/models/: no manifest for {missing}: run `dvc repro` or `dvc pull` first")
    with tempfile.TemporaryDirectory(prefix="bench-forkserver-") as tmp, \
            tempfile.TemporaryDirectory(prefix="mfs-", dir="/tmp") as sockets:
        work = Path(tmp)
        scratch_copy(work)
        env = {**os.environ, "MLESS_FORKSERVER_DIR": sockets}  # a server of the benchmark's own
        cold_env, warm_env = {**env, "MLESS_FORKSERVER": "0"}, {**env, "MLESS_FORKSERVER": "1"}
        py = [sys.executable, "-m"]
        timed(py + ["stages.stats", "--help"], work, warm_env)  # starts the server
        deadline = time.monotonic() + 60
        while not list(Path(sockets).glob("*.sock")):
            if time.monotonic() > deadline:
                sys.exit(f"no warm-start server came up in {sockets}")
            time.sleep(0.2)
        time.sleep(8)  # its imports done (a fork before that would wait for them)
        rows = []
        for stage in args.stages:
            for model in models:
                cmd = py + [f"stages.{stage}", "--model", model]
                cold, warm = [], []
                for r in range(args.repeats):
                    order = [(cold, cold_env), (warm, warm_env)]
                    for runs, e in (order if r % 2 == 0 else order[::-1]):
                        runs.append(timed(cmd, work, e))
                rows.append((f"{stage}@{model}", statistics.median(cold), statistics.median(warm)))
                print(f"{rows[-1][0]:40s} cold {rows[-1][1]:6.2f} s   warm {rows[-1][2]:6.2f} s", flush=True)
        servers = len(list(Path(sockets).glob("*.sock")))
    cold_total, warm_total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"\n{len(rows)} stage runs (median of {args.repeats} each), {servers} server")
    print(f"cold {cold_total:.1f} s, warm {warm_total:.1f} s: warm/cold = {warm_total / cold_total:.2f}, "
          f"{(cold_total - warm_total) / len(rows):.1f} s saved per stage")
    return 0


if __name__ == "__main__":
    sys.exit(main())
