"""Layer 0's attention recomputed by hand for the tests (tests/test_extract.py, tests/test_families.py): softmax of
scaled q.k from the module's own projections, with the model's own mask, itself checked against a mask built here
(causal, and the band of a sliding window)."""

from __future__ import annotations

import importlib

import numpy as np
import torch


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
