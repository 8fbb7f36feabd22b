"""The CUDA tier's instrumentation (tests/test_cuda.py, `counting_syncs`) around a compiled decode step, on the CPU.

On CUDA `evaluate.compile: auto` compiles transformers' decode step (`model.get_compiled_call`: torch.compile of the
model's `__call__`; the prompt runs uncompiled) and the engine warms it up before the first journaled batch. The tier
must then count each forward once, eager or compiled, without putting its counter into the compiled graph (a Python
int there is a guard: a recompile at every step), and keep the warm-up's forwards and syncs apart from the batches'.
Here `evaluate.compile: on` compiles on the CPU too; dynamo's graphs go to a counting backend that runs them as traced
(tests/test_arm_compile.py, no C++ build), so the case is cheap enough for every `make test`.
"""

from __future__ import annotations

import json

import h5py
import torch

from meaningless_tokens.engines import transformers as engine_module
from stages import evaluate
from tests.test_arm_compile import counting_backend
from tests.test_cuda import counting_syncs, params_for


def test_the_tier_counts_a_compiled_stage_once_per_forward_without_recompiling(tiny_dirs, write_params, cache_dir,
                                                                               tmp_path, monkeypatch):
    """evaluate with compile on (arm rows in the step, two journaled batches of the plan's one shape, the second
    filled): one graph for the warm-up and every decode step of every batch; the forwards counted are the batches'
    (the prefill eager, the decode steps through the compiled call), the warm-up's apart; the tokens of the uncompiled
    run."""
    sections = {"evaluate": {"n_samples": 3, "max_new_tokens": 4, "batch_size": 4, "stop_at_boxed": False},
                "prompt": {"conditions": ["none", "arm"]}}
    off = params_for(write_params, tiny_dirs["llama"], "llama", "cpu", "float32",
                     **{**sections, "evaluate": {**sections["evaluate"], "compile": "off"}})
    ref = evaluate.run(off, "tiny", root=tmp_path / "off")
    params = params_for(write_params, tiny_dirs["llama"], "llama", "cpu", "float32",
                        **{**sections, "evaluate": {**sections["evaluate"], "compile": "on"}})
    graphs = []
    monkeypatch.setattr(engine_module, "COMPILE_OPTIONS",
                        {**engine_module.COMPILE_OPTIONS, "backend": counting_backend(graphs), "mode": None})
    torch._dynamo.reset()
    try:
        with counting_syncs(monkeypatch) as syncs:
            got = evaluate.run(params, "tiny", root=tmp_path / "on")
    finally:
        torch._dynamo.reset()
    timing = json.loads((tmp_path / "on/metrics/timing/evaluate-tiny.json").read_text())
    cfg = params.evaluate
    rows = cfg.n_samples * len(params.prompt.conditions)
    batches = -(-rows // timing["batch_size"])
    steps = cfg.max_new_tokens
    with h5py.File(ref, "r") as fr, h5py.File(got, "r") as fg:
        assert json.loads(fg.attrs["provenance"])["generation"]["compile"]["on"]
        for c in params.prompt.conditions:
            for k in ("output", "n_tokens", "stop"):
                assert fg[f"{c}/{k}"][()].tolist() == fr[f"{c}/{k}"][()].tolist(), (c, k)
            # random weights write no end-of-text: every batch runs all its steps
            assert (fg[f"{c}/n_tokens"][()] == steps).all()
    assert batches == 2 and rows % timing["batch_size"], "two batches of one shape, the second filled"
    assert len(graphs) == 1, f"{len(graphs)} graphs: a recompile per step or per batch"
    # per batch: the prefill (eager) and steps - 1 decode steps (compiled), each counted once; the warm-up's none
    assert syncs.forwards == batches * steps, (syncs.forwards, batches, steps)
    assert syncs.compiled == batches * (steps - 1), (syncs.compiled, batches, steps)
    assert "warmup_seconds" in timing and syncs.warmups == 1
