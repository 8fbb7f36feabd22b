"""Benchmark 3: wall time of `dvc repro` after a small change vs a cold run of the pipeline.

    python benchmarks/bench_incremental.py [--models all | NAME,NAME] [--change-model smollm2-135m] [--keep]

Works in a temporary `git clone` of the project (committed files only; the working copy is never
touched), with the venv's dvc and python. Runs, each timed as a whole:
  cold          `dvc repro` with no outputs and an empty DVC cache and run-cache (the committed
                metrics files are deleted too); the model cache stays warm (MLESS_CACHE), so no
                download or GGUF conversion is timed
  figure param  figures.dpi + 1, then `dvc repro`
  model param   models.<change-model>.heads switched between `all` and the explicit list of all
                heads (same attention numbers, new params), then `dvc repro`
The stages each run executed are parsed from dvc's output. The cold default pipeline takes 7-9
minutes on 2 cores (the whole script under 10); --models runs it on a subset of the models
(params.yaml of the clone edited) to fit a shorter budget.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from meaningless_tokens.config import yaml12


def edit_params(path: Path, change) -> None:
    """Apply `change` to the clone's params.yaml (comments are lost; DVC compares values only)."""
    data = yaml12.load(path.read_text())  # as DVC reads it: a value the clone's DVC wrote reads back the same
    change(data)
    path.write_text(yaml12.dump(data))


def repro(clone: Path, env: dict, label: str) -> tuple[float, list[str]]:
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "dvc"), "repro"], cwd=clone, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"dvc repro failed in {clone} (status {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    ran = re.findall(r"Running stage '([^']+)'", proc.stdout + proc.stderr)
    restored = re.findall(r"Stage '([^']+)' is cached - skipping run, checking out outputs", proc.stdout + proc.stderr)
    ran += [f"{s} (run-cache)" for s in restored]
    print(f"  {label}: {seconds:.1f} s; ran {', '.join(ran) or 'nothing'}", file=sys.stderr, flush=True)
    return seconds, ran


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="all", help="comma-separated subset of params.yaml's models")
    ap.add_argument("--change-model", default="smollm2-135m", help="model whose params the last run changes")
    ap.add_argument("--keep", action="store_true", help="keep the temporary clone")
    args = ap.parse_args()

    from meaningless_tokens import models

    params = common.load_params()
    keep = list(params.models) if args.models == "all" else args.models.split(",")
    unknown = sorted(set(keep + [args.change_model]) - set(params.models))
    if unknown or args.change_model not in keep:
        raise SystemExit(f"unknown models {unknown} or --change-model not among --models; configured: {list(params.models)}")
    cache = models.cache_root(params.runtime, params.file)
    for name in keep:  # untimed: the benchmark measures the pipeline with a warm model cache
        models.prepare(params, name)
    print(f"machine: {os.cpu_count()} CPU cores, float32; load average {os.getloadavg()[0]:.2f} at start; "
          f"warm model cache: {cache}")
    env = dict(os.environ, MLESS_CACHE=str(cache), DVC_NO_ANALYTICS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

    tmp = Path(tempfile.mkdtemp(prefix="bench-incremental-"))
    clone = tmp / "project"
    others = common.OtherLoad()
    started = time.perf_counter()
    try:
        subprocess.run(["git", "clone", "-q", str(common.ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
        for p in (clone / "metrics").rglob("*.json"):  # committed outputs: cold means none at all
            p.unlink()
        if (clone / ".dvc" / "cache").exists():
            raise SystemExit(f"{clone}/.dvc/cache exists: not a cold clone")
        if keep != list(params.models):
            edit_params(clone / "params.yaml", lambda d: d.update(models={k: d["models"][k] for k in keep}))

        runs = []
        seconds, ran = repro(clone, env, "cold")
        runs.append(["cold", "nothing (no outputs, empty DVC cache)", seconds, ran])
        timing = {p.stem: json.loads(p.read_text()) for p in sorted((clone / "metrics" / "timing").glob("*.json"))}

        edit_params(clone / "params.yaml", lambda d: d["figures"].update(dpi=d["figures"]["dpi"] + 1))
        seconds, ran = repro(clone, env, "figure param")
        runs.append(["figure param", "figures.dpi + 1", seconds, ran])

        n_heads = json.loads((clone / "artifacts" / "models" / f"{args.change_model}.json").read_text())["facts"]["num_heads"]
        new_heads = []

        def switch_heads(d):
            spec = d["models"][args.change_model]
            spec["heads"] = list(range(n_heads)) if spec.get("heads", "all") == "all" else "all"
            new_heads.append(spec["heads"])
        edit_params(clone / "params.yaml", switch_heads)
        seconds, ran = repro(clone, env, "model param")
        runs.append(["model param", f"models.{args.change_model}.heads -> {new_heads[0]}", seconds, ran])
    finally:
        if args.keep:
            print(f"clone kept: {clone}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"git clone of {common.ROOT} at {head}; models: {', '.join(keep)}; each run is one `dvc repro`")
    cold = runs[0][2]
    common.table(["run", "change", "stages run", "wall s", "cold / this"],
                 [[r[0], r[1], f"{len(r[3])}: {', '.join(r[3])}" if r[0] != "cold" else f"{len(r[3])} (all)",
                   f"{r[2]:.1f}", f"{cold / r[2]:.1f}x"] for r in runs])
    print(f"cold run stages: {', '.join(runs[0][3])}")
    print("cold run, stage timings from metrics/timing: " + ", ".join(
        f"{k} {v.get('seconds', v.get('seconds_this_run'))} s" for k, v in timing.items()))
    print(f"total {time.perf_counter() - started:.0f} s; {others}")
    print(f"ratio: {cold / runs[1][2]:.1f}x less wall time after a figure-only change than cold (target >= 20x); "
          f"{cold / runs[2][2]:.1f}x after one model's params change")


if __name__ == "__main__":
    main()
