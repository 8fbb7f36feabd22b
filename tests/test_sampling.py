"""evaluate.sampling: the pass@k estimator, the per-sample seeded draw, and the stage on a tiny model."""

import itertools
import json
from math import comb

import numpy as np
import pytest
import torch

from meaningless_tokens import draws, engines
from meaningless_tokens import models, sampling
from stages import evaluate
from tests.test_syncs import syncs  # noqa: F401  (the fixture counting host-device syncs)
from meaningless_tokens.config import Shard, load_params
from meaningless_tokens.dataset import dataset_spec, load_problems
from meaningless_tokens.prompts import builder_for
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


# ---- the draw on the device ---------------------------------------------------------------------------

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix_np(h: np.ndarray) -> np.ndarray:
    """splitmix64 in numpy uint64 (wrapping), written from its definition (Steele et al. 2014), not from draws.py."""
    z = h + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def reference_uniforms(seed: int, index: int, condition: str, sample: int, steps: int) -> np.ndarray:
    """The uniforms of steps 0..steps-1: h = seed, then h = splitmix64(h ^ w) for the key's length (3) and words
    (problem index, condition's index, sample index), then for the step; the uniform is (h >> 11) / 2**53."""
    words = [3, index, sampling.CONDITIONS.index(condition), sample]
    h = np.full(steps, seed & int(_M64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for w in words:
            h = _splitmix_np(h ^ np.uint64(w))
        h = _splitmix_np(h ^ np.arange(steps, dtype=np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) / 2.0**53


def test_the_uniforms_equal_an_independent_numpy_hash():
    keys = [(0, 0, "none", 0), (0, 499, "arm", 4), (12345, 7, "mless", 2), (2**63 - 1, 2**40 + 3, "mful", 99),
            (-1, 3, "none", 1)]

    states = draws.lanes([sampling.row_state(sampling.sample_seed(*k)) for k in keys])
    steps = 600
    got = np.stack([sampling.step_uniforms(states, t).numpy() for t in range(steps)], axis=1)
    want = np.stack([reference_uniforms(*k, steps) for k in keys])
    assert np.array_equal(got, want)  # bit for bit
    assert 0 <= got.min() and got.max() < 1 and abs(got.mean() - 0.5) < 0.02
    assert len(np.unique(got)) == got.size  # no two (key, step) share a draw here


def _compare(logits: np.ndarray, u: np.ndarray, temperature: float, top_p: float, top_k: int) -> None:
    got = sampling.draw(torch.from_numpy(logits), torch.from_numpy(u), temperature, top_p, top_k).numpy()
    want = np.array([sampling.sample_token(row, float(x), temperature, top_p, top_k) for row, x in zip(logits, u)])
    bad = np.flatnonzero(got != want)
    assert not len(bad), f"rows {bad[:5]}: {got[bad[:5]]} != {want[bad[:5]]} (T={temperature}, p={top_p}, k={top_k})"


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
@pytest.mark.parametrize("top_k", [0, 1, 3, 8, 200])
@pytest.mark.parametrize("top_p", [1.0, 0.25, 0.5, 0.8, 0.95])
def test_the_batched_draw_picks_what_sample_token_picks(temperature, top_k, top_p):
    """Random rows, many with ties (integer logits: ties at the k-th value and at the top-p cut) and -inf entries."""
    rng = np.random.default_rng([top_k, int(top_p * 100), int(temperature * 10)])
    for vocab in (2, 5, 17, 64):
        rows = 48
        ties = rng.integers(-4, 4, size=(rows // 2, vocab)).astype(np.float32)
        spread = (rng.normal(size=(rows // 2, vocab)) * 3).astype(np.float32)
        logits = np.concatenate([ties, spread])
        logits[rng.random(logits.shape) < 0.2] = -np.inf
        logits[:, rng.integers(vocab)] = 0.5  # at least one finite entry per row
        _compare(logits, rng.random(rows), temperature, top_p, top_k)
    # every boundary of one tied row's distribution, from a grid of uniforms
    grid = (np.arange(200) + 0.5) / 200
    _compare(np.repeat(ties[:1], len(grid), axis=0), grid, temperature, top_p, top_k)


def test_the_draw_splits_ties_by_token_id_at_the_cut():
    u = (np.arange(1000) + 0.5) / 1000
    # four equal tokens: top-p 0.5 keeps the first two by id
    flat = np.repeat(np.array([[-np.inf, 0, 0, -np.inf, 0, 0]], dtype=np.float32), len(u), axis=0)
    picks = sampling.draw(torch.from_numpy(flat), torch.from_numpy(u), 1.0, 0.5, 0).numpy()
    assert set(picks) == {1, 2}
    _compare(flat, u, 1.0, 0.5, 0)
    # top-k 2 keeps the k-th value's five ties; top-p then cuts inside them, past the k-th place
    tied = np.repeat(np.array([[3, 1, 0, 1, 1, -2, 1, 1, 0]], dtype=np.float32), len(u), axis=0)
    for top_p in (0.6, 0.7, 0.75, 0.8, 0.9, 0.99):
        _compare(tied, u, 1.0, top_p, 2)
    picks = sampling.draw(torch.from_numpy(tied), torch.from_numpy(u), 1.0, 0.8, 2).numpy()
    p = np.exp(np.array([3.0, 1, 1, 1, 1, 1]))
    p /= p.sum()
    kept = 1 + int(np.searchsorted(np.cumsum(p[1:]), 0.8 - p[0])) + 1  # 3 and the first ties by id
    assert set(picks) == set([0, 1, 3, 4, 6, 7][:kept])


def test_the_draw_at_a_real_vocabulary_size():
    """151,936 tokens (Qwen2.5's), peaked rows (sample_token sorts its 1024 most probable only) and flat ones."""
    rng = np.random.default_rng(5)
    vocab = 151_936
    logits = rng.normal(size=(4, vocab)).astype(np.float32)
    logits[:2] *= 8  # peaked
    logits[1, rng.integers(vocab, size=50)] = -np.inf
    u = rng.random(4)
    for temperature, top_p, top_k in ((1.0, 1.0, 0), (0.7, 0.8, 20), (0.6, 0.9, 50), (1.0, 0.95, 0)):
        _compare(logits, u, temperature, top_p, top_k)


@pytest.mark.parametrize("path", ["device", "host"])
def test_the_row_sampler_draws_on_the_device_without_a_host_sync(syncs, monkeypatch, path):
    """Each sampled row's token is sample_token of its logits with the reference uniform of its key and step; rows
    marked None are returned unchanged; on the device's path (what a GPU runs, here on CPU tensors) no call that
    would synchronise with a GPU, at any step; the CPU's own path (NumPy per row) picks the same tokens."""
    monkeypatch.setattr(sampling, "ON_HOST", ("cpu",) if path == "host" else ())
    rng = np.random.default_rng(1)
    keys = [None, (0, 3, "none", 0), (0, 3, "none", 1), None, (0, 8, "arm", 2)]  # sampled rows not one run
    for rows in (keys, keys[1:3], keys[:3]):
        seeds = [None if k is None else sampling.sample_seed(*k) for k in rows]
        sampler = sampling.RowSampler(seeds, 0.8, 0.9, 5)
        steps = [torch.from_numpy(rng.normal(size=(len(rows), 97)).astype(np.float32) * 2) for _ in range(6)]
        with syncs.on():
            outs = [sampler(None, scores) for scores in steps]
        if path == "device":
            assert syncs.count == 0, "\n".join(syncs.where)
        for t, (scores, out) in enumerate(zip(steps, outs)):
            for r, k in enumerate(rows):
                if k is None:
                    assert torch.equal(out[r], scores[r])
                    continue
                u = reference_uniforms(*k, t + 1)[t]
                tok = sampling.sample_token(scores[r].numpy(), u, 0.8, 0.9, 5)
                assert torch.isfinite(out[r]).sum() == 1 and out[r, tok] == 0, (r, t)


def test_the_settings_say_how_the_draw_is_made(write_params):
    params = load_params(write_params())
    draw = sampling.settings_for(params.evaluate, None)["draw"]
    assert "splitmix64" in draw and "53 bits" in draw and "device" in draw and "PCG64" not in draw
    for word in ("temperature", "top-k (ties kept)", "top-p (ties by token id)", "float64"):
        assert word in draw


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
    together = {it: text for out in engine.generate([batch], set()) for it, text, *_ in out}
    alone = {it: text for one in batch for out in engine.generate([[one]], set()) for it, text, *_ in out}
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
        update={"shard": Shard(index=0, count=2)})}), "tiny", root=tmp_path / "b")
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

