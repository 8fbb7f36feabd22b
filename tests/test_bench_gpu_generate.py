"""benchmarks/bench_gpu_generate.py on the CPU: the evaluate engine against plain `model.generate` on a tiny-width
model of the paper's Qwen2.5-Math-1.5B family (float32, a few tokens: seconds), its JSON and table, the GPU plan's
targets judged on constructed results, and bad input."""

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_gpu_generate.py"
spec = importlib.util.spec_from_file_location("bench_gpu_generate", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

pytestmark = pytest.mark.slow  # the benchmark script twice on the CPU (tens of seconds): make test-fast leaves it

SIZES = {"batch_size": 3, "new_tokens": 6, "batches": 2}


def run(work, *args):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--dtype", "float32", "--threads", "1",
                           "--work", str(work), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-gpu-generate")
    out = tmp / "bench.json"
    rc, text, err = run(tmp / "work", "--batch-size", str(SIZES["batch_size"]), "--new-tokens",
                        str(SIZES["new_tokens"]), "--batches", str(SIZES["batches"]), "--json", str(out))
    return rc, text + err[-3000:] * (rc != 0), json.loads(out.read_text()) if out.exists() else None


def test_both_arms_generate_the_same_greedy_tokens_on_the_same_prompts(cpu_run):
    rc, text, r = cpu_run
    assert rc == 0, text[-3000:]
    assert r["model"] == "qwen2_5-math-1_5b" and r["device"] == "cpu" and r["dtype"] == "float32"
    assert (r["batch_size"], r["new_tokens"], r["batches"]) == tuple(SIZES.values())
    assert r["conditions"] == ["none", "mless", "mful"]  # arm needs the project's hook
    assert r["generate_cache"] == "DynamicCache"  # the plain call's default cache, not the engine's static one
    assert r["engine_settings"]["cache"] == "static" and r["engine_settings"]["batch_size"] == SIZES["batch_size"]
    assert r["engine_settings"]["compile"] == {"setting": "auto", "on": False}  # auto: off on the CPU
    rows = SIZES["batch_size"] * SIZES["batches"]
    for mode in ("greedy", "sampled"):
        m = r["modes"][mode]
        assert m["rows_compared"] == rows
        for arm in ("engine", "generate"):
            x = m[arm]
            assert x["rows"] == rows and 0 <= x["rows_at_limit"] <= rows
            assert x["rows_at_limit"] * SIZES["new_tokens"] <= x["tokens"] <= rows * SIZES["new_tokens"]
            assert math.isfinite(x["tokens_per_s"]) and x["tokens_per_s"] > 0
            assert x["tokens_per_s"] == pytest.approx(x["tokens"] / x["steady_s"], rel=1e-2)
            assert x["first_batch_s"] > 0 and x["warmup_s"] <= x["first_batch_s"]
            assert x["extra_cuda_gib"] is None
        assert m["ratio"] == pytest.approx(m["engine"]["tokens_per_s"] / m["generate"]["tokens_per_s"], rel=1e-2)
    # float32 on the CPU: the static-cache engine and the dynamic-cache generate write the same greedy tokens
    assert r["modes"]["greedy"]["rows_differ"] == 0
    assert r["modes"]["greedy"]["engine"]["tokens"] == r["modes"]["greedy"]["generate"]["tokens"]
    assert r["sampled_over_greedy"] == pytest.approx(
        r["modes"]["sampled"]["engine"]["tokens_per_s"] / r["modes"]["greedy"]["engine"]["tokens_per_s"], rel=1e-2)


def test_the_table_targets_and_ratio_line_are_printed(cpu_run):
    rc, text, r = cpu_run
    lines = text.rstrip().splitlines()
    assert lines[-1].startswith("ratio: ") and f"at batch {SIZES['batch_size']}" in lines[-1]
    assert "| mode | arm | rows | at limit | tokens | steady s | tokens/s | first batch s | warm-up s | extra CUDA GiB |" in text
    assert "greedy: engine has " in text and f"0 of {SIZES['batch_size'] * SIZES['batches']} rows differ" in text
    assert [t["status"] for t in r["targets"]] == ["not measured (CPU run: the targets are a GPU's)"] * 3
    assert "steady greedy tokens/s at the 1.5B width, batch 64: >= 10,000" in r["targets"][0]["target"]
    for t in r["targets"]:
        assert f"| {t['target']} | " in text and f" | {t['status']} |" in text


def test_gpu_profile_stage_tokens():
    gpu = yaml.safe_load((ROOT / "profiles/gpu.yaml").read_text())
    ev, n_cond = gpu["evaluate"], len(gpu["prompt"]["conditions"])
    assert bench.gpu_profile_evaluate_tokens() == (500 * n_cond * ev["max_new_tokens"],
                                                   500 * n_cond * ev["sampling"]["n"] * ev["sampling"]["max_new_tokens"])


def constructed(model="qwen2_5-math-1_5b", device="cuda", batch=64, hidden=1536, layers=28, greedy=12_000.0,
                sampled=10_000.0, share=0.05):
    return {"model": model, "device": device, "batch_size": batch, "hidden_size": hidden, "layers": layers,
            "modes": {"greedy": {"engine": {"tokens_per_s": greedy}}, "sampled": {"engine": {"tokens_per_s": sampled}}},
            "warmup_share": share, "full_evaluate_s": 1000.0,
            "sampled_over_greedy": None if greedy is None or sampled is None else sampled / greedy}


def statuses(**kw):
    return [t["status"] for t in bench.targets(constructed(**kw))]


def test_the_targets_are_judged_against_the_plan():
    assert statuses() == ["met", "met", "met"]
    assert statuses(greedy=9_999.0, sampled=7_000.0, share=0.1) == ["not met", "not met", "not met"]
    assert statuses(model="qwen2_5-math-7b", hidden=3584, greedy=5_000.0, sampled=4_000.0) == ["met", "met", "met"]
    assert statuses(model="qwen2_5-math-7b", hidden=3584, greedy=4_999.0, sampled=4_000.0)[0] == "not met"
    assert statuses(device="cpu") == ["not measured (CPU run: the targets are a GPU's)"] * 3
    assert statuses(batch=32) == ["not measured (batch 32; the targets are at batch 64)"] * 3
    assert statuses(hidden=48, layers=6)[0] == "not measured (hidden size 48, 6 layers: not the 1.5B width)"
    assert statuses(model="llama3_1-8b-instruct", hidden=4096, layers=32)[0].startswith("no target for this model")
    assert statuses(share=None, sampled=None)[1:] == ["not measured (no value)"] * 2


def test_bad_sizes_are_one_line(tmp_path):
    rc, _, text = run(tmp_path / "work", "--batches", "0")
    assert rc == 2 and text.splitlines()[-1].endswith("argument --batches: expected an integer >= 1, got '0'"), text
    assert not (tmp_path / "work").exists()  # refused before any model is built


def test_compile_is_passed_where_the_engine_offers_it(tmp_path):
    from meaningless_tokens.config import load_params
    from meaningless_tokens.config.schema import Evaluate
    from meaningless_tokens.errors import ConfigError

    ev = load_params(ROOT / "profiles" / "gpu.yaml").evaluate
    cfg = bench.bench_config(ev, 8, 5, None)
    assert (cfg.batch_size, cfg.max_new_tokens, cfg.stop_at_boxed, cfg.engine) == (8, 5, False, "transformers")
    assert cfg.sampling.max_new_tokens == 5 and cfg.sampling.n == max(ev.sampling.n, 1)
    if "compile" in Evaluate.model_fields:
        assert bench.bench_config(ev, 8, 5, "off").compile == "off"
    else:
        with pytest.raises(ConfigError, match="evaluate.compile"):
            bench.bench_config(ev, 8, 5, "off")
