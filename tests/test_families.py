"""Every decoder-only family: tiny random models of nine families of the installed transformers.

For each: the probe accepts it (family: null, read from its config), the captured layer 0 equals an
independent recomputation (softmax of scaled q.k with the model's own mask), a model loaded with
only its first layers captures exactly what the full model captures, and evaluation (generation
and grading) runs on it.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import torch

from meaningless_tokens import capture
from meaningless_tokens import models
from stages import evaluate
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500
from meaningless_tokens.prompts import PromptBuilder
from tests import tiny

EXTRA = [f for f in tiny.FAMILIES if f not in tiny.ARCHS]


@pytest.fixture(scope="session")
def family_dirs(tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny-families")
    return {**tiny_dirs, **{f: tiny.build(f, base / f) for f in EXTRA}}


def family_params(write_params, path, **top):
    raw = load_params(write_params()).model_dump()
    raw["evaluate"].update(n_samples=2, max_new_tokens=6, batch_size=6, stop_at_boxed=True)
    raw["models"] = {"tiny": {"display_name": "Tiny", "family": None, "source": {"kind": "local_dir", "path": str(path)},
                              "layers": [0, 1], "heads": "all"}}
    raw.update(top)
    return load_params(write_params(raw))


def layer0_inputs(model, ids):
    """What the model passes to layer 0's attention: the normed hidden states, the rotary table
    and its own attention mask (eager: 0 where allowed, a large negative number elsewhere)."""
    seen = {}

    def hook(module, args, kwargs):
        seen.update(kwargs)
        if args:
            seen["hidden_states"] = args[0]

    attn = model.get_decoder().layers[0].self_attn
    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        handle.remove()
    return attn, seen


def recompute_layer0(model, ids, softcap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities [H, T, T], the model's own mask as allowed [T, T]) of layer 0, from its own
    projections: q = W_q h, k = W_k h (per family: fused qkv, q/k norms), rotary, scores scaled by
    the module's scaling, Gemma 2's logit softcapping, the model's mask, softmax."""
    attn, seen = layer0_inputs(model, ids)
    fam = importlib.import_module(type(attn).__module__)
    h = seen["hidden_states"]
    T, hd = h.shape[1], attn.head_dim
    cfg = model.config
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    with torch.no_grad():
        if hasattr(attn, "qkv_proj"):  # phi3: one fused projection
            qkv = attn.qkv_proj(h)
            q, k = qkv[..., : n_q * hd], qkv[..., n_q * hd: (n_q + n_kv) * hd]
        else:
            q, k = attn.q_proj(h), attn.k_proj(h)
        per_head_norm = hasattr(attn, "q_norm") and attn.q_norm.weight.shape[0] == hd
        if hasattr(attn, "q_norm") and not per_head_norm:  # olmo2: norms over all heads, before the split
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q.view(1, T, n_q, hd).transpose(1, 2)
        k = k.view(1, T, n_kv, hd).transpose(1, 2)
        if per_head_norm:  # qwen3, gemma3: one norm per head
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = seen["position_embeddings"]
        q, k = fam.apply_rotary_pos_emb(q, k, cos, sin)
        k = k.repeat_interleave(n_q // n_kv, dim=1)
        scores = (q @ k.transpose(2, 3)) * attn.scaling
        cap = getattr(cfg, "attn_logit_softcapping", None)
        if cap and softcap:
            scores = torch.tanh(scores / cap) * cap
        mask = seen["attention_mask"]
        allowed = (mask[0, 0] == 0).numpy()
        probs = torch.softmax(scores + mask, dim=-1)[0]
    return probs.numpy(), allowed


def own_mask(model, T) -> np.ndarray:
    """Causal, and a band of the sliding window where layer 0 slides."""
    cfg = model.config
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = j <= i
    types = getattr(cfg, "layer_types", None)
    sliding = types[0] == "sliding_attention" if types else bool(getattr(cfg, "sliding_window", None))
    if sliding:
        allowed &= (i - j) < cfg.sliding_window
    return allowed


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_family_probe_recomputation_and_partial_load(family, family_dirs, write_params, cache_dir, tmp_path):
    params = family_params(write_params, family_dirs[family])
    setup = models.setup_for(params, "tiny")
    prepared = setup.prepared
    assert prepared.facts["model_type"] == {"gemma3": "gemma3_text"}.get(family, family)
    probe = prepared.manifest()["probe"]
    assert probe["passed"] and probe["max_abs_diff"] <= 1e-6 and probe["max_row_sum_error_below"] <= 1e-6
    if family in ("gemma2", "gemma3"):  # layer 0 and the first layer of the other type
        assert probe["layers"] == [0, 1 if family == "gemma2" else 2]

    full, tokenizer = models.load(setup)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    ids = PromptBuilder(params.prompt, tokenizer, "raw", params.file).build(problems[3])["mless"].input_ids
    assert len(ids) > tiny.WINDOW
    expected, allowed = recompute_layer0(full, ids)
    assert np.array_equal(allowed, own_mask(full, len(ids)))

    part, _ = models.load(setup, layers=[0, 1])
    assert len(part.get_decoder().layers) == 2 and len(full.get_decoder().layers) == 4
    capture.install_capture(part)
    captured = capture.attention(part, ids, [0, 1])
    np.testing.assert_allclose(captured[0].numpy(), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(captured[0].sum(-1).numpy(), 1.0, atol=1e-6)
    capture.install_capture(full)
    whole = capture.attention(full, ids, [0, 1])
    for layer in (0, 1):  # the truncated model captures exactly what the whole model does
        assert (captured[layer] - whole[layer]).abs().max().item() == 0
    if family == "gemma2":  # the cap is in effect: without it the probabilities differ
        uncapped, _ = recompute_layer0(full, ids, softcap=False)
        assert np.abs(uncapped - expected).max() > 1e-3


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_family_evaluation_generates_and_grades(family, family_dirs, write_params, cache_dir, tmp_path):
    params = family_params(write_params, family_dirs[family])
    out = evaluate.run(params, "tiny", root=tmp_path)
    metrics = json.loads((tmp_path / "metrics/accuracy/tiny.json").read_text())
    assert metrics["n_problems"] == 2 and set(metrics["accuracy"]) == {"none", "mless", "mful"}
    assert all(0 < t <= 6 for t in metrics["mean_tokens"].values())
    assert out.is_file()
