"""evaluate.sampling: the pass@k estimator, the per-sample seeded draw, and the stage on a tiny model."""

import itertools
import json
from math import comb

import numpy as np
import pytest
import torch

from meaningless_tokens import engines
from meaningless_tokens import models, sampling
from stages import evaluate
from meaningless_tokens.config import load_params
from meaningless_tokens.prompts import builder_for, dataset_spec, load_problems
from meaningless_tokens.store import read_h5, read_texts


# ---- the estimators ------------------------------------------------------------------------------------

def test_pass_at_k_equals_the_exact_formula_and_brute_force_enumeration():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                # brute force: the share of k-subsets of the n samples that hold at least one of the c right ones
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(i < c for i in s) for s in subsets) / len(subsets)
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert sampling.pass_at_k(n, c, k) == pytest.approx(brute) == pytest.approx(exact), (n, c, k)
    assert sampling.pass_at_k(5, 1, 1) == pytest.approx(0.2) and sampling.pass_at_k(5, 3, 3) == 1.0
    with pytest.raises(ValueError):
        sampling.pass_at_k(3, 1, 4)


def test_majority_and_distinct_n():
    assert sampling.majority_right(["7", "8", "8", ""], [True, False, False, False]) is False
    assert sampling.majority_right(["7", "8", "", ""], [True, False, False, False]) is True  # tie: seen first
    assert sampling.majority_right(["", ""], [False, False]) is False
    assert sampling.distinct_n(["a b a b"], 1) == pytest.approx(2 / 4)
    assert sampling.distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    assert sampling.distinct_n(["a b c", "a b c"], 2) == pytest.approx(2 / 4)  # across a problem's samples
    assert sampling.distinct_n(["a"], 2) == 0.0


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8),
                                                     (1.3, 5, 0.9)])
def test_the_draw_follows_transformers_warpers(temperature, top_k, top_p):
    """The inverse-CDF draw picks each token with the probability transformers' own warpers leave it."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -0.5, -1.0, 0.9, 3.0]])
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    expected = torch.softmax(warpers(None, logits.clone()), dim=-1)[0].double().numpy()
    grid = (np.arange(20000) + 0.5) / 20000
    picks = np.array([sampling.sample_token(logits[0].numpy(), u, temperature, top_p, top_k) for u in grid])
    freq = np.bincount(picks, minlength=len(expected)) / len(grid)
    assert np.abs(freq - expected).max() < 1e-3


# ---- on a tiny model ---------------------------------------------------------------------------------

def sampled_params(write_params, tiny_dirs, n=3, **sampling_cfg):
    raw = load_params(write_params()).model_dump()
    raw["runtime"]["threads"] = 1
    raw["evaluate"].update(n_samples=4, max_new_tokens=10, batch_size=8, stop_at_boxed=False,
                           sampling={**raw["evaluate"]["sampling"], "n": n, "temperature": 1.0, "top_k": 0, **sampling_cfg})
    raw["models"] = {"tiny": {"display_name": "Tiny llama", "family": "llama",
                              "source": {"kind": "local_dir", "path": str(tiny_dirs["llama"])}}}
    return load_params(write_params(raw))


def test_sampled_outputs_are_the_same_alone_and_inside_a_batch(tiny_dirs, write_params, cache_dir):
    params = sampled_params(write_params, tiny_dirs)
    setup = models.setup_for(params, "tiny")
    engine = engines.TransformersEngine(params.evaluate, setup)
    assert engine.sampling["origin"] == {"temperature": "params", "top_p": "transformers default",
                                                     "top_k": "params"}
    builder = builder_for(params.prompt, setup, engine.tokenizer)
    problems, _ = load_problems(dataset_spec(params.dataset, params.file))
    built = [builder.build(p) for p in problems[:2]]
    # samples of two problems and two conditions (prompts of other lengths: left padding differs) and a greedy row
    batch = [engines.Item(p.index, c, b[c].input_ids, j) for p, b in zip(problems, built) for c in ("none", "mless")
             for j in range(3)]
    batch.append(engines.Item(problems[0].index, "none", built[0]["none"].input_ids))
    together = {it: text for out in engine.run([batch], set()) for it, text, *_ in out}
    alone = {it: text for one in batch for out in engine.run([[one]], set()) for it, text, *_ in out}
    assert together == alone
    texts = [together[it] for it in batch if it.sample >= 0]
    assert len(set(texts)) > len(texts) // 2, "the samples hardly differ: the draw would not be tested"
    assert together[batch[-1]] not in texts[:3]


def test_evaluate_with_sampling_metrics_artifact_resume_and_byte_identical(tiny_dirs, write_params, cache_dir, tmp_path):
    params = sampled_params(write_params, tiny_dirs)
    out = evaluate.run(params, "tiny", root=tmp_path / "a")
    m = json.loads((tmp_path / "a/metrics/accuracy/tiny.json").read_text())
    s = m["sampling"]
    with read_h5(out, "eval", ("none/sampled/correct",)) as f:
        correct = f["none/sampled/correct"][()]
        outputs = read_texts(f["none/sampled/output"])
        assert correct.shape == (4, 3) and f["mful/sampled/output"].shape == (4, 3)
        prov = json.loads(f.attrs["provenance"])
    assert prov["generation"]["sampling"]["temperature"] == 1.0 and prov["generation"]["sampling"]["n"] == 3
    assert s["n"] == 3 and set(s) >= {"pass@1", "pass@2", "pass@3", "maj@3", "paper_pass@3", "distinct-2", "mless-none"}
    assert s["pass@1"]["none"] == pytest.approx(correct.mean())
    assert s["mless-none"]["pass@3"]["ci95_low"] <= s["mless-none"]["pass@3"]["delta"] <= s["mless-none"]["pass@3"]["ci95_high"]
    assert all(0 <= s[f"distinct-{k}"]["none"] <= 1 for k in (1, 2, 3, 4)) and s["distinct-1"]["none"] > 0
    assert s["distinct-2"]["none"] == pytest.approx(np.mean([sampling.distinct_n(list(row), 2) for row in outputs]))
    # a run interrupted after half of its batches resumes to the same bytes: shard 0 of 2 writes its half under
    # the journal's key, which is then the journal an interrupted run leaves
    part = evaluate.run(params.model_copy(update={"evaluate": params.evaluate.model_copy(
        update={"shard": evaluate.Shard(index=0, count=2)})}), "tiny", root=tmp_path / "b")
    kept = part.read_text().count("\n") - 1
    assert any('"sample": 2' in line for line in part.read_text().splitlines())
    part.rename(tmp_path / "b/artifacts/eval/.journal/tiny.jsonl")
    again = evaluate.run(params, "tiny", root=tmp_path / "b")
    assert again.read_bytes() == out.read_bytes()
    timing = json.loads((tmp_path / "b/metrics/timing/evaluate-tiny.json").read_text())
    assert timing["resumed_generations"] == kept
    # sampling off: no sampled groups and no sampling metrics
    off = evaluate.run(sampled_params(write_params, tiny_dirs, n=0), "tiny", root=tmp_path / "c")
    with read_h5(off, "eval") as f:
        assert "sampled" not in f["none"] and "sampling" not in json.loads(f.attrs["metrics"])

