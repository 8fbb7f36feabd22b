"""A dry run of the GPU profile on the CPU (issue 20): the paper profile up to the weights.

`profiles/gpu.yaml` as it is, except what a CPU without the paper's weights forces: every model's source
is a tiny random model shaped like it (tests/tiny.py, PAPER_SHAPES: the paper model's own layer, query
head and kv head counts and config family, Gemma-3's multimodal wrapper and sliding-window pattern,
small widths), float32 on the CPU, offline, a few problems and a few generated tokens. Prompt, figures
and report params, model names, display names, layers and heads are the GPU profile's, so every seed
chart is selected, validated and drawn as on the GPU.

    python -m tests.dry_run [--keep DIR]

builds the models, copies the project into a temporary git + DVC repository with that params.yaml and
runs `dvc repro` there (the real pipeline, every stage); it prints where the report is.
tests/test_dry_run.py runs the same params through the stages in-process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from meaningless_tokens.config import yaml12
from tests import params, tiny

# what the CPU run shrinks (laid over the profile key by key); everything else is the GPU profile's
# (a coarser activation histogram too: its chart takes most of the drawing time, and its bins are no figure param;
# and the CPU's likelihood batch budget: the GPU's 16384 padded tokens per pass made the stand-ins' scoring 1.3x slower;
# and the span sweep at three of the profile's six counts, none, the paper's 55 and the largest: at six, the sweep was
# half of the stages' 200 s on one thread, two thirds of it the solution's scoring at every count)
SMALL = {"extract": {"n_samples": 2, "showcase": 1}, "evaluate": {"n_samples": 2, "max_new_tokens": 2, "batch_size": 6,
                                                                 "sampling": {"n": 2, "max_new_tokens": 2}},
         "stats": {"n_boot": 50}, "activations": {"n_boot": 50, "showcase": 0, "bins": 60},
         "sweep": {"counts": [0, 55, 70], "attention_samples": 2, "accuracy_samples": 2, "likelihood_samples": 2,
                   "n_boot": 50},
         "likelihood": {"n_samples": 3, "solution_tokens": 16, "n_boot": 50, "batch_tokens": 1024}}
CPU = {"runtime": {"device": "cpu", "dtype": "float32", "offline": True, "threads": 1}}


def build_models(folder: Path) -> dict[str, Path]:
    """The paper's four models as tiny random stand-ins, built once into `folder`."""
    dirs = {}
    for name in tiny.PAPER_SHAPES:
        out = folder / name
        if not (out / "config.json").is_file():
            tiny.build_paper(name, out)
        dirs[name] = out
    return dirs


def dry_run_params(model_dirs: dict[str, Path], absolute_paths: bool = False) -> dict:
    """profiles/gpu.yaml with tiny local models on the CPU and a few problems (see the module doc)."""
    raw = params.build("profiles/gpu.yaml", {"profile": "gpu-dry-run", **CPU, **SMALL}, absolute=absolute_paths)
    if set(raw["models"]) != set(model_dirs):
        raise SystemExit(f"profiles/gpu.yaml models {sorted(raw['models'])} != tiny stand-ins {sorted(model_dirs)}")
    for name, spec in raw["models"].items():
        spec["source"] = {"kind": "local_dir", "path": str(model_dirs[name])}
    return raw


def main(argv: list[str] | None = None) -> int:
    from tests.dvc_repo import Repo

    ap = argparse.ArgumentParser(prog="python -m tests.dry_run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, help="run in this (new) folder and keep it; default: a temporary one")
    args = ap.parse_args(argv)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu-dry-run-") as tmp:
        base = args.keep or Path(tmp)
        dirs = build_models(base / "models")
        repo = Repo.create(base / "project", base / "home", base / "model-cache", {})
        (repo.path / "params.yaml").write_text(yaml12.dump(dry_run_params(dirs)))
        repo.run(str(Path(sys.executable)), "-m", "meaningless_tokens.config", "check")
        proc = repo.dvc("repro", check=False)
        sys.stdout.write(proc.stdout[-4000:])
        sys.stderr.write(proc.stderr[-4000:])
        if proc.returncode:
            print(f"dry run: dvc repro failed ({proc.returncode})", file=sys.stderr)
            return proc.returncode
        figs = sorted(p.name for p in (repo.path / "reports/figures").glob("*.png"))
        print(f"dry run: {len(figs)} charts ({', '.join(figs)})")
        print(f"dry run: report {repo.path / 'reports/report.html'}" + ("" if args.keep else " (removed on exit)"))
        print(f"dry run: {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
