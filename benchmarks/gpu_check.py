"""`make gpu-check`: one command that shows whether the GPU path works on this machine, and how fast.

Its parts, in order, each with a time limit (LIMITS; `--limit PART=SECONDS`, `--total SECONDS`), the default sized
to finish within 9 minutes of one H100 or H200, the machine's interpreter start, the wheels' install and the
preflight included (ESTIMATES: each step's expected seconds, from the one GPU run on record; docs/gpu.md). First the
preflight (benchmarks/gpu_preflight.py: every third-party module the check imports, one line each that is missing or
too old, exit 2), then the tier, then per model its build, stages and benchmark (2-3 below). A limit is checked
between batches (meaningless_tokens/progress.py's deadline): a stage past it is "timed out" and the part's later
steps "timed out (not started)", then the next part runs. The time left is shared among the parts still to run in
proportion to their limits, so that a part's overrun (a cold compile in flight cannot be stopped) is borne by every
later part alike, not by the next alone. A step starts only with MIN_START[its kind] seconds of its part left: a cold
compile (evaluate's first run per model) needs most of a minute, a step whose compile is done a few seconds.

1. The CUDA tier (`pytest -v -m cuda tests/test_cuda.py`, a subprocess, its output streamed into tier.log; killed
   at its limit, counted from what it printed against the cases pytest collected: those it did not reach are named
   "not run (time limit)"). Its cases run in the order of benchmarks/gpu_tier.py (what only a GPU checks first).
2. Every model stage in-process (`run(params, name, root=...)`: prepare, extract, stats, activations, likelihood,
   evaluate, evaluate once more in the same process (evaluate_warm: the shared model, hook, compiled step and
   cache: no compile, no warm-up), sweep (taking evaluate's rows, in evaluate's shape),
   arm_tuning) on random-weight models with the real configs of the paper's models (tests/tiny.py,
   REAL_CONFIGS; the tests' tokenizer), bfloat16, built on the GPU and saved once into the work folder (their
   digest the build's identity, so prepare does not hash weights the check has just written); the
   GPU profile's params (profiles/gpu.yaml) with its sizes bounded (SIZES) and the `arm` condition added.
   Default: Qwen2.5-Math-1.5B and -7B; --all-models adds Llama-3.1-8B-Instruct and Gemma-3-4b-it.
3. Per model, benchmarks/bench_gpu_generate.py: the evaluate engine against plain `model.generate` (dynamic cache)
   at batch 64 on the same prompts, greedy and sampled, steady tokens/s and the warm-up apart (BENCH).
4. In the out folder (`--out`), rewritten whole after every row: gpu-check.json and gpu-check.md, a Markdown table:
   each step's expected and measured seconds side by side (the table LIMITS is retuned from); the parts;
   per model and stage the wall seconds, the stage's own work seconds
   (its timing sidecar: the model's passes, the load excluded), peak CUDA memory, host-device syncs, tokens and
   tokens per second (extract's and likelihood's from their sidecars); the tier's result; the generation
   benchmark's rows; per model the GPU profile's projected hours at 500 problems; the GPU plan's targets beside
   what was measured.
5. Exit 1 unless every part ran through (a stage raising or timing out, the tier failing or timing out, a
   non-finite value in an artifact), after writing what it measured. SIGTERM or SIGINT ends the tier's process
   group and the step in flight, rewrites both files with what finished, and exits 128 + the signal's number.

--tiny: tests/tiny.py-sized widths of the same families on the CPU, the same code path (syncs: n/a; no expected
seconds: those are a GPU's); tests/test_gpu_check.py runs it inside `make test`.

    python benchmarks/gpu_check.py [--all-models] [--tiny] [--no-tier] [--no-bench] [--bench KEY=N] [--out DIR]
                                   [--limit PART=SECONDS] [--total SECONDS] [--min-start [KIND=]SECONDS] [--work DIR]
                                   [--set KEY=VALUE]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/gpu_check.py` puts only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))


DEFAULT_MODELS = ("qwen2_5-math-1_5b", "qwen2_5-math-7b")
MORE_MODELS = ("llama3_1-8b-instruct", "gemma3-4b-it")
STAGES = ("prepare", "extract", "stats", "activations", "likelihood", "evaluate", "evaluate_warm", "sweep",
          "arm_tuning")
PROBLEMS = 500  # the projection's problems: all of MATH-500, as the GPU profile runs
# the GPU profile's sizes bounded so that the default (the tier, two models) fits 6 minutes of one H100
# evaluate's plan has 64 rows (8 problems x 4 conditions x 2 samples), so that its one shape has the GPU plan's 64 rows
# (batch_size auto: at most the plan's rows) and a cache of its width + 32 tokens; the sweep adopts that shape, the
# generation benchmark too (BENCH: 32 new tokens): one compile of the decode step per model. The sweep's accuracy runs
# evaluate's problems (the same count and seed) at counts up to mless's 55: its prompts are no longer than evaluate's
# mless prompts, so they fit evaluate's width (a count of 70 may cross a multiple of 256: a shape, a compile of its
# own), and its count-0 and count-55 rows are evaluate's none and mless rows, which it takes
SIZES = {"extract": {"n_samples": 4, "showcase": 1},
         "evaluate": {"n_samples": 8, "max_new_tokens": 32, "batch_size": 64, "sampling": {"n": 2, "max_new_tokens": 16}},
         "stats": {"n_boot": 50},
         "activations": {"n_boot": 50},
         "sweep": {"attention_samples": 4, "accuracy_samples": 8, "likelihood_samples": 2, "n_boot": 50,
                   "counts": [0, 10, 25, 40, 55]},
         "likelihood": {"n_samples": 4, "n_boot": 50},
         "arm_tuning": {"n_samples": 2, "n_boot": 50}}
# the CPU's seconds (the tiny mode runs inside `make test`): fewer problems and tokens, reference solutions cut to
# 32 tokens (whole ones were most of the scoring: arm_tuning scores them once per setting)
# (the CPU refuses evaluate.batch_size auto, the GPU profile's: the tiny mode fixes it)
# compile on, as on a GPU (dynamo's eager backend there: tiny_compile), so that the planned shape, the sweep's taking
# evaluate's rows and the one compile per model run on the CPU too; 16 rows (2 x 4 x 2 samples), the benchmark's batch
TINY_SIZES = {"extract": {"n_samples": 2},
              "evaluate": {"n_samples": 2, "max_new_tokens": 16, "batch_size": 16, "compile": "on"},
              "sweep": {"attention_samples": 2, "accuracy_samples": 2}, "likelihood": {"n_samples": 2, "solution_tokens": 32}}
# the stage's own work seconds in its timing sidecar (metrics/timing/<stage>-<model>.json): the model's passes
WORK_KEYS = {"extract": ("seconds",), "activations": ("seconds",), "likelihood": ("scoring_seconds",),
             "arm_tuning": ("scoring_seconds",), "evaluate": ("generation_seconds", "sampled_generation_seconds")}
NOT_RUN = "not run (--no-tier: tests/test_cuda.py runs in the same `make test`)"
# the generation benchmark (benchmarks/bench_gpu_generate.py) per model: the GPU plan's batch; one batch per mode and
# 32 new tokens, since plain `generate` runs uncompiled (about 47 ms a decode step at the 1.5B width, batch 64):
# 2 modes x (warm-up + steady) x 32 steps is about 6 s of it per model; tiny: the CPU's seconds
BENCH = {"batch_size": 64, "new_tokens": 32, "batches": 1}
TINY_BENCH = {"batch_size": 16, "new_tokens": 8, "batches": 1}
# Each step's expected seconds on one H100 or H200 at the sizes above: estimates from the one GPU run on record (an
# H200, ../shared/gpu/, docs/gpu.md "The check's budget"), scaled to these sizes, the model's load included; the first
# run prints each beside what it measured (gpu-check.md, "Steps"), and these are retuned from that table.
# The tier: the record ran 12 CUDA cases in 132 s with the 5 CPU bfloat16 ones (now left out: TIER_CASES), two of them
# a cold inductor compile of evaluate's decode step (tiny models: about 30 s each); the 7 cases added since are 6
# compiled-ARM cases (an inductor compile of a small graph each, about 12 s) and the draws' bits (seconds).
# The 1.5B width (H200, 64 problems; the check runs 4-8): prepare 2.9 s (the hash of 3 GB: the check skips it),
# extract 5.1 s, activations 14.2 s, likelihood 11.2 s, evaluate 75 s (the first batch's compile 44-67 s), about
# 2 s of each stage the model's load. The 7B width: prepare 14.0 s (the hash of 15 GB), extract 9.1 s, activations
# 28.3 s, likelihood 17.4 s, evaluate's compile about 46 s, each full load of 15 GB about 4 s.
# Llama-3.1-8B and Gemma-3-4b (--all-models): the 7B's, scaled by their weights (16 GB, 8.6 GB); never measured.
_WIDE = {"build": 15, "prepare": 2, "extract": 4, "stats": 1, "activations": 4, "likelihood": 7, "evaluate": 60,
         "evaluate_warm": 6, "sweep": 15, "arm_tuning": 12, "benchmark": 13}
ESTIMATES = {"tier": {"tier": 190},
             "qwen2_5-math-1_5b": {"build": 6, "prepare": 2, "extract": 3, "stats": 1, "activations": 2,
                                   "likelihood": 3, "evaluate": 75, "evaluate_warm": 4, "sweep": 8, "arm_tuning": 6,
                                   "benchmark": 10},
             "qwen2_5-math-7b": _WIDE,
             "llama3_1-8b-instruct": {k: math.ceil(v * 1.1) for k, v in _WIDE.items()},
             "gemma3-4b-it": {k: math.ceil(v * 0.7) if k != "evaluate" else 55 for k, v in _WIDE.items()}}
STARTUP = 25  # seconds of the 9 minutes before the check's clock starts: the interpreter, the wheels' install
MARGIN = 0.1  # each part's limit: its expected seconds and a tenth (the 540 s are 1.14 times the expected 474)
# The parts' time limits in seconds (`--limit PART=SECONDS`): a model's part is its build, its stages and its
# benchmark. The default run (the tier, the 1.5B and 7B widths) adds up to 494 s, the total: with STARTUP, 519 s of the
# 540. A limit is checked between batches; the step in flight (a cold compile) runs to its end.
LIMITS = {part: math.ceil(round(sum(steps.values()) * (1 + MARGIN), 6)) for part, steps in ESTIMATES.items()}
BUDGET = 540  # seconds: the one command on a lent GPU (at most 10 minutes a command, about 15 a slot, its start included)
# the tier's CUDA cases: its CPU cases (the bfloat16 comparisons on the CPU, the comparison's own checks) run in every
# `make test`, and would cost the GPU's minutes for nothing new
TIER_CASES = "not cpu-bfloat16 and not on_the_cpu and not assert_close"
# A step starts only with this many seconds of its part left, by its kind (`--min-start [KIND=]SECONDS`): evaluate's
# first run per model compiles the decode step (44-67 s on the record's H200; it cannot be stopped midway, so starting
# it with less left only overruns the part); every other step is seconds, or runs a step already compiled.
MIN_START = {"tier": 30, "compile": 45, "step": 5}
KIND = {"tier": "tier", "evaluate": "compile"}  # a step's kind; any other: "step"
TIMED_OUT, NOT_STARTED = "timed out", "timed out (not started)"
TIER_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)  # pytest -v, a test's line
# the GPU plan's projected hours of the GPU profile: (models, at most hours)
PLAN_HOURS = [(DEFAULT_MODELS, 1.5), (DEFAULT_MODELS + MORE_MODELS, 3.0)]
# stages whose sidecar records the tokens they processed and their tokens per second
SIDECAR_RATES = ("extract", "likelihood")


# ---- models and params ----------------------------------------------------------------------------

def build_models(names, work: Path, tiny: bool, device: str) -> None:
    """Each model saved once into work/models/<name> (a folder without `done` is rebuilt: an interrupted save), its
    digest in the check's model cache (work/cache) the build's identity (`built_identity`), so that prepare does not
    hash the weights just written (gpu-check.md says so on prepare's row)."""
    from meaningless_tokens.models.cache import identify_built
    from tests import tiny as tiny_models

    for name in names:
        out = work / "models" / name
        if not (out / "done").is_file():
            if out.exists():
                import shutil
                shutil.rmtree(out)
            t0 = time.perf_counter()
            tiny_models.build_real(name, out, tiny=tiny, device=device)
            gc.collect()
            if device == "cuda":
                import torch
                torch.cuda.empty_cache()
            identity = built_identity(name, out, device)
            (out / "done").write_text(identity)  # before the digest's memo: its key holds every file's stat
            identify_built(out, work / "cache", identity)
            print(f"gpu-check: built {name} ({'tiny' if tiny else 'real'} config) in {time.perf_counter() - t0:.1f} s")


def built_identity(name: str, out: Path, device: str) -> str:
    """What a built model's weights are a function of (its config, seed 0, the device and torch that drew them) and
    when they were drawn, as sha256 hex: the digest prepare records for them in place of hashing them."""
    import hashlib

    import torch

    return hashlib.sha256(json.dumps(["gpu-check build", name, (out / "config.json").read_text(), "seed 0", device,
                                      torch.__version__, time.time_ns()]).encode()).hexdigest()


def check_params(dirs: dict[str, Path], tiny: bool, overrides: list[str]) -> dict:
    """profiles/gpu.yaml with local random-weight sources, SIZES, the arm condition and `overrides` (KEY=VALUE)."""
    from meaningless_tokens.config import yaml12  # YAML as DVC reads it (1.2: `on` a string)

    raw = yaml12.load((ROOT / "profiles" / "gpu.yaml").read_text())
    raw["profile"] = "gpu-check-tiny" if tiny else "gpu-check"
    raw["runtime"].update(device="cpu" if tiny else "cuda", dtype="bfloat16", offline=True,
                          **({"threads": 1} if tiny else {}))
    raw["prompt"]["conditions"] = ["none", "mless", "mful", "arm"]
    raw["prompt"]["mful"]["text_file"] = str(ROOT / raw["prompt"]["mful"]["text_file"])
    if raw["dataset"].get("path"):
        raw["dataset"]["path"] = str(ROOT / raw["dataset"]["path"])
    for section, values in [*SIZES.items(), *(TINY_SIZES.items() if tiny else ())]:
        for key, value in values.items():
            raw[section][key] = {**raw[section][key], **value} if isinstance(value, dict) else value
    names = list(dirs)
    raw["models"] = {n: {**raw["models"][n], "source": {"kind": "local_dir", "path": str(p)}} for n, p in dirs.items()}
    for section in ("evaluate", "likelihood", "arm_tuning"):
        raw[section]["models"] = names
    charts = {}
    for kind, chart in raw["figures"]["charts"].items():  # the paper's charts of the models that run
        kept = [m for m in chart["models"] if m in dirs]
        if kept:
            charts[kind] = {**chart, "models": kept,
                            **({"heads": {m: h for m, h in chart["heads"].items() if m in dirs}} if "heads" in chart else {})}
    raw["figures"]["charts"] = charts
    for item in overrides:
        key, sep, value = item.partition("=")
        *path, last = key.split(".")
        node = raw
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not sep or not path or not isinstance(node, dict) or last not in node:
            raise ValueError(f"--set {item}: expected KEY=VALUE with KEY a params key (section.key)")
        node[last] = yaml12.load(value)  # as `dvc exp run -S` would write it: `on` a string, 1e-3 a float
    return raw


# ---- measuring ------------------------------------------------------------------------------------

@contextlib.contextmanager
def counting_syncs(cuda: bool):
    """Host-device synchronisations inside the block, as tests/test_cuda.py counts them (torch's sync debug mode,
    as warnings); None on the CPU."""
    import torch

    if not cuda:
        yield None
        return
    seen = []
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode("default")
    seen.extend(w for w in caught if "synchronizing" in str(w.message))


def sidecar(project: Path, stage: str, name: str) -> dict:
    from meaningless_tokens import store

    path = project / store.path(f"timing/{stage}", name)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{path}: the stage's timing sidecar is unreadable ({e})") from None


def work_seconds(project: Path, stage: str, name: str) -> float | None:
    """The stage's own work seconds (WORK_KEYS) from its sidecar; a dict value (per condition) is summed."""
    if stage not in WORK_KEYS:
        return None
    data, total = sidecar(project, stage, name), 0.0
    for key in WORK_KEYS[stage]:
        if key not in data:
            if key.startswith("sampled"):
                continue
            raise RuntimeError(f"{project / 'metrics/timing'}/{stage}-{name}.json: no key {key!r}")
        value = data[key]
        total += sum(value.values()) if isinstance(value, dict) else value
    return total


def batch_size(project: Path, name: str, ev) -> int:
    """The evaluate stage's batch size as it ran: evaluate.batch_size, or what `auto` resolved to (its sidecar)."""
    if ev.batch_size != "auto":
        return ev.batch_size
    value = sidecar(project, "evaluate", name).get("batch_size")
    if not isinstance(value, int) or value < 1:
        raise RuntimeError(f"{project / 'metrics/timing'}/evaluate-{name}.json: batch_size is {value!r}, not the "
                           f"size evaluate.batch_size auto resolved to")
    return value


def sidecar_rate(project: Path, stage: str, name: str) -> float:
    """The tokens per second a stage's sidecar records (SIDECAR_RATES)."""
    value = sidecar(project, stage, name).get("tokens_per_second")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise RuntimeError(f"{project / 'metrics/timing'}/{stage}-{name}.json: tokens_per_second is {value!r}, "
                           f"not a positive number")
    return float(value)


def nonfinite(path: Path) -> list[str]:
    """Float datasets of an HDF5 artifact holding NaN or infinity."""
    import h5py
    import numpy as np

    bad = []

    def visit(key, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f" and not np.isfinite(obj[()]).all():
            bad.append(key)
    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return bad


def counts(params, project: Path, stage: str, name: str, out) -> dict:
    """Tokens the stage processed (prompt tokens) or generated, and the units its syncs are counted per."""
    import h5py

    from meaningless_tokens import store

    def extract_tokens() -> dict[str, int]:
        with h5py.File(project / store.path("attention", name), "r") as f:
            return {c: int(f[c]["offsets"][-1]) for c in params.prompt.conditions if c in f}

    ev = params.evaluate
    if stage == "extract":
        conds = len(extract_tokens())
        return {"tokens": int(sidecar(project, stage, name)["tokens"]), "kind": "prompt",
                "per": params.extract.n_samples * conds, "unit": "prompt", "problems": params.extract.n_samples,
                "conditions": conds}
    if stage == "activations":  # the extraction prompts; arm is the none prompt with the edit
        toks = extract_tokens()
        with h5py.File(out, "r") as f:
            conds = [c for c in params.prompt.conditions if c in f]
        return {"tokens": sum(toks["none" if c == "arm" else c] for c in conds), "kind": "prompt",
                "per": params.extract.n_samples * len(conds), "unit": "prompt", "problems": params.extract.n_samples,
                "conditions": len(conds)}
    if stage in ("likelihood", "arm_tuning"):
        data = sidecar(project, stage, name)
        per = data.get("sequences") if stage == "likelihood" else None
        return {"tokens": int(data["tokens"]), "kind": "prompt", "per": per, "unit": "sequence" if per else None,
                "conditions": len(params.likelihood.conditions),
                "sequences": per, "problems": params.likelihood.n_samples if stage == "likelihood" else None}
    if stage in ("evaluate", "evaluate_warm"):
        with h5py.File(out, "r") as f:
            conds = [c for c in params.prompt.conditions if c in f]
            greedy = sum(int(f[c]["n_tokens"][()].sum()) for c in conds)
            sampled = sum(int(f[c]["sampled"]["n_tokens"][()].sum()) for c in conds if "sampled" in f[c])
            rows = sum(f[c]["n_tokens"].shape[0] for c in conds)
            srows = sum(f[c]["sampled"]["n_tokens"].size for c in conds if "sampled" in f[c])
        size = batch_size(project, name, ev)
        steps = (-(-rows // size) * ev.max_new_tokens
                 + (-(-srows // size) * ev.sampling.max_new_tokens if srows else 0))
        return {"tokens": greedy + sampled, "kind": "generated", "per": steps, "unit": "decode step"}
    if stage == "sweep":  # random weights write no end-of-sequence: each row runs to its limit (the count is that)
        acc = sidecar(project, stage, name).get("accuracy", {})
        rows, reused = acc.get("generated"), acc.get("reused", 0)  # (no key: it took none)
        if not isinstance(rows, int) or not isinstance(reused, int):
            raise RuntimeError(f"{project / 'metrics/timing'}/sweep-{name}.json: accuracy: generated {rows!r}, reused "
                               f"{reused!r}: not the rows the sweep generated and took from evaluate's")
        size = acc["shape"]["rows"] if "shape" in acc else batch_size(project, name, ev)
        return {"tokens": rows * ev.max_new_tokens, "kind": "generated (at the limit)",
                "per": -(-rows // size) * ev.max_new_tokens, "unit": "decode step", "reused": reused, "generated": rows}
    return {"tokens": None, "kind": None, "per": None, "unit": None}


def tiny_compile() -> None:
    """The tiny mode's compiled decode step: dynamo's eager backend (the graph traced and run as it is: no C++ build
    on the CPU), the engine's other CompileConfig options kept."""
    from meaningless_tokens.engines import transformers as engine

    engine.COMPILE_OPTIONS = {**engine.COMPILE_OPTIONS, "backend": "eager", "mode": None}


def graphs() -> int:
    """Dynamo's graphs compiled in this process so far (its counter of unique graphs)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def run_stage(params, project: Path, stage: str, name: str, cuda: bool, at: float = math.inf) -> dict:
    """One stage in-process: wall seconds, peak CUDA memory, syncs (the model load included), tokens, and its
    artifacts' non-finite values; an exception is the row's status, the deadline `at` (time.monotonic(), checked
    between its batches: meaningless_tokens/progress.py) passed is "timed out"."""
    import torch

    from meaningless_tokens import progress
    from stages import activations, arm_tuning, evaluate, extract, likelihood, prepare, stats, sweep

    module = {"prepare": prepare, "extract": extract, "stats": stats, "activations": activations,
              "likelihood": likelihood, "evaluate": evaluate, "evaluate_warm": evaluate, "sweep": sweep,
              "arm_tuning": arm_tuning}[stage]
    row = {"model": name, "stage": stage, "status": "ok"}
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0, g0 = time.perf_counter(), graphs()
    try:
        with counting_syncs(cuda) as syncs, progress.deadline(at):
            out = module.run(params, name, root=project)
        row["graphs"] = graphs() - g0
        if cuda:  # the stage's queued kernels inside its wall time
            torch.cuda.synchronize()
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        row["peak_cuda_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None
        sidecar_stage = "evaluate" if stage == "evaluate_warm" else stage
        row["work_s"] = work_seconds(project, sidecar_stage, name)
        n = counts(params, project, stage, name, out)
        row["tokens"], row["tokens_kind"] = n["tokens"], n["kind"]
        for key in ("problems", "sequences", "conditions", "reused", "generated"):
            if n.get(key) is not None:
                row[key] = n[key]
        if stage in ("evaluate", "evaluate_warm", "sweep"):  # the plan's one shape and the warm-up, where made
            data = sidecar(project, "evaluate" if stage == "evaluate_warm" else stage, name)
            data = data.get("accuracy", {}) if stage == "sweep" else data
            row["shape"], row["warmup_s"] = data.get("shape"), data.get("warmup_seconds")
        secs = row["work_s"] or row["wall_s"]
        if stage in SIDECAR_RATES:  # the stage's own count over its own seconds
            row["tokens_per_s"], row["tokens_per_s_over"] = sidecar_rate(project, stage, name), "work"
        else:
            row["tokens_per_s"] = round(n["tokens"] / secs, 1) if n["tokens"] and secs else None
            row["tokens_per_s_over"] = None if row["tokens_per_s"] is None else ("work" if row["work_s"] else "wall")
        row["syncs"] = None if syncs is None else len(syncs)
        row["syncs_unit"] = n["unit"]
        row["syncs_per_unit"] = (round(len(syncs) / n["per"], 2) if syncs is not None and n["per"] else None)
        done = out.path / "done" if stage == "prepare" else None
        if done and done.is_file() and done.read_text() == out.weights_sha256:
            row["note"] = "weights not hashed: their digest is the check's build's identity (it wrote them)"
        if isinstance(out, Path) and out.suffix == ".h5":
            bad = nonfinite(out)
            if bad:
                row["status"] = f"non-finite values in {out.name}: {', '.join(bad[:5])}"
        for key in ("wall_s", "work_s", "peak_cuda_gib", "tokens_per_s"):
            if row[key] is not None and not math.isfinite(row[key]):
                row["status"] = f"non-finite {key}"
    except progress.TimedOut:  # it wrote nothing (a stage writes its outputs at its end)
        row["wall_s"], row["status"] = round(time.perf_counter() - t0, 2), TIMED_OUT
    except Exception as e:  # the row records it; the run goes on to the next stage and exits 1 at the end
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        row["status"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        traceback.print_exc()
    return row


def _die_with_parent():
    """A preexec_fn for the tier's child, before pytest starts: the kernel kills it if this process dies, however it
    dies (a SIGKILL runs no handler and no `finally`; the tier, in a session of its own, would keep the GPU). prctl is
    looked up here, in the parent: the child between fork and exec only calls it. None where there is no prctl."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)


def run_tier(out: Path, at: float = math.inf, tests: tuple[str, ...] = ("tests/test_cuda.py",)) -> dict:
    """The CUDA tier (marker cuda of `tests`, in benchmarks/gpu_tier.py's order) as a subprocess, its output streamed
    into out/tier.log (-v: a line per test as it ends); killed at the deadline `at` (time.monotonic()): "timed out",
    counted from the lines it wrote against the cases it collected (out/tier-collected.txt), the rest named in
    `not_run`; otherwise its result read from pytest's JUnit XML (out/tier.xml). SIGTERM or SIGINT (Stopped) while it
    runs: its process group killed, the result "stopped (SIG...)" counted as a timed-out tier is, with `signal`."""
    report, log, collected = out / "tier.xml", out / "tier.log", out / "tier-collected.txt"
    report.unlink(missing_ok=True)
    collected.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "benchmarks.gpu_tier", "-v", "-m", "cuda",
           "-k", TIER_CASES, *tests, f"--junitxml={report}"]
    t0 = time.perf_counter()
    stop = None
    with open(log, "w") as f:
        # a session of its own: the kill reaches whatever the tier started; unbuffered: a killed tier's lines are in
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent(),
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "MLESS_TIER_COLLECTED": str(collected)})
        try:
            rc = proc.wait(timeout=None if math.isinf(at) else max(left(at), 0))
        except subprocess.TimeoutExpired:
            rc = None
        except Stopped as e:
            rc, stop = None, e
        finally:  # timed out, or this process interrupted: the tier does not outlive it
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    result = {"command": " ".join(cmd[2:-1]), "returncode": rc, "wall_s": round(time.perf_counter() - t0, 1),
              "log": str(log)}
    names = collected.read_text().split() if collected.is_file() else None
    result["collected"] = None if names is None else len(names)
    if rc is None:
        seen = TIER_LINE.findall(log.read_text(errors="replace"))
        n = {s: sum(1 for _, x in seen if x == s) for s in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")}
        # -v prints a case's path relative to the working folder, its node id relative to pytest's rootdir
        case = lambda t: Path(t.partition("::")[0]).name + "::" + t.partition("::")[2]  # noqa: E731
        done = {case(t) for t, _ in seen}
        result.update(status=TIMED_OUT if stop is None else f"stopped ({stop.name})", passed=n["PASSED"] + n["XPASS"],
                      failed=n["FAILED"], errors=n["ERROR"], skipped=n["SKIPPED"] + n["XFAIL"],
                      failing=[t.split("::", 1)[1] for t, x in seen if x in ("FAILED", "ERROR")],
                      not_run=None if names is None else [t.split("::", 1)[1] for t in names if case(t) not in done],
                      not_run_why="time limit" if stop is None else f"stopped by {stop.name}")
        if stop is not None:
            result["signal"] = stop.signum  # the caller writes this row, then stops (Stopped again)
        return result
    try:
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        result.update(passed=n["tests"] - n["failures"] - n["errors"] - n["skipped"], failed=n["failures"],
                      errors=n["errors"], skipped=n["skipped"], not_run=[],
                      failing=[f"{c.get('name')}" for c in suite.iter("testcase")
                               if c.find("failure") is not None or c.find("error") is not None])
    except (OSError, ET.ParseError, AttributeError) as e:
        result["read_error"] = f"{report}: {e}"
    result["status"] = "ok" if rc == 0 else "failed"
    return result


def bench_module():
    """benchmarks/bench_gpu_generate.py, loaded by its path (this file may be loaded by path too)."""
    import importlib.util

    if "bench_gpu_generate" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_gpu_generate", ROOT / "benchmarks" / "bench_gpu_generate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["bench_gpu_generate"] = module
    return sys.modules["bench_gpu_generate"]


def run_bench(params, name: str, sizes: dict, at: float = math.inf, project: Path | None = None) -> dict:
    """The generation benchmark on model `name` (bench_gpu_generate.measure) in evaluate's shape (its kept
    generations' file in `project`: the benchmark's batch is its rows); an exception is its status, the deadline `at`
    (checked between its batches) passed is "timed out"."""
    from meaningless_tokens import generations, progress, store

    t0, g0 = time.perf_counter(), graphs()
    try:
        kept = generations.read(project / store.path("generations", name)) if project is not None else None
        like = kept.shape if kept else None
        with progress.deadline(at):
            result = {"status": "ok", **bench_module().measure(params, name, **{
                **sizes, **({"batch_size": like.rows} if like else {})}, like=like)}
        result["graphs"] = graphs() - g0
    except progress.TimedOut:
        result = {"model": name, "status": TIMED_OUT}
    except Exception as e:  # recorded; the run goes on and exits 1 at the end
        traceback.print_exc()
        result = {"model": name, "status": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    for mode in result.get("modes", {}).values():
        for arm in ("engine", "generate"):
            rate = mode[arm]["tokens_per_s"]
            if rate is None or not math.isfinite(rate) or rate <= 0:
                result["status"] = f"no finite tokens/s for {arm}"
    return result


def machine() -> dict:
    import torch
    import transformers

    from meaningless_tokens.store import run_info

    info = run_info()
    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    return {"gpu": props.name if cuda else None, "gpu_memory_gib": round(props.total_memory / 2**30, 1) if cuda else None,
            "device_count": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "python": sys.version.split()[0], "git_commit": info["git_commit"], "git_dirty": info["git_dirty"],
            "cpu_model": info.get("cpu_model")}


# ---- the projection -------------------------------------------------------------------------------

def projection(rows: list[dict], name: str) -> dict:
    """The GPU profile's hours for model `name` at PROBLEMS problems, from this run's tokens per second: every
    generated row runs to its token limit (random weights write no end-of-sequence; a real model stops earlier)."""
    from meaningless_tokens.config import yaml12

    gpu = yaml12.load((ROOT / "profiles" / "gpu.yaml").read_text())
    ev, sw, lk = gpu["evaluate"], gpu["sweep"], gpu["likelihood"]
    by = {r["stage"]: r for r in rows if r["model"] == name and r["status"] == "ok"}

    def rate(stage):
        r = by.get(stage)
        return r["tokens_per_s"] if r and r.get("tokens_per_s") else None

    def per_problem(stage):  # prompt tokens per problem and condition
        r = by.get(stage)
        return r["tokens"] / r["problems"] / r["conditions"] if r and r.get("tokens") and r.get("problems") else None

    n_cond = len(gpu["prompt"]["conditions"])
    sweep_rows = 1 + len(sw["tokens"]) * len([c for c in sw["counts"] if c])
    # evaluate's none rows, and its mless rows where the sweep has mless's span, are kept and reused by the sweep
    # (meaningless_tokens/generations.py): on the problems both run, the sweep generates the other counts only
    mless = gpu["prompt"]["mless"]
    shared = min(sw["accuracy_samples"], PROBLEMS, ev["n_samples"] or PROBLEMS)
    kept = shared * (1 + (mless["token"] in sw["tokens"] and mless["count"] in sw["counts"]))
    if by.get("sweep", {}).get("reused") == 0:  # this run's sweep took none of evaluate's rows: nor would the profile's
        kept = 0
    gen = rate("evaluate_warm") or rate("evaluate")
    work = {  # row -> [(tokens, tokens per second)]
        "evaluate": [(PROBLEMS * n_cond * ev["max_new_tokens"], gen)],
        "sampling": [(PROBLEMS * n_cond * ev["sampling"]["n"] * ev["sampling"]["max_new_tokens"], gen)],
        "sweep accuracy": [((min(sw["accuracy_samples"], PROBLEMS) * sweep_rows - kept) * ev["max_new_tokens"], gen)],
    }
    lik, ext, act = per_problem("likelihood"), per_problem("extract"), per_problem("activations")
    seq = by.get("likelihood", {}).get("sequences")
    lik_seq = by["likelihood"]["tokens"] / seq if seq else None  # the sweep scores solutions: about this long
    # the likelihood stage's conditions are the profile's (the check leaves likelihood.conditions alone)
    n_lik = len(lk["conditions"])
    work["likelihood"] = [(lik and lik * n_lik * PROBLEMS, rate("likelihood")),
                          (lik_seq and min(sw["likelihood_samples"], PROBLEMS) * sweep_rows * lik_seq, rate("likelihood"))]
    work["extraction"] = [(ext and ext * n_cond * PROBLEMS, rate("extract")),
                          (act and act * n_cond * PROBLEMS, rate("activations")),
                          (ext and min(sw["attention_samples"], PROBLEMS) * len(sw["tokens"]) * len(sw["counts"]) * ext,
                           rate("extract"))]
    hours = {}
    for key, parts in work.items():
        ok = all(t is not None and r for t, r in parts)
        hours[key] = round(sum(t / r for t, r in parts) / 3600, 2) if ok else None
    total = None if None in hours.values() else round(sum(hours.values()), 2)
    return {**hours, "total": total}


def plan_targets(result: dict) -> list[dict]:
    """The GPU plan's targets: every model's from its generation benchmark, then the projected hours."""
    rows = [{"model": b["model"], **t} for b in result.get("generate", []) for t in b.get("targets", [])]
    for names, most in PLAN_HOURS:
        label = " and ".join(names) if len(names) < 3 else "all four models"
        totals = [result["projection"].get(n, {}).get("total") for n in names]
        hours = None if None in totals else round(sum(totals), 2)
        if result["tiny"]:
            status = "not measured (tiny widths on the CPU)"
        elif not set(names) <= set(result["models"]):
            status = ("not measured (needs ALL=1: --all-models)" if len(names) > 2 else
                      "not measured (needs both models: --models left one out)")
        else:
            status = "not measured (no projection)" if hours is None else ("met" if hours <= most else "not met")
        rows.append({"model": label, "target": f"projected hours of the GPU profile <= {most}", "measured": hours,
                     "status": status})
    return rows


# ---- output ---------------------------------------------------------------------------------------

def fmt(value, digits=1) -> str:
    """A table cell: n/a, a float to `digits` places, an int with thousands separators (the benchmark's own rule)."""
    return bench_module()._fmt(value, digits)


def step_rows(result: dict) -> list[tuple]:
    """(part, step, expected s, measured s, status) of every step run or not started so far, in order."""
    expected = result.get("expected") or {}
    rows = []
    tier = result.get("tier")
    if tier and tier.get("status") != "not run":
        rows.append(("tier", "tier", expected.get("tier", {}).get("tier"), tier.get("wall_s"), tier["status"]))
    for part in result.get("parts", []):
        name = part["part"]
        if name == "tier":
            continue
        e = expected.get(name, {})
        rows.append((name, "build", e.get("build"), part.get("build_s"), "ok" if "build_s" in part else part["status"]))
        rows += [(name, r["stage"], e.get(r["stage"]), r.get("wall_s"), r["status"])
                 for r in result["stages"] if r["model"] == name]
        rows += [(name, "benchmark", e.get("benchmark"), b.get("wall_s"), b["status"])
                 for b in result["generate"] if b["model"] == name]
        rows.append((name, "(part)", sum(e.values()) if e else None, part.get("wall_s"), part["status"]))
    return rows


def table(result: dict) -> str:
    m, tier, tiny = result["machine"], result["tier"], result["tiny"]
    lines = [f"gpu-check on {m['gpu'] or 'the CPU'}" + (f" ({m['gpu_memory_gib']} GiB)" if m["gpu"] else "")
             + f", torch {m['torch']} (CUDA {m['cuda']}), transformers {m['transformers']}, commit {m['git_commit']}"
             + (" (uncommitted changes)" if m["git_dirty"] else "") + (", tiny widths" if tiny else ", real widths")
             + f"; {result['wall_s']:.0f} s in all", ""]
    if tier is None:  # a run stopped before the tier's end (gpu-check.json is written from the start)
        lines.append("CUDA tier: running")
    elif tier.get("status") == "not run":
        lines.append(f"CUDA tier: {tier['reason']}")
    else:
        lines.append(f"CUDA tier: {tier['status']}: {fmt(tier.get('passed'))} passed, {fmt(tier.get('failed'))} failed, "
                     f"{fmt(tier.get('errors'))} errors, {fmt(tier.get('skipped'))} skipped"
                     + (f", {len(tier['not_run'])} not run" if tier.get("not_run") else "")
                     + (f" of {tier['collected']} collected" if tier.get("collected") is not None else "")
                     + f" in {tier['wall_s']} s"
                     + (f" ({', '.join(tier['failing'])})" if tier.get("failing") else "")
                     + (f"; its output: {tier['log']}" if tier.get("log") else ""))
    if tier and tier.get("not_run"):
        lines.append(f"CUDA tier, not run ({tier['not_run_why']}): {', '.join(tier['not_run'])}")
    steps = step_rows(result)
    if steps:
        lines += ["", "Steps, expected seconds (ESTIMATES: from the GPU run on record; n/a in the tiny mode) beside "
                  "measured (retune LIMITS from this table):", "",
                  "| part | step | expected s | measured s | status |", "|---|---|---:|---:|---|"]
        lines += [f"| {part} | {step} | {fmt(e)} | {fmt(m)} | {status} |" for part, step, e, m, status in steps]
    if result.get("parts"):
        limits = result["limits"]
        starts_ = ", ".join(f"{k} {fmt(v)}" for k, v in limits["min_start"].items())
        lines += ["", f"Parts (time limits checked between batches; total {fmt(limits['total'])} s, shared among the "
                  f"parts still to run in proportion to their limits; a step starts with at least this many seconds "
                  f"of its part left, by kind: {starts_}):", "",
                  "| part | limit s | build s | wall s | status |", "|---|---:|---:|---:|---|"]
        lines += [f"| {p['part']} | {fmt(p['limit_s'])} | {fmt(p.get('build_s'))} | {fmt(p['wall_s'])} | {p['status']} |"
                  for p in result["parts"]]
    lines += ["", "| model | stage | status | wall s | work s | peak CUDA GiB | syncs | syncs per unit | tokens | tokens/s |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["stages"]:
        per = "n/a" if r.get("syncs_per_unit") is None else f"{r['syncs_per_unit']} per {r['syncs_unit']}"
        rate = fmt(r.get("tokens_per_s")) + (" (wall)" if r.get("tokens_per_s_over") == "wall" else "")
        kind = f" {r['tokens_kind']}" if r.get("tokens") else ""
        lines.append(f"| {r['model']} | {r['stage']} | {r['status']} | {fmt(r.get('wall_s'))} | {fmt(r.get('work_s'))} | "
                     f"{fmt(r.get('peak_cuda_gib'), 2)} | {fmt(r.get('syncs'))} | {per} | {fmt(r.get('tokens'))}{kind} | "
                     f"{rate} |")
    compiled = [shapes_line(result, name) for name in result["models"]]
    if any(compiled):
        lines += ["", "The decode step's shape and the dynamo graphs compiled per model (one compile: evaluate's; "
                  "evaluate_warm, the sweep and the benchmark's engine share its model, hook and cache):", ""]
        lines += [f"- {line}" for line in compiled if line]
    if result.get("generate"):
        lines += ["", "Generation (benchmarks/bench_gpu_generate.py): the evaluate engine vs model.generate with its "
                  "default cache, same prompts and batch; steady tokens/s, the warm-up (first batch's excess) apart:", "",
                  "| model | mode | status | batch | new tokens | engine tokens/s | generate tokens/s | ratio | "
                  "engine warm-up s | generate warm-up s | rows at limit | rows differ |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for b in result["generate"]:
            for mode, m in (b.get("modes") or {"n/a": None}).items():
                e, g = (m["engine"], m["generate"]) if m else ({}, {})
                lines.append(f"| {b['model']} | {mode} | {b['status']} | {fmt(b.get('batch_size'))} | "
                             f"{fmt(b.get('new_tokens'))} | {fmt(e.get('tokens_per_s'))} | {fmt(g.get('tokens_per_s'))} | "
                             f"{fmt(m and m['ratio'], 2)} | {fmt(e.get('warmup_s'), 2)} | {fmt(g.get('warmup_s'), 2)} | "
                             + (f"{e['rows_at_limit']}/{e['rows']}, {g['rows_at_limit']}/{g['rows']} | "
                                f"{m['rows_differ']}/{m['rows_compared']} |" if m else "n/a | n/a |"))
    lines += ["", f"Projected hours of the GPU profile at {PROBLEMS} problems from these rates (every generated row to "
              "its token limit: random weights write no end-of-sequence; a real model stops earlier):", "",
              "| model | evaluate | sampling | sweep accuracy | likelihood | extraction | total |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, p in result["projection"].items():
        lines.append(f"| {name} | " + " | ".join(fmt(p[k], 2) for k in
                                                  ("evaluate", "sampling", "sweep accuracy", "likelihood",
                                                   "extraction", "total")) + " |")
    lines.append(f"| all models run | | | | | | {fmt(result['projected_hours'], 2)} |")
    if result.get("targets"):
        lines += ["", "The GPU plan's targets (one H100 or H200, random weights, batch 64):", "",
                  "| model | target | measured | status |", "|---|---|---:|---|"]
        for t in result["targets"]:
            v = t["measured"]
            shown = f"{v:.3g}" if isinstance(v, float) and abs(v) < 10 else fmt(v)
            lines.append(f"| {t['model']} | {t['target']} | {shown} | {t['status']} |")
    notes = [f"- {r['model']} {r['stage']}: {r['note']}" for r in result["stages"] if r.get("note")]
    if notes:
        lines += ["", *notes]
    if result.get("stopped"):
        lines += ["", f"result: stopped by {result['stopped']} (the rows above finished before it)"]
    elif not result["finished"]:  # the file as a killed run leaves it
        lines += ["", "result: incomplete (the run was stopped, or is still running)"]
    else:
        lines += ["", f"result: {'ok' if result['ok'] else 'FAILED'}"]
    return "\n".join(lines)


def parse_limits(items: list[str], total: str | None, parts: list[str], tiny: bool) -> tuple[dict, float]:
    """The parts' time limits in seconds (`--limit PART=SECONDS` over LIMITS; the tiny mode has none but those
    given: a CPU's seconds are no GPU's) and the total (`--total`; default: the parts' limits added up, none where a
    part has none). Bad input: ValueError, one line."""
    known = ("tier",) + DEFAULT_MODELS + MORE_MODELS
    limits = {p: (None if tiny else LIMITS[p]) for p in known}
    for item in items:
        part, sep, value = item.partition("=")
        seconds = _seconds(value)
        if not sep or part not in known or seconds is None:
            raise ValueError(f"--limit {item}: expected PART=SECONDS with PART one of {', '.join(known)} and "
                             f"SECONDS > 0")
        limits[part] = seconds
    limits = {p: limits[p] for p in parts}  # a limit of a part this run leaves out is moot
    if total is None:
        return limits, (math.inf if None in limits.values() else sum(limits.values()))
    seconds = _seconds(total)
    if seconds is None:
        raise ValueError(f"--total {total}: expected SECONDS > 0")
    return limits, seconds


def parse_min_start(items: list[str]) -> dict:
    """MIN_START with `--min-start SECONDS` (every kind) or `--min-start KIND=SECONDS` over it, in order. Bad input:
    ValueError, one line."""
    out = dict(MIN_START)
    for item in items:
        kind, sep, value = item.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = None
        if seconds is None or not math.isfinite(seconds) or seconds < 0 or (sep and kind not in MIN_START):
            raise ValueError(f"--min-start {item}: expected SECONDS >= 0 or KIND=SECONDS with KIND one of "
                             f"{', '.join(MIN_START)}")
        out.update({kind: seconds} if sep else dict.fromkeys(out, seconds))
    return out


def share(now: float, end: float, limits: dict, part: str, remaining: list[str]) -> float:
    """Part `part`'s deadline: the time left to `end` shared among the parts still to run (`remaining`, `part` among
    them) in proportion to their limits: an earlier part's overrun is borne by all later parts alike, and time an
    earlier part left over goes to them alike. A part without a limit (the tiny mode's) runs to `end`; with a part
    without one still to come, each part gets its own limit."""
    if limits[part] is None:
        return end
    if math.isinf(end) or any(limits[p] is None for p in remaining):
        return min(end, now + limits[part])
    return now + max(end - now, 0.0) * limits[part] / sum(limits[p] for p in remaining)


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def save(out: Path, result: dict, started: float) -> None:
    """gpu-check.json and gpu-check.md in `out`, each replaced whole (store.atomic_path: a temporary file, then a
    rename): a run stopped at any moment leaves the last complete version of both."""
    from meaningless_tokens.store import atomic_path

    result["wall_s"] = round(time.monotonic() - started, 1)
    result["targets"] = plan_targets(result)
    for name, text in (("gpu-check.json", json.dumps(result, indent=2) + "\n"), ("gpu-check.md", table(result) + "\n")):
        with atomic_path(out / name) as tmp:
            tmp.write_text(text)


def left(at: float) -> float:
    """Seconds to the deadline `at` (time.monotonic())."""
    return at - time.monotonic()


def starts(at: float, min_start: dict, step: str) -> bool:
    """Whether step `step` may start with its part's deadline at `at`: MIN_START of its kind left."""
    return left(at) >= min_start[KIND.get(step, "step")]


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived (`on_signal`): raised in the main thread wherever it is, so that the step in flight
    unwinds (a stage writes its outputs at its end: nothing half-written) and the run writes what finished."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


def on_signal(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGINT):  # one stop: a second signal must not cut the final write
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def run_model_part(params, project: Path, work: Path, name: str, at: float, min_start: dict, bench: dict | None,
                   tiny: bool, record) -> dict:
    """Model `name`'s part: its build, its stages in order, then its generation benchmark (`bench`; None: none),
    each inside the part's deadline `at` and started only with MIN_START of its kind left (`min_start`);
    `record(key, row)` keeps each row as it finishes. A stage that times out ends the part: the stages after it would
    need what it did not write (a stage writes its outputs at its end). Returns the part's row."""
    import torch

    cuda = not tiny
    t0 = time.monotonic()
    part, rows = {"part": name}, []
    stopped = None  # the status of every step not run from here on
    if not starts(at, min_start, "build"):
        stopped = NOT_STARTED
    else:
        b0 = time.perf_counter()
        try:
            build_models([name], work, tiny, "cpu" if tiny else "cuda")
            part["build_s"] = round(time.perf_counter() - b0, 1)
        except Exception as e:  # every stage would fail on it: none runs
            traceback.print_exc()
            stopped = f"not run: the model's build failed ({type(e).__name__}: {e}".splitlines()[0][:300] + ")"

    def step(key: str, label: str, run) -> None:
        nonlocal stopped
        if stopped is None and not starts(at, min_start, label):
            stopped = NOT_STARTED
        if stopped is not None:
            row = {"model": name, **({"stage": label} if key == "stages" else {}), "status": stopped}
        else:
            row = run()
            print(f"gpu-check: {name} {label}: {row['status']} in {row['wall_s']} s")
            if row["status"] == TIMED_OUT:
                stopped = NOT_STARTED
        rows.append(row)
        record(key, row)

    for stage in STAGES:
        step("stages", stage, lambda: run_stage(params, project, stage, name, cuda, at))
    if bench is not None:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        step("generate", "benchmark", lambda: run_bench(params, name, bench, at, project))
    statuses = {r["status"] for r in rows}
    part["status"] = (TIMED_OUT if statuses & {TIMED_OUT, NOT_STARTED} else "ok" if statuses == {"ok"} else "failed")
    part["wall_s"] = round(time.monotonic() - t0, 1)
    return part


def shapes_line(result: dict, name: str) -> str | None:
    """Model `name`'s shapes, graphs compiled and the sweep's taken rows, as one line; None before its evaluate row."""
    rows = {r["stage"]: r for r in result["stages"] if r["model"] == name and "graphs" in r}
    bench = next((b for b in result["generate"] if b["model"] == name and "graphs" in b), None)
    if "evaluate" not in rows:
        return None

    def shape(x):
        s = x.get("shape")
        return f"{s['rows']} x {s['width']} (cache {s['cache_len']})" if s else "none (per-batch)"

    parts = [f"{stage} {shape(r)}, {r['graphs']} graph{'s' * (r['graphs'] != 1)}" for stage, r in rows.items()
             if stage in ("evaluate", "evaluate_warm", "sweep")]
    if bench:
        parts.append(f"benchmark {shape(bench)}, {bench['graphs']} graph{'s' * (bench['graphs'] != 1)}")
    total = sum(r["graphs"] for r in rows.values()) + (bench["graphs"] if bench else 0)
    sweep = rows.get("sweep")
    took = (f"; the sweep took {sweep['reused']} of evaluate's rows and generated {sweep['generated']}"
            if sweep and "reused" in sweep else "")
    return f"{name}: {'; '.join(parts)}; {total} in all{took}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all-models", action="store_true", help="add Llama-3.1-8B-Instruct and Gemma-3-4b-it")
    ap.add_argument("--tiny", action="store_true", help="tiny widths on the CPU (the test's mode)")
    ap.add_argument("--models", help="comma-separated model names instead (of "
                    f"{', '.join(DEFAULT_MODELS + MORE_MODELS)})")
    ap.add_argument("--no-tier", action="store_true", help="skip the CUDA tier's subprocess")
    ap.add_argument("--no-bench", action="store_true", help="skip the generation benchmark")
    ap.add_argument("--bench", action="append", default=[], metavar="KEY=N",
                    help="a size of the generation benchmark over the check's (batch_size, new_tokens, batches)")
    ap.add_argument("--out", type=Path, help="the folder of the results: gpu-check.json, gpu-check.md, tier.log "
                    "(default: <tmp>/gpu-check, tiny: <tmp>/gpu-check-tiny)")
    ap.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS",
                    help="a part's time limit (tier or a model), over the defaults: "
                         + ", ".join(f"{k}={v}" for k, v in LIMITS.items()) + " (tiny: none)")
    ap.add_argument("--total", metavar="SECONDS", help="the whole run's time limit (default: the parts' limits "
                    "added up)")
    ap.add_argument("--min-start", action="append", default=[], metavar="[KIND=]SECONDS",
                    help="a step starts only with this much of its part left, by its kind (default "
                         + ", ".join(f"{k}={v}" for k, v in MIN_START.items()) + "); SECONDS alone: every kind")
    ap.add_argument("--tier-tests", action="append", metavar="PATH", help=argparse.SUPPRESS)  # the tests' fake tier
    ap.add_argument("--work", type=Path, help="folder of the saved models and the run's project "
                    "(default: <tmp>/meaningless-tokens-gpu-check[-tiny])")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a params value over the check's (YAML 1.2, as DVC reads it), e.g. --set sweep.layer=2")
    args = ap.parse_args(argv)
    started = time.monotonic()

    def bad(line: str) -> int:
        print(f"gpu-check: {line}", file=sys.stderr)
        return 2

    names = DEFAULT_MODELS + (MORE_MODELS if args.all_models else ())
    if args.models:
        names = tuple(args.models.split(","))
        unknown = sorted(set(names) - set(DEFAULT_MODELS + MORE_MODELS))
        if unknown:
            return bad(f"--models: unknown {unknown}; known: {', '.join(DEFAULT_MODELS + MORE_MODELS)}")
    bench = dict(TINY_BENCH if args.tiny else BENCH)
    for item in args.bench:
        key, _, value = item.partition("=")
        if key not in bench or not value.isdigit() or int(value) < 1:
            return bad(f"--bench {item}: expected KEY=N with KEY one of {', '.join(bench)} and N >= 1")
        bench[key] = int(value)
    parts = ([] if args.no_tier else ["tier"]) + list(names)
    try:
        limits, total = parse_limits(args.limit, args.total, parts, args.tiny)
    except ValueError as e:
        return bad(str(e))
    try:
        min_start = parse_min_start(args.min_start)
    except ValueError as e:
        return bad(str(e))
    # before anything the check needs is imported: a module missing on the GPU machine is one line, not a traceback
    from benchmarks import gpu_preflight

    missing = gpu_preflight.problems(gpu_preflight.third_party(), ROOT / ".whl")
    if missing:
        print("\n".join(f"gpu-check: preflight: {line}" for line in missing), file=sys.stderr)
        return 2
    import torch

    if args.tiny:
        tiny_compile()
    suffix = "-tiny" if args.tiny else ""
    work = args.work or Path(tempfile.gettempdir()) / f"meaningless-tokens-gpu-check{suffix}"
    out = args.out or Path(tempfile.gettempdir()) / f"gpu-check{suffix}"
    cuda = not args.tiny
    if cuda and not torch.cuda.is_available():
        return bad("torch sees no CUDA device; run it on a GPU machine, or --tiny for the CPU")
    end = started + total
    result = {"tiny": args.tiny, "machine": machine(), "models": list(names), "out": str(out),
              "sizes": {**SIZES, **({k: {**SIZES.get(k, {}), **v} for k, v in TINY_SIZES.items()} if args.tiny else {})},
              "limits": {"parts": limits, "total": None if math.isinf(total) else total, "min_start": min_start},
              "expected": None if args.tiny else {p: ESTIMATES[p] for p in parts},
              "syncs_counted": None if args.tiny else "inside each stage's run(), the model load included",
              "tier": {"status": "not run", "reason": NOT_RUN} if args.no_tier else None, "parts": [], "stages": [],
              "generate": [], "bench_sizes": None if args.no_bench else bench,
              "projection": {}, "projected_hours": None, "targets": [], "finished": False, "stopped": None,
              "ok": False, "wall_s": 0.0}
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("gpu-check.json", "gpu-check.md", "tier.log", "tier.xml", "tier-collected.txt"):
        (out / stale).unlink(missing_ok=True)  # nothing of an earlier run is read as this one's
    save(out, result, started)
    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    flight = {"part": None}  # the part in flight
    try:
        return run_parts(args, parts, names, limits, min_start, end, bench, work, out, result, started,
                         lambda part: flight.update(part=part))
    except Stopped as e:  # the step in flight has unwound; what finished is in `result`
        current = flight["part"]
        if current and current not in [p["part"] for p in result["parts"]]:
            result["parts"].append({"part": current, "limit_s": limits[current], "status": f"stopped ({e.name})"})
        result["stopped"] = e.name
        save(out, result, started)
        print(table(result))
        print(f"gpu-check: stopped by {e.name}; what finished is in {out / 'gpu-check.json'}, {out / 'gpu-check.md'}",
              file=sys.stderr)
        return 128 + e.signum
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def run_parts(args, parts, names, limits, min_start, end, bench, work, out, result, started, enter) -> int:
    """main's parts in order (the tier, then each model's); `enter(part)` names the part in flight."""
    from meaningless_tokens.config import yaml12

    def deadline(part: str) -> float:
        return share(time.monotonic(), end, limits, part, parts[parts.index(part):])

    def finish() -> int:
        totals = [p["total"] for p in result["projection"].values()]
        result["projected_hours"] = None if not totals or None in totals else round(sum(totals), 2)
        result["finished"] = True
        # ok only when every part ran through: a timed-out part is not (its rows are kept and say so)
        result["ok"] = ("error" not in result and result["tier"]["status"] in ("ok", "not run")
                        and len(result["parts"]) == len(parts) and all(p["status"] == "ok" for p in result["parts"]))
        save(out, result, started)
        print(table(result))
        print(f"gpu-check: {out / 'gpu-check.json'}, {out / 'gpu-check.md'}")
        return 0 if result["ok"] else 1

    work.mkdir(parents=True, exist_ok=True)
    if not args.no_tier:
        enter("tier")
        t0, at = time.monotonic(), deadline("tier")
        result["tier"] = (run_tier(out, at, *([tuple(args.tier_tests)] if args.tier_tests else []))
                          if starts(at, min_start, "tier") else {"status": NOT_STARTED, "wall_s": 0.0})
        print(f"gpu-check: CUDA tier: {result['tier']['status']} in {result['tier']['wall_s']} s ({out / 'tier.log'})")
        result["parts"].append({"part": "tier", "limit_s": limits["tier"], "status": result["tier"]["status"],
                                "wall_s": round(time.monotonic() - t0, 1)})
        save(out, result, started)
        if "signal" in result["tier"]:  # stopped while the tier ran: its row is written, the run ends here
            raise Stopped(result["tier"].pop("signal"))
    try:
        from meaningless_tokens.config import load_params

        dirs = {n: work / "models" / n for n in names}
        raw = check_params(dirs, args.tiny, args.set)
        for d in dirs.values():  # the params name them; each part builds its model there
            d.mkdir(parents=True, exist_ok=True)
        project = work / "project"
        if project.exists():  # a stage must never read an artifact of an earlier check
            import shutil
            shutil.rmtree(project)
        project.mkdir()
        (project / "params.yaml").write_text(yaml12.dump(raw))
        params = load_params(project / "params.yaml")
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        traceback.print_exc()
        return finish()

    def record(key: str, row: dict) -> None:
        result[key].append(row)
        save(out, result, started)  # what is measured stays measured, whenever the run stops

    from meaningless_tokens.engines import transformers as engine

    before = os.environ.get("MLESS_CACHE"), os.environ.get("MLESS_REUSE")
    os.environ["MLESS_CACHE"] = str(work / "cache")  # the model cache of the check's own
    os.environ["MLESS_REUSE"] = "1"  # the sweep takes evaluate's rows, as the GPU profile's does
    try:
        for name in names:
            enter(name)
            part = run_model_part(params, project, work, name, deadline(name), min_start,
                                  None if args.no_bench else bench, args.tiny, record)
            engine.release()  # the model's compiled step and weights go before the next model's
            result["parts"].append({"part": name, "limit_s": limits[name], **part})
            result["projection"][name] = projection(result["stages"], name)
            save(out, result, started)
    finally:
        engine.release()
        for var, value in zip(("MLESS_CACHE", "MLESS_REUSE"), before):
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
    return finish()


if __name__ == "__main__":
    sys.exit(main())
