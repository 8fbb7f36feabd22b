"""Benchmark: the default profile through `mless repro --cluster` (a local Ray on this machine) against a serial
`dvc repro`, side by side in one run, each in a fresh clone of HEAD with the same model cache.

    python benchmarks/bench_cluster.py [--workdir DIR] [--num-cpus N] [--keep]

Prints, for each side: wall time, the stages that ran; then the ratio serial / scheduled; the scheduler's overhead
per task (a task's wall time less its stage's own `seconds` from the timing sidecar: the worktree, DVC's upstream
restore, the interpreter, Ray), as a median and total; the peak resident memory of Ray's own processes (raylet,
GCS, its workers without the stages they start) sampled every 0.2 s beside the stages' peak (their sidecars'
`peak_rss_mb`); and whether the two clones' outputs are the same bytes (the timing sidecars and the pages that print
them set aside). Both clones take the environment this script runs in (its `dvc`, its Ray).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.dvc_repo import RUN_RECORDS  # noqa: E402 - what records a run, set aside when outputs are compared


def clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    return dest


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    """`cmd` in `cwd` with this environment's bin first on PATH (DVC runs the stages' `python` from there)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed in {cwd} (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start, proc.stdout + proc.stderr


class RayMemory(threading.Thread):
    """The peak summed RSS of Ray's processes (by name: raylet, gcs_server, ray:: workers and the dashboard's, the
    plasma store), without the stage processes the workers start."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.stop = 0.0, threading.Event()

    def run(self):
        import psutil

        while not self.stop.is_set():
            total = 0
            for p in psutil.process_iter(["name", "cmdline", "memory_info"]):
                text = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
                if any(k in text for k in ("raylet", "gcs_server", "ray::", "default_worker.py", "ray/dashboard",
                                            "log_monitor.py", "monitor.py")) and p.info["memory_info"]:
                    total += p.info["memory_info"].rss
            self.peak = max(self.peak, total / 2**20)
            self.stop.wait(0.2)


def outputs(repo: Path) -> dict[str, bytes]:
    out = {}
    for folder in ("artifacts", "metrics", "reports/figures", "reference", "docs/results"):
        for p in sorted((repo / folder).rglob("*")):
            rel = str(p.relative_to(repo))
            if p.is_file() and p.name != ".gitignore" and not rel.startswith(RUN_RECORDS):
                out[rel] = p.read_bytes()
    return out


def sidecar_seconds(repo: Path) -> dict[str, float]:
    """{stage: its own seconds} from metrics/timing/<stage>-<model>.json."""
    got = {}
    for f in (repo / "metrics" / "timing").glob("*.json"):
        data = json.loads(f.read_text())
        stage, _, model = f.stem.partition("-")
        for prefix in ("prepare", "extract", "evaluate", "stats", "activations", "sweep", "likelihood", "arm_tuning"):
            if f.stem.startswith(prefix + "-"):
                stage, model = prefix, f.stem[len(prefix) + 1:]
        got[f"{stage}@{model}"] = float(data.get("seconds", data.get("seconds_this_run", 0.0)))
    return got


def peak_stage_rss(repo: Path) -> float:
    return max((float(json.loads(f.read_text()).get("peak_rss_mb", 0)) for f in (repo / "metrics" / "timing").glob("*.json")),
               default=0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--num-cpus", type=int, help="the local Ray's CPUs (default: the machine's)")
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    bindir = Path(sys.executable).parent
    serial, scheduled = clone(work / "serial"), clone(work / "scheduled")
    print(f"clones of {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()} in {work}", flush=True)

    wall_serial, log_serial = timed([str(bindir / "dvc"), "repro"], serial)
    print(f"serial dvc repro: {wall_serial:.0f} s", flush=True)

    mem = RayMemory()
    mem.start()
    # `python -m` from the clone: the driver imports the clone's code, as Ray's workers do (they put the driver's folder
    # first on their path), not the venv's editable install
    cmd = [sys.executable, "-m", "meaningless_tokens.add_model", "repro", "--cluster", "--scratch", str(work / "scratch"), "--timeline",
           str(work / "timeline"), *(["--num-cpus", str(args.num_cpus)] if args.num_cpus else [])]
    wall_sched, log_sched = timed(cmd, scheduled)
    mem.stop.set()
    mem.join()
    print(f"mless repro --cluster: {wall_sched:.0f} s", flush=True)

    timeline = json.loads((work / "timeline" / "timeline.json").read_text())
    own = sidecar_seconds(scheduled)
    overhead = [t["end"] - t["start"] - own[t["step"]] for t in timeline["tasks"]
                if t["kind"] == "stage" and t["step"] in t["ran"] and t["step"] in own]
    a, b = outputs(serial), outputs(scheduled)
    differ = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    print()
    print(f"| side | wall | tasks |\n|---|---|---|\n| serial `dvc repro` | {wall_serial:.0f} s | - |\n"
          f"| `mless repro --cluster` ({timeline['tasks'] and len({t['node'] for t in timeline['tasks']})} node) | "
          f"{wall_sched:.0f} s | {len(timeline['tasks'])} |")
    if overhead:
        print(f"scheduler overhead per task (task wall - stage's own seconds), {len(overhead)} tasks: median "
              f"{statistics.median(overhead):.1f} s, total {sum(overhead):.0f} s")
    print(f"peak RSS: Ray's own processes {mem.peak:.0f} MiB; the largest stage {peak_stage_rss(scheduled):.0f} MiB")
    print(f"outputs: {len(a)} files, {'the same bytes' if not differ else f'{len(differ)} differ: ' + ', '.join(differ[:8])}")
    print(f"ratio: {wall_serial / wall_sched:.2f} (serial / scheduled wall time)")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
