"""The sweep fed from evaluate's rows: evaluate@<model> writes the greedy rows it kept (artifacts/generations/
<model>.jsonl, meaningless_tokens/generations.py), the sweep of that model adopts their shape and takes the rows its
count-0 and count-55 prompts share with evaluate's none and mless prompts, and its outputs are byte for byte those of
a sweep that takes nothing. Compile on runs dynamo with its `eager` backend (the graph capture and guards a GPU run
has, no C++ build); compile off keeps per-batch shapes, where nothing is kept."""

import json

import pytest
import torch

from meaningless_tokens.config import load_params
from meaningless_tokens.engines import transformers as engine_module
from stages import evaluate, sweep
from tests.test_extract import tiny_params

OUTPUTS = ("artifacts/sweep/tiny.h5", "metrics/sweep/tiny.json", "artifacts/plots/sweep/tiny.csv")


def reuse_params(write_params, tiny_dirs, compile_setting, conditions):
    raw = tiny_params(write_params, tiny_dirs, "llama", n_samples=3).model_dump()
    raw["runtime"]["threads"] = 1
    raw["prompt"]["conditions"] = conditions
    raw["evaluate"].update(n_samples=4, seed=0, max_new_tokens=6, batch_size=8, stop_at_boxed=True,
                           compile=compile_setting, sampling={**raw["evaluate"]["sampling"], "n": 0})
    raw["sweep"].update(counts=[0, 10, 55], attention_samples=2, accuracy_samples=4, likelihood_samples=0, seed=0,
                        n_boot=50, top_heads=2)
    return load_params(write_params(raw))


@pytest.fixture
def eager_compile(monkeypatch):
    monkeypatch.setattr(engine_module, "COMPILE_OPTIONS", {**engine_module.COMPILE_OPTIONS, "backend": "eager",
                                                           "mode": None})
    torch._dynamo.reset()
    yield
    engine_module.release()
    torch._dynamo.reset()


@pytest.mark.parametrize("conditions", [["none", "mless", "mful"], ["none", "mless", "arm"]])
def test_the_sweep_takes_evaluates_rows_and_writes_the_same_bytes(conditions, tiny_dirs, write_params, cache_dir,
                                                                  tmp_path, monkeypatch, eager_compile):
    """Compiled (planned shapes): the sweep adopts evaluate's shape, takes its none and mless rows (with `arm` among the
    conditions both engines carry the same idle ARM hook, so the key still matches) and generates the rest; its outputs
    equal a sweep with MLESS_REUSE=0 byte for byte, in a fresh process state (the shared model released)."""
    params = reuse_params(write_params, tiny_dirs, "on", conditions)
    evaluate.run(params, "tiny", root=tmp_path)
    header = json.loads((tmp_path / "artifacts/generations/tiny.jsonl").read_text().splitlines()[0])
    assert header["kept"] is True and header["shape"]["rows"] == 8
    assert header["key"]["arm_hook"] is None if "arm" not in conditions else header["key"]["arm_hook"]
    sweep.run(params, "tiny", root=tmp_path)
    timing = json.loads((tmp_path / "metrics/timing/sweep-tiny.json").read_text())["accuracy"]
    kept = {k: (tmp_path / k).read_bytes() for k in OUTPUTS}
    # 4 problems x (none, /x10, /x55); the problems both stages chose take none and /x55 from evaluate
    assert timing["reused"] >= 2 and timing["reused"] % 2 == 0, timing
    assert timing["reused"] + timing["generated"] == 12
    assert timing["shape"] == header["shape"]

    engine_module.release()
    torch._dynamo.reset()
    monkeypatch.setenv("MLESS_REUSE", "0")
    sweep.run(params, "tiny", root=tmp_path)
    timing = json.loads((tmp_path / "metrics/timing/sweep-tiny.json").read_text())["accuracy"]
    assert "reused" not in timing and timing["generated"] == 12
    for k in OUTPUTS:
        assert (tmp_path / k).read_bytes() == kept[k], k


def test_without_planned_shapes_nothing_is_kept_or_taken(tiny_dirs, write_params, cache_dir, tmp_path):
    """Compile off (the CPU's default): per-batch shapes; evaluate's file says why it keeps nothing, and the sweep
    generates every row."""
    params = reuse_params(write_params, tiny_dirs, "off", ["none", "mless", "mful"])
    evaluate.run(params, "tiny", root=tmp_path)
    header = json.loads((tmp_path / "artifacts/generations/tiny.jsonl").read_text())
    assert header["kept"] is False
    sweep.run(params, "tiny", root=tmp_path)
    timing = json.loads((tmp_path / "metrics/timing/sweep-tiny.json").read_text())["accuracy"]
    assert "reused" not in timing and timing["generated"] == 12


def test_a_model_evaluate_does_not_run_generates_its_own(tiny_dirs, write_params, cache_dir, tmp_path,
                                                        eager_compile):
    """No file of evaluate's for the model (it is not evaluated): the sweep generates every row, and writes the bytes
    of a sweep that took evaluate's rows."""
    params = reuse_params(write_params, tiny_dirs, "on", ["none", "mless", "mful"])
    evaluate.run(params, "tiny", root=tmp_path)
    sweep.run(params, "tiny", root=tmp_path)
    took = {k: (tmp_path / k).read_bytes() for k in OUTPUTS}
    (tmp_path / "artifacts/generations/tiny.jsonl").unlink()
    engine_module.release()
    torch._dynamo.reset()
    sweep.run(params, "tiny", root=tmp_path)
    timing = json.loads((tmp_path / "metrics/timing/sweep-tiny.json").read_text())["accuracy"]
    assert "reused" not in timing and timing["generated"] == 12
    for k in OUTPUTS:
        assert (tmp_path / k).read_bytes() == took[k], k
