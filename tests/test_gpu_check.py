"""`make gpu-check` in its tiny mode (benchmarks/gpu_check.py --tiny): every model stage of the default models on
tiny widths of the paper models' families, on the CPU, through the same code as on a GPU, and the generation
benchmark on each; the JSON's structure, the printed table, the sidecars' token rates, the projection's arithmetic,
the GPU plan's targets and a non-zero exit when a stage fails; the out folder, written as each row finishes; the
parts' time limits (a stage past its deadline, a part that times out and the run going on, a run killed midway);
the tier's streamed log and its time limit."""

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from tests.conftest import ROOT

# every model stage of two models, twice (a minute of CPU); one worker's (an xdist group): the tiny run is shared
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gpu-check")]

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def command(tmp, *args):
    return [sys.executable, str(SCRIPT), "--tiny", "--no-tier", "--work", str(tmp / "work"), "--out", str(tmp / "out"),
            *args]


def run(tmp, *args):
    """The script as `make gpu-check TINY=1` runs it, in a process of its own; (exit status, stdout, its JSON)."""
    out = tmp / "out" / "gpu-check.json"
    proc = subprocess.run(command(tmp, *args), cwd=ROOT, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr, json.loads(out.read_text()) if out.exists() else None


def built_models(tiny_dir, tmp):
    """A work folder holding the tiny run's built models (no build: the part's seconds are its stages')."""
    shutil.copytree(tiny_dir / "work" / "models", tmp / "work" / "models")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu-check")


@pytest.fixture(scope="module")
def tiny_run(tiny_dir):
    return run(tiny_dir)


def test_every_stage_runs_for_every_model_with_finite_numbers(tiny_run):
    rc, out, result = tiny_run
    assert rc == 0, out[-3000:]
    assert result["ok"] is True and result["tiny"] is True
    assert result["models"] == list(gpu_check.DEFAULT_MODELS)
    m = result["machine"]
    assert m["gpu"] is None and m["torch"] and m["transformers"] and m["git_commit"]
    assert result["tier"] == {"status": "not run", "reason": gpu_check.NOT_RUN}
    assert result["finished"] is True
    assert result["limits"] == {"parts": {n: None for n in gpu_check.DEFAULT_MODELS}, "total": None,
                                "min_start": gpu_check.MIN_START}  # tiny: no limits but those given
    assert [(p["part"], p["status"]) for p in result["parts"]] == [(n, "ok") for n in gpu_check.DEFAULT_MODELS]
    assert result["syncs_counted"] is None  # the CPU: no host-device syncs to count
    rows = {(r["model"], r["stage"]): r for r in result["stages"]}
    assert len(rows) == len(result["stages"])
    assert sorted(rows) == sorted((n, s) for n in gpu_check.DEFAULT_MODELS for s in gpu_check.STAGES)
    for (name, stage), r in rows.items():
        assert r["status"] == "ok", (name, stage, r["status"])
        assert r["syncs"] is None and r["syncs_per_unit"] is None and r["peak_cuda_gib"] is None
        assert math.isfinite(r["wall_s"]) and r["wall_s"] >= 0
        if stage in gpu_check.WORK_KEYS or stage == "evaluate_warm":
            assert math.isfinite(r["work_s"]) and 0 < r["work_s"] <= r["wall_s"], (name, stage)
        if stage in ("extract", "activations", "likelihood", "evaluate", "evaluate_warm", "sweep", "arm_tuning"):
            assert r["tokens"] > 0 and math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0, (name, stage)
    ev = rows[(gpu_check.DEFAULT_MODELS[0], "evaluate")]
    sizes = result["sizes"]["evaluate"]
    limit = sizes["n_samples"] * 4 * (sizes["max_new_tokens"] + sizes["sampling"]["n"] * sizes["sampling"]["max_new_tokens"])
    assert 0 < ev["tokens"] <= limit  # 4 conditions: the check adds arm
    for name in gpu_check.DEFAULT_MODELS:
        p = result["projection"][name]
        assert set(p) == {"evaluate", "sampling", "sweep accuracy", "likelihood", "extraction", "total"}
        assert all(math.isfinite(v) and v > 0 for v in p.values()), p
        assert p["total"] == pytest.approx(sum(v for k, v in p.items() if k != "total"), abs=0.02)
    assert result["projected_hours"] == pytest.approx(sum(p["total"] for p in result["projection"].values()), abs=0.01)


def test_extract_and_likelihood_rates_are_their_sidecars(tiny_run, tiny_dir):
    from meaningless_tokens import store

    rc, out, result = tiny_run
    assert rc == 0, out[-3000:]
    project = tiny_dir / "work" / "project"
    rows = {(r["model"], r["stage"]): r for r in result["stages"]}
    for name in gpu_check.DEFAULT_MODELS:
        timing = {s: json.loads((project / store.path(f"timing/{s}", name)).read_text())
                  for s in ("extract", "likelihood")}
        with h5py.File(project / store.path("attention", name), "r") as f:  # the prompts' tokens, as stored
            stored = sum(int(f[c]["offsets"][-1]) for c in ("none", "mless", "mful"))
        assert timing["extract"]["tokens"] == stored
        for stage, seconds in (("extract", "seconds"), ("likelihood", "scoring_seconds")):
            t, r = timing[stage], rows[(name, stage)]
            assert t["tokens_per_second"] == pytest.approx(t["tokens"] / t[seconds], rel=0.05, abs=1.0)
            assert r["tokens"] == t["tokens"] and r["tokens_per_s"] == t["tokens_per_second"], (name, stage)
            assert f"| {name} | {stage} | ok | {r['wall_s']:,.1f} |" in out
            assert f" | {r['tokens']:,} prompt | {r['tokens_per_s']:,.1f} |" in out, (name, stage)


def test_the_generation_benchmark_runs_on_every_model(tiny_run):
    rc, out, result = tiny_run
    assert result["bench_sizes"] == gpu_check.TINY_BENCH
    # plain `generate` runs uncompiled: the check's benchmark is one batch per mode of a few tokens
    assert gpu_check.BENCH["batches"] == 1 and gpu_check.BENCH["new_tokens"] <= 32
    assert [b["model"] for b in result["generate"]] == list(gpu_check.DEFAULT_MODELS)
    rows = gpu_check.TINY_BENCH["batch_size"] * gpu_check.TINY_BENCH["batches"]
    for b in result["generate"]:
        assert b["status"] == "ok" and b["device"] == "cpu" and b["dtype"] == "bfloat16", b.get("status")
        assert (b["batch_size"], b["new_tokens"]) == (gpu_check.TINY_BENCH["batch_size"], gpu_check.TINY_BENCH["new_tokens"])
        for mode in ("greedy", "sampled"):
            m = b["modes"][mode]
            assert m["engine"]["rows"] == m["generate"]["rows"] == m["rows_compared"] == rows
            assert all(math.isfinite(m[a]["tokens_per_s"]) and m[a]["tokens_per_s"] > 0 for a in ("engine", "generate"))
            e, g = m["engine"], m["generate"]
            assert (f"| {b['model']} | {mode} | ok | {b['batch_size']} | {b['new_tokens']} | {e['tokens_per_s']:,.1f} | "
                    f"{g['tokens_per_s']:,.1f} | {m['ratio']:,.2f} |") in out
            assert (f" | {e['rows_at_limit']}/{e['rows']}, {g['rows_at_limit']}/{g['rows']} | "
                    f"{m['rows_differ']}/{m['rows_compared']} |") in out
    targets = result["targets"]
    assert len(targets) == 3 * len(gpu_check.DEFAULT_MODELS) + len(gpu_check.PLAN_HOURS)
    assert all(t["status"].startswith("not measured") for t in targets), targets
    assert [t["status"] for t in targets[-2:]] == ["not measured (tiny widths on the CPU)"] * 2
    assert "| model | target | measured | status |" in out
    for t in targets:
        assert f"| {t['model']} | {t['target']} | " in out and f" | {t['status']} |" in out


def test_the_projected_hours_are_judged_against_the_plan():
    def judged(models, totals, tiny=False):
        result = {"tiny": tiny, "models": list(models), "generate": [],
                  "projection": {n: {"total": t} for n, t in zip(models, totals)}}
        return [(t["measured"], t["status"]) for t in gpu_check.plan_targets(result)]

    two, four = gpu_check.DEFAULT_MODELS, gpu_check.DEFAULT_MODELS + gpu_check.MORE_MODELS
    assert judged(two, [0.5, 1.0]) == [(1.5, "met"), (None, "not measured (needs ALL=1: --all-models)")]
    assert judged(two, [0.5, 1.01]) == [(1.51, "not met"), (None, "not measured (needs ALL=1: --all-models)")]
    assert judged(four, [0.5, 0.5, 1.0, 1.0]) == [(1.0, "met"), (3.0, "met")]
    assert judged(four, [0.5, 0.5, 1.0, 1.1]) == [(1.0, "met"), (3.1, "not met")]
    assert judged(four, [0.5, None, 1.0, 1.0]) == [(None, "not measured (no projection)")] * 2
    assert judged(two[:1], [0.5]) == [(None, "not measured (needs both models: --models left one out)"),
                                      (None, "not measured (needs ALL=1: --all-models)")]
    assert [s for _, s in judged(two, [0.5, 1.0], tiny=True)] == ["not measured (tiny widths on the CPU)"] * 2


def test_a_failing_benchmark_is_its_status():
    b = gpu_check.run_bench(None, "m", dict(gpu_check.TINY_BENCH))
    assert b["model"] == "m" and b["status"].startswith("AttributeError: ") and "modes" not in b


def test_a_bad_bench_size_is_one_line(tmp_path):
    rc, out, result = run(tmp_path, "--bench", "batches=0")
    assert rc == 2 and result is None
    assert "--bench batches=0: expected KEY=N with KEY one of batch_size, new_tokens, batches and N >= 1" in out


def test_the_table_is_printed(tiny_run):
    rc, out, result = tiny_run
    assert "CUDA tier: " + gpu_check.NOT_RUN in out
    assert "| model | stage | status | wall s | work s | peak CUDA GiB | syncs | syncs per unit | tokens | tokens/s |" in out
    for r in result["stages"]:
        assert f"| {r['model']} | {r['stage']} | ok | {r['wall_s']:,.1f} |" in out, (r["model"], r["stage"])
    for name, p in result["projection"].items():
        assert f"| {name} | {p['evaluate']:,.2f} |" in out
    assert "\nresult: ok\n" in out


def test_a_failing_stage_exits_nonzero_after_writing_what_it_measured(tmp_path):
    # a dataset file that is not the one named: every stage that reads it raises, naming the key
    rc, out, result = run(tmp_path, "--models", "qwen2_5-math-1_5b", "--set", "dataset.sha256='" + "0" * 64 + "'")
    assert rc == 1, out[-3000:]
    assert result["ok"] is False and "result: FAILED" in out
    status = {r["stage"]: r["status"] for r in result["stages"]}
    assert list(status) == list(gpu_check.STAGES)  # the stages after the failure still ran
    assert status["prepare"] == "ok"
    assert "sha256" in status["extract"], status["extract"]
    assert all(s != "ok" for k, s in status.items() if k not in ("prepare",)), status
    assert f"| qwen2_5-math-1_5b | extract | {status['extract']}" in out


def test_a_bad_override_is_one_line(tmp_path):
    rc, out, result = run(tmp_path, "--set", "sweep.no_such_key=1")
    assert rc == 1 and result["ok"] is False and not result["stages"]
    assert "--set sweep.no_such_key=1: expected KEY=VALUE with KEY a params key" in out


def test_a_non_finite_value_in_an_artifact_is_found(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["none/sum"] = np.array([1.0, np.nan])
        f["mless/sum"] = np.array([1.0, 2.0])
        f["none/ids"] = np.array([1, 2])
        f["mful/mean"] = np.array([np.inf], dtype=np.float32)
    assert sorted(gpu_check.nonfinite(path)) == ["mful/mean", "none/sum"]


def test_the_projection_is_the_gpu_profiles_tokens_over_the_measured_rates():
    gpu = yaml.safe_load((ROOT / "profiles/gpu.yaml").read_text())
    ev, sw = gpu["evaluate"], gpu["sweep"]
    rows = [{"model": "m", "stage": "evaluate", "status": "ok", "tokens_per_s": 50.0},
            {"model": "m", "stage": "evaluate_warm", "status": "ok", "tokens_per_s": 100.0},
            {"model": "m", "stage": "extract", "status": "ok", "tokens": 1200, "problems": 4, "conditions": 3,
             "tokens_per_s": 1000.0},
            {"model": "m", "stage": "activations", "status": "ok", "tokens": 1600, "problems": 4, "conditions": 4,
             "tokens_per_s": 500.0},
            {"model": "m", "stage": "likelihood", "status": "ok", "tokens": 3200, "problems": 4, "conditions": 4,
             "sequences": 32, "tokens_per_s": 200.0}]
    p = gpu_check.projection(rows, "m")
    assert p["evaluate"] == round(500 * 3 * ev["max_new_tokens"] / 100 / 3600, 2)  # the warm rate, 3 conditions
    assert p["sampling"] == round(500 * 3 * ev["sampling"]["n"] * ev["sampling"]["max_new_tokens"] / 100 / 3600, 2)
    # 6 prompts a problem, of which count 0 (= none) and count 55 (= mless) are evaluate's rows, kept and reused
    assert p["sweep accuracy"] == round(sw["accuracy_samples"] * (6 - 2) * ev["max_new_tokens"] / 100 / 3600, 2)
    # 200 tokens per problem and condition, 4 conditions; the sweep's 500 x 6 solutions of 100 tokens
    assert p["likelihood"] == round((500 * 4 * 200 + sw["likelihood_samples"] * 6 * 100) / 200 / 3600, 2)
    # 100 tokens a prompt: extract 500 x 3 and the sweep's 100 x 6 prompts at 1000/s, activations 500 x 3 at 500/s
    assert p["extraction"] == round((500 * 3 * 100 + sw["attention_samples"] * 6 * 100) / 1000 / 3600
                                    + 500 * 3 * 100 / 500 / 3600, 2)
    assert p["total"] == round(sum(v for k, v in p.items() if k != "total"), 2)
    # a sweep that took none of evaluate's rows (their key not its own): the profile's sweep generates every row
    taken = gpu_check.projection(rows + [{"model": "m", "stage": "sweep", "status": "ok", "reused": 0}], "m")
    assert taken["sweep accuracy"] == round(sw["accuracy_samples"] * 6 * ev["max_new_tokens"] / 100 / 3600, 2)
    assert gpu_check.projection(rows + [{"model": "m", "stage": "sweep", "status": "ok", "reused": 4}], "m") == p
    del rows[2]  # extract failed: no rate, no projection of what needs it
    assert gpu_check.projection(rows, "m")["extraction"] is None and gpu_check.projection(rows, "m")["total"] is None


def test_the_out_folder_holds_the_json_and_the_table(tiny_run, tiny_dir):
    rc, out, result = tiny_run
    folder = tiny_dir / "out"
    assert result["out"] == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["gpu-check.json", "gpu-check.md"]  # no tier: no tier.log
    table = (folder / "gpu-check.md").read_text()
    assert table == gpu_check.table(result) + "\n" and table in out
    assert "| part | limit s | build s | wall s | status |" in table
    for p in result["parts"]:
        assert f"| {p['part']} | n/a | {p['build_s']:,.1f} | {p['wall_s']:,.1f} | ok |" in table


def test_a_bad_limit_is_one_line(tmp_path):
    for args, line in [(["--limit", "qwen2_5-math-1_5b=0"], "--limit qwen2_5-math-1_5b=0: expected PART=SECONDS with "
                        "PART one of tier, qwen2_5-math-1_5b, "),
                       (["--limit", "tier"], "--limit tier: expected PART=SECONDS"),
                       (["--limit", "qwen2_5-math-8b=60"], "--limit qwen2_5-math-8b=60: expected PART=SECONDS"),
                       (["--total", "six"], "--total six: expected SECONDS > 0")]:
        rc, out, result = run(tmp_path, *args)
        assert rc == 2 and result is None, (args, out[-2000:])
        assert out.startswith("gpu-check: ") and line in out and len(out.strip().splitlines()) == 1, out


def test_the_default_check_fits_nine_minutes():
    """The default check (the tier, the 1.5B and 7B widths) is expected to take at most 9 minutes with the interpreter's
    start and the wheels' install (STARTUP), and its limits, each its part's expected seconds and MARGIN, too; the
    expected seconds are docs/gpu.md's, step for step."""
    parts = ["tier", *gpu_check.DEFAULT_MODELS]
    limits, total = gpu_check.parse_limits([], None, parts, tiny=False)
    expected = {p: sum(gpu_check.ESTIMATES[p].values()) for p in parts}
    assert gpu_check.STARTUP + sum(expected.values()) <= gpu_check.BUDGET == 540
    assert gpu_check.STARTUP + total <= gpu_check.BUDGET and total == sum(limits.values())
    for part in parts:
        assert limits[part] == math.ceil(round(expected[part] * (1 + gpu_check.MARGIN), 6))
        assert limits[part] >= gpu_check.MIN_START["compile"] + gpu_check.MIN_START["step"]
    # every step of a model's part has an estimate: the build, the stages, the benchmark
    for name in gpu_check.DEFAULT_MODELS + gpu_check.MORE_MODELS:
        assert list(gpu_check.ESTIMATES[name]) == ["build", *gpu_check.STAGES, "benchmark"], name
    # docs/gpu.md's table of the estimates: a row per step, the default models' columns
    doc = (ROOT / "docs" / "gpu.md").read_text()
    for step in ["build", *gpu_check.STAGES, "benchmark"]:
        cells = [str(gpu_check.ESTIMATES[n][step]) for n in gpu_check.DEFAULT_MODELS]
        assert f"| {step} | " + " | ".join(cells) + " |" in doc, step
    assert f"| the CUDA tier | {gpu_check.ESTIMATES['tier']['tier']} |" in doc
    assert f"expected {gpu_check.STARTUP + sum(expected.values())} s" in doc
    limits, total = gpu_check.parse_limits(["tier=30", "qwen2_5-math-7b=200"], "300", ["tier", "qwen2_5-math-7b"], False)
    assert limits == {"tier": 30.0, "qwen2_5-math-7b": 200.0} and total == 300.0
    assert gpu_check.parse_limits(["qwen2_5-math-1_5b=5"], None, list(gpu_check.DEFAULT_MODELS), tiny=True) == (
        {"qwen2_5-math-1_5b": 5.0, "qwen2_5-math-7b": None}, math.inf)


def test_a_parts_overrun_is_shared_by_every_later_part():
    limits = {"tier": 200.0, "a": 100.0, "b": 100.0}
    # on time: each part its limit
    assert gpu_check.share(0.0, 400.0, limits, "tier", ["tier", "a", "b"]) == 200.0
    assert gpu_check.share(200.0, 400.0, limits, "a", ["a", "b"]) == 300.0
    # the tier ran 40 s over: a and b lose 20 s each, not a alone 40 (nor b everything a then overran)
    assert gpu_check.share(240.0, 400.0, limits, "a", ["a", "b"]) == 320.0
    # the tier finished 40 s early: a and b gain 20 s each
    assert gpu_check.share(160.0, 400.0, limits, "a", ["a", "b"]) == 280.0
    assert gpu_check.share(450.0, 400.0, limits, "b", ["b"]) == 450.0  # past the end: no time at all
    # a part without a limit still to come (the tiny mode): each its own limit, never past the end
    assert gpu_check.share(10.0, 100.0, {"a": 30.0, "b": None}, "a", ["a", "b"]) == 40.0
    assert gpu_check.share(10.0, 100.0, {"a": 30.0, "b": None}, "b", ["b"]) == 100.0


def test_a_step_whose_compile_is_done_starts_with_less_time_left_than_a_cold_one():
    ms = gpu_check.parse_min_start([])
    assert ms == gpu_check.MIN_START and ms["compile"] > ms["step"] and gpu_check.KIND["evaluate"] == "compile"
    at = time.monotonic() + 20  # 20 s of the part left
    assert not gpu_check.starts(at, ms, "evaluate")  # a cold compile: most of a minute
    for step in ("prepare", "extract", "evaluate_warm", "sweep", "arm_tuning", "benchmark", "build"):
        assert gpu_check.starts(at, ms, step), step
    assert gpu_check.parse_min_start(["0"]) == dict.fromkeys(gpu_check.MIN_START, 0.0)
    assert gpu_check.parse_min_start(["10", "compile=60"]) == {"tier": 10.0, "compile": 60.0, "step": 10.0}
    for bad in ("warm=5", "-1", "compile=x", "nan"):
        with pytest.raises(ValueError, match=f"--min-start {bad}: expected SECONDS >= 0 or KIND=SECONDS"):
            gpu_check.parse_min_start([bad])


def test_a_cold_compile_is_not_started_with_less_than_its_minimum_left(tiny_run, tiny_dir, tmp_path):
    """The tiny run with the cold compile's minimum above any part's time left: every step before evaluate runs,
    evaluate and the steps after it are "not started" (the part's stages run in order); the table prints each step's
    expected seconds (n/a: the tiny mode has none) beside the measured."""
    name = gpu_check.DEFAULT_MODELS[0]
    built_models(tiny_dir, tmp_path)
    rc, out, result = run(tmp_path, "--models", name, "--no-bench", "--limit", f"{name}=600",
                          "--min-start", "compile=601")
    assert rc == 1, out[-3000:]
    statuses = [(r["stage"], r["status"]) for r in result["stages"]]
    k = gpu_check.STAGES.index("evaluate")
    assert statuses == ([(s, "ok") for s in gpu_check.STAGES[:k]]
                        + [(s, gpu_check.NOT_STARTED) for s in gpu_check.STAGES[k:]]), statuses
    assert result["limits"]["min_start"] == {**gpu_check.MIN_START, "compile": 601.0}
    assert result["expected"] is None
    assert "| part | step | expected s | measured s | status |" in out
    assert f"| {name} | extract | n/a | {result['stages'][1]['wall_s']:,.1f} | ok |" in out
    assert f"| {name} | evaluate | n/a | n/a | {gpu_check.NOT_STARTED} |" in out


def test_a_stage_past_its_deadline_times_out_and_writes_nothing(tiny_run, tiny_dir, tmp_path, monkeypatch):
    from meaningless_tokens import store
    from meaningless_tokens.config import load_params

    name = gpu_check.DEFAULT_MODELS[0]
    project = tmp_path / "project"
    shutil.copytree(tiny_dir / "work" / "project", project)
    monkeypatch.setenv("MLESS_CACHE", str(tiny_dir / "work" / "cache"))
    artifact = project / store.path("attention", name)
    before = artifact.read_bytes()
    row = gpu_check.run_stage(load_params(project / "params.yaml"), project, "extract", name, False,
                              time.monotonic() - 1)
    assert row["status"] == gpu_check.TIMED_OUT and row["wall_s"] > 0, row
    assert artifact.read_bytes() == before  # the stage stopped between two prompts, before writing


def test_a_part_that_times_out_keeps_its_rows_and_the_run_goes_on_killed_midway(tiny_run, tiny_dir, tmp_path):
    first, second = gpu_check.DEFAULT_MODELS
    built_models(tiny_dir, tmp_path)
    out = tmp_path / "out" / "gpu-check.json"
    proc = subprocess.Popen(command(tmp_path, "--no-bench", "--min-start", "0", "--total", "600", "--limit",
                                    f"{first}=1"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # until the second model's extract is in: the first part is over, the run went on to the next
        deadline, result = time.monotonic() + 300, None
        while time.monotonic() < deadline and proc.poll() is None:
            result = json.loads(out.read_text()) if out.exists() else None  # replaced whole: never half-written
            if result and any(r["model"] == second and r["stage"] == "extract" for r in result["stages"]):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    result = json.loads(out.read_text())
    assert result["finished"] is False and result["ok"] is False
    assert result["parts"] == [{"part": first, "limit_s": 1.0, "status": gpu_check.TIMED_OUT,
                                "build_s": result["parts"][0]["build_s"], "wall_s": result["parts"][0]["wall_s"]}]
    rows = [r for r in result["stages"] if r["model"] == first]
    assert [r["stage"] for r in rows] == list(gpu_check.STAGES)
    statuses = [r["status"] for r in rows]
    stop = next(k for k, s in enumerate(statuses) if s != "ok")  # the limit of 1 s: a stage or two at most
    assert statuses[stop] in (gpu_check.TIMED_OUT, gpu_check.NOT_STARTED), statuses
    assert statuses[stop + 1:] == [gpu_check.NOT_STARTED] * (len(statuses) - stop - 1), statuses
    assert [(r["stage"], r["status"]) for r in result["stages"] if r["model"] == second][:2] == [
        ("prepare", "ok"), ("extract", "ok")]
    table = (tmp_path / "out" / "gpu-check.md").read_text()
    assert f"| {first} | 1.0 | " in table and f"| {first} | arm_tuning | {gpu_check.NOT_STARTED} |" in table
    assert table.rstrip().endswith("result: incomplete (the run was stopped, or is still running)")


def test_a_timed_out_part_exits_1_with_its_rows(tmp_path):
    name = gpu_check.DEFAULT_MODELS[0]
    rc, out, result = run(tmp_path, "--models", name, "--total", "0.001")
    assert rc == 1, out[-3000:]
    assert result["finished"] is True and result["ok"] is False and "result: FAILED" in out
    assert [{k: v for k, v in p.items() if k != "wall_s"} for p in result["parts"]] == [
        {"part": name, "limit_s": None, "status": gpu_check.TIMED_OUT}]
    assert [(r["stage"], r["status"]) for r in result["stages"]] == [(s, gpu_check.NOT_STARTED) for s in gpu_check.STAGES]
    assert result["generate"] == [{"model": name, "status": gpu_check.NOT_STARTED}]
    assert not (tmp_path / "work" / "models" / name / "done").exists()  # not even the build started
    assert f"| {name} | prepare | {gpu_check.NOT_STARTED} |" in out


TIER_CASES = """
import time
import pytest

pytestmark = pytest.mark.cuda


def test_passes():
    pass


def test_fails():
    assert False


@pytest.mark.skip(reason="no CUDA")
def test_skips():
    pass


def test_hangs():
    time.sleep(float(__import__("os").environ.get("TIER_CASE_SLEEP", "0")))
"""


def test_the_tier_streams_its_log_and_is_killed_at_its_limit(tmp_path, monkeypatch):
    cases = tmp_path / "test_tier_cases.py"
    cases.write_text(TIER_CASES)
    done = gpu_check.run_tier(tmp_path, tests=(str(cases),))  # no limit: read from the JUnit XML
    assert done["status"] == "failed" and done["returncode"] == 1, done
    assert (done["passed"], done["failed"], done["errors"], done["skipped"]) == (2, 1, 0, 1)
    assert done["failing"] == ["test_fails"]
    monkeypatch.setenv("TIER_CASE_SLEEP", "600")
    t0 = time.monotonic()
    stopped = gpu_check.run_tier(tmp_path, time.monotonic() + 8, tests=(str(cases),))
    assert time.monotonic() - t0 < 30
    assert stopped["status"] == gpu_check.TIMED_OUT and stopped["returncode"] is None, stopped
    # the counts of the lines it wrote before the kill: test_hangs never ended
    assert (stopped["passed"], stopped["failed"], stopped["errors"], stopped["skipped"]) == (1, 1, 0, 1)
    assert stopped["failing"] == ["test_fails"]
    # counted against what pytest collected: the case it did not finish is named, with why
    assert done["collected"] == stopped["collected"] == 4 and done["not_run"] == []
    assert stopped["not_run"] == ["test_hangs"] and stopped["not_run_why"] == "time limit"
    result = {"tiny": True, "machine": {"gpu": None, "torch": "t", "cuda": None, "transformers": "x", "git_commit": "c",
                                        "git_dirty": False},
              "tier": stopped, "models": [], "parts": [], "stages": [], "generate": [], "projection": {},
              "projected_hours": None, "targets": [], "limits": {"total": None, "min_start": {}},
              "finished": True, "ok": False, "wall_s": 1.0}
    shown = gpu_check.table(result)
    assert f"CUDA tier: {gpu_check.TIMED_OUT}: 1 passed, 1 failed, 0 errors, 1 skipped, 1 not run of 4 collected" in shown
    assert "CUDA tier, not run (time limit): test_hangs" in shown
    log = (tmp_path / "tier.log").read_text()
    assert "::test_passes PASSED" in log and "::test_fails FAILED" in log and "::test_hangs" in log
    assert "test_hangs PASSED" not in log


def test_one_shape_and_one_compile_per_model_and_the_sweep_takes_evaluates_rows(tiny_run):
    rc, out, result = tiny_run
    assert rc == 0, out[-3000:]
    ev, sw = gpu_check.TINY_SIZES["evaluate"], result["sizes"]["sweep"]
    for name in gpu_check.DEFAULT_MODELS:
        rows = {r["stage"]: r for r in result["stages"] if r["model"] == name}
        bench = next(b for b in result["generate"] if b["model"] == name)
        shape = rows["evaluate"]["shape"]
        # evaluate's plan: its batch size's rows (the plan has 16), its width rounded up to 256, + its 16 new tokens
        assert shape["rows"] == ev["batch_size"] and shape["width"] % 256 == 0, shape
        assert shape["cache_len"] == shape["width"] + ev["max_new_tokens"]
        assert rows["evaluate_warm"]["shape"] == rows["sweep"]["shape"] == bench["shape"] == bench["like"] == shape
        assert bench["batch_size"] == shape["rows"]
        # the decode step compiled once, by evaluate; evaluate_warm, the sweep and the benchmark's engine run it warm
        # (the shared model); plain `generate` runs uncompiled
        assert rows["evaluate"]["graphs"] == 1, rows["evaluate"]
        assert sum(r["graphs"] for r in rows.values()) + bench["graphs"] == 1, (
            {s: r["graphs"] for s, r in rows.items()}, bench["graphs"])
        assert rows["evaluate"]["warmup_s"] > 0
        assert rows["evaluate_warm"]["warmup_s"] is None and rows["sweep"]["warmup_s"] is None
        assert bench["engine_warmup_s"] is None
        # the sweep runs evaluate's problems: count 0 and 55 are evaluate's none and mless rows, taken
        s = rows["sweep"]
        prompts = sw["accuracy_samples"] * (1 + len([c for c in sw["counts"] if c]))
        assert s["reused"] == 2 * sw["accuracy_samples"] and s["generated"] == prompts - s["reused"], s
        assert s["tokens"] == s["generated"] * ev["max_new_tokens"]


@pytest.mark.parametrize("item, value", [("evaluate.compile=on", "on"), ("evaluate.compile=off", "off"),
                                         ("evaluate.compile='on'", "on"), ("evaluate.sampling.temperature=null", None),
                                         ("evaluate.sampling.temperature=1e-3", 0.001),
                                         ("verdict.sesoi.f2=.5", 0.5)])
def test_a_set_value_is_read_as_dvc_reads_it(tmp_path, item, value):
    """`--set KEY=VALUE` takes VALUE as DVC would read it in params.yaml (YAML 1.2: `on` a string, 1e-3 a float), and
    the params file the check writes reads back the same."""
    from dvc.utils.serialize import parse_yaml

    from meaningless_tokens.config import load_params, yaml12

    key, literal = item.split("=")
    *path, last = key.split(".")
    assert parse_yaml(f"v: {literal}", "-")["v"] == value
    raw = gpu_check.check_params({"qwen2_5-math-1_5b": tmp_path}, True, [item])
    node = raw
    for part in path:
        node = node[part]
    assert node[last] == value and type(node[last]) is type(value)
    (tmp_path / "params.yaml").write_text(yaml12.dump(raw))
    params = load_params(tmp_path / "params.yaml")
    got = getattr(params, path[0])
    for part in [*path[1:], last]:
        got = got[part] if isinstance(got, dict) else getattr(got, part)
    assert got == value


def test_the_tier_runs_what_only_a_gpu_checks_first_and_lists_every_case_it_collected(tmp_path):
    """benchmarks/gpu_tier.py on tests/test_cuda.py as the check runs it (its CUDA cases collected on any machine):
    the compiled-ARM cases before the stage comparisons that repeat the CPU's, every case in the list the tier is
    counted against."""
    listed = tmp_path / "collected.txt"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "benchmarks.gpu_tier",
                           "--collect-only", "-q", "-m", "cuda", "-k", gpu_check.TIER_CASES, "tests/test_cuda.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLESS_TIER_COLLECTED": str(listed)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = listed.read_text().split()
    assert ids == [line for line in proc.stdout.splitlines() if "::" in line]  # the order pytest runs them in
    assert len(ids) == 20  # 19 CUDA cases and the refusal on a machine without CUDA
    names = [i.split("::")[1].split("[")[0] for i in ids]
    order = gpu_tier_order()
    ranks = [order.index(n) if n in order else len(order) for n in names]
    assert ranks == sorted(ranks), names
    first_arm = names.index("test_the_compiled_arm_edit_fused_with_its_act_fn_on_cuda_is_the_eager_edit")
    assert first_arm < names.index("test_extract_matches_the_cpu_in_float32")
    assert names.count("test_the_compiled_arm_edit_on_cuda_moves_what_the_cpu_does") == 4
    assert not any("cpu-bfloat16" in i for i in ids)


def gpu_tier_order():
    spec = importlib.util.spec_from_file_location("gpu_tier", ROOT / "benchmarks" / "gpu_tier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.ORDER)


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds `text`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def test_sigterm_during_the_tier_ends_it_keeps_what_finished_and_leaves_no_process(tmp_path):
    """SIGTERM to a tiny run while its tier (the fake one above: a case that hangs) runs: the tier's process group
    ends, gpu-check.json and gpu-check.md hold the cases that finished and name the one it stopped, no process of the
    tier is left, and the run exits 128 + 15 without starting a model."""
    cases = tmp_path / "test_tier_cases.py"
    cases.write_text(TIER_CASES)
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--tier-tests", str(cases), "--models", gpu_check.DEFAULT_MODELS[0],
           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    log = tmp_path / "out" / "tier.log"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TIER_CASE_SLEEP": "600"})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and "::test_fails FAILED" in log.read_text(errors="replace"):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert _processes_naming(str(cases)), "the tier is not running"
        time.sleep(1)  # test_hangs is in flight
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    deadline = time.monotonic() + 10  # the kill of a process group is delivered, not waited for
    while _processes_naming(str(cases)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_naming(str(cases)) == []
    result = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    tier = result["tier"]
    assert result["stopped"] == "SIGTERM" and result["finished"] is False and result["ok"] is False
    assert tier["status"] == "stopped (SIGTERM)" and "signal" not in tier
    assert (tier["passed"], tier["failed"], tier["skipped"], tier["collected"]) == (1, 1, 1, 4)
    assert tier["not_run"] == ["test_hangs"] and tier["not_run_why"] == "stopped by SIGTERM"
    assert result["parts"] == [{"part": "tier", "limit_s": None, "status": "stopped (SIGTERM)",
                                "wall_s": result["parts"][0]["wall_s"]}]
    assert result["stages"] == [] and not (tmp_path / "work" / "models" / gpu_check.DEFAULT_MODELS[0] / "done").exists()
    table = (tmp_path / "out" / "gpu-check.md").read_text()
    assert table == gpu_check.table(result) + "\n"
    assert "CUDA tier, not run (stopped by SIGTERM): test_hangs" in table
    assert table.rstrip().endswith("result: stopped by SIGTERM (the rows above finished before it)")


def test_a_tier_outlives_no_check_killed_without_warning(tmp_path):
    """SIGKILL runs no handler: the tier, in a session of its own, dies with the check all the same (its child was
    started with PR_SET_PDEATHSIG)."""
    cases = tmp_path / "test_tier_cases.py"
    cases.write_text(TIER_CASES)
    code = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('g', {str(SCRIPT)!r}); "
            "g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g); "
            f"g.run_tier(__import__('pathlib').Path({str(tmp_path)!r}), tests=({str(cases)!r},))")
    check = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TIER_CASE_SLEEP": "600"})
    try:
        deadline = time.monotonic() + 120
        log = tmp_path / "tier.log"
        while time.monotonic() < deadline and not (log.exists() and "::test_fails FAILED" in log.read_text()):
            time.sleep(0.2)
        assert _processes_naming(str(cases)), "the tier is not running"
        check.kill()
        check.wait()
    finally:
        check.kill()
    deadline = time.monotonic() + 10
    while _processes_naming(str(cases)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_naming(str(cases)) == []
