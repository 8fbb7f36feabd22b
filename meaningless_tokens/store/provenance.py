"""Provenance: what an artifact records of the code, libraries and environment that made it, and the run's sidecar
(timings, the commit that ran, the machine), which never goes inside an artifact."""

from __future__ import annotations

import json
import os
from pathlib import Path

from meaningless_tokens.store.metrics import write_metrics
from meaningless_tokens.store.stages import CODE_PATHS, ROOT, code_hashes
from meaningless_tokens.store.view import stage_params


# Written into the environment (sys.prefix) by `make install`: the lock it was installed from and its sha256.
ENV_RECORD = "meaningless-tokens-lock.json"


def environment() -> dict:
    """The lock this environment was installed from (`make install` records it): {"lock", "sha256"},
    both None where the environment was installed by hand."""
    import sys

    try:
        data = json.loads((Path(sys.prefix) / ENV_RECORD).read_text())
        return {"lock": data["lock"], "sha256": data["sha256"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {"lock": None, "sha256": None}


def provenance(stage: str) -> dict:
    """The run-independent provenance of a stage's artifact: package version, the sha256 of each code
    file the stage depends on (`code_hashes`), library versions and the environment's lock (`environment`).

    No git commit: a commit moves whenever anything is committed (results, params, another stage's
    code), and an artifact's bytes must depend only on the stage's declared inputs, or a fresh
    clone's `dvc repro` would write other bytes than the committed run. The commit that ran goes to
    the run's sidecar instead (`run_info`, in `metrics/timing/<stage>-<model>.json`)."""
    from importlib import metadata

    libs = {}
    for lib in ("torch", "transformers", "tokenizers", "h5py", "numpy", "math-verify", "dvc"):
        try:
            libs[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    try:
        version = metadata.version("meaningless-tokens")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"package_version": version, "stage": stage, "code_sha256": code_hashes(stage), "libraries": libs,
            "environment": environment()}


def model_provenance(stage: str, params, name: str, manifest: dict, unused: tuple[str, ...] = ()) -> dict:
    """What every model stage's artifact records first: `provenance(stage)`, the model (its manifest: source, weights
    sha256, architecture facts) and the params dvc.yaml lists for the stage (`stage_params`)."""
    return {**provenance(stage), "model": {"name": name, **manifest}, "params": stage_params(params, stage, name, unused)}


# The sidecar's keys that say which machine ran (machine(); the report prints them) and which code (run_info): what
# `python -m meaningless_tokens.verify` prints for both sides when an output is not identical.
MACHINE_FACTS = ("device", "cpu_model", "cpu_capability", "threads")
RUN_FACTS = (*MACHINE_FACTS, "git_commit")


def run_info() -> dict:
    """What identifies this run's code in git, for the run's sidecar (never inside an artifact):
    `git_commit`, the last commit that changed the code (CODE_PATHS), and `git_dirty`, whether the
    code had uncommitted changes (then the commit alone does not identify it)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("log", "-1", "--format=%H", "--", *CODE_PATHS) or "unknown"
        dirty = bool(git("status", "--porcelain", "--", *CODE_PATHS))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", None
    return {"git_commit": commit, "git_dirty": dirty, **machine()}


def machine() -> dict:
    """What explains a float output's last digits on another machine (`python -m meaningless_tokens.verify`
    prints both sides'): `cpu_model`, `cpu_capability` (the instruction set torch dispatches its kernels to,
    e.g. AVX2 or AVX512), `threads` (torch's intra-op threads) and `device` (cpu, or the CUDA device's name).
    The torch facts only where the stage ran torch (None otherwise: statistics and figures are numpy only).
    """
    import platform
    import sys

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts = {"cpu_model": model, "cpu_capability": None, "threads": None, "device": "cpu"}
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        facts.update(cpu_capability=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
                     device=torch.cuda.get_device_name() if cuda else "cpu")
    return facts


def write_timing(path: str | os.PathLike, data: dict) -> None:
    """A run's sidecar (`metrics/timing/<stage>-<model>.json`): its timings, `run_info()` and `peak_rss_mb`,
    the process's peak resident memory so far (MiB; Linux reports ru_maxrss in KiB, macOS in bytes), which
    a stage writes last: the stage's peak."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mb = rss / (1 << 20) if sys.platform == "darwin" else rss / 1024
    write_metrics(path, {**data, **run_info(), "peak_rss_mb": round(peak_mb, 1)})


def write_prompt_timing(path: str | os.PathLike, seconds: float, n_prompts: int, artifact: Path,
                        tokens: int | None = None) -> None:
    """The sidecar of a stage that runs the model on prompts: wall time, per prompt, the artifact's size, and (given
    the prompts' tokens) tokens per second."""
    rate = {"tokens": tokens, "tokens_per_second": round(tokens / seconds, 1) if seconds else None} if tokens else {}
    write_timing(path, {"seconds": round(seconds, 2), "ms_per_prompt": round(1000 * seconds / n_prompts, 1),
                        "prompts": n_prompts, "bytes": artifact.stat().st_size, **rate})
