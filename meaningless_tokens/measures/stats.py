"""The drops of attention on original tokens under each condition against `none`, from an attention artifact
(extract's): per-sample vectors, their averages over samples and the paired bootstrap intervals of the drops.
stages/stats.py's DEFINITIONS names each quantity.

    with store.read_h5(path, "attention", attention_drops.REQUIRED) as f:
        att = attention_drops.read(f, params.stats.query_set)
    results = attention_drops.averages(att, params.stats)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from meaningless_tokens.measures.extract import QUERY_VECTOR, VECTORS, sample_stats
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.intervals import bootstrap_mean_ci, bootstrap_ratio_ci

# the datasets an attention artifact must hold for `read` (each condition's are checked there)
REQUIRED = tuple(f"none/{v}" for v in VECTORS) + ("none/offsets", "none/original_pos")


def per_sample(f, cond: str, query_set: str, n_orig: np.ndarray):
    """Per sample: position-wise averages over original tokens, over the full prompt, span mass."""
    g = f[cond]
    offsets, span = g["offsets"][()], g["span"][()]
    recv, recv_all, mass_span = g[QUERY_VECTOR[query_set]][()], g["recv_all"][()], g["mass_span"][()]
    original_pos = g["original_pos"][()]
    orig_off = np.concatenate([[0], np.cumsum(n_orig)])
    out_orig, out_full, out_span = [], [], []
    for s in range(len(offsets) - 1):
        a, b = offsets[s], offsets[s + 1]
        pos = original_pos[orig_off[s]:orig_off[s + 1]]
        if len(pos) != n_orig[s] or (len(pos) and pos.max() >= b - a):
            raise ArtifactError(f"{f.filename}: {cond}/original_pos does not fit sample {s}")
        o, full, m = sample_stats(recv[:, :, a:b], recv_all[:, :, a:b], mass_span[:, :, a:b], pos, span[s], query_set)
        out_orig.append(o)
        out_full.append(full)
        out_span.append(m)
    return out_orig, out_full, np.stack(out_span)


def pad_mean(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over samples of [L, H, P_s] arrays of different lengths, and the count per position."""
    width = max(r.shape[-1] for r in rows)
    stacked = np.full((len(rows),) + rows[0].shape[:2] + (width,), np.nan)
    for k, r in enumerate(rows):
        stacked[k, :, :, :r.shape[-1]] = r
    count = np.sum(~np.isnan(stacked[:, 0, 0, :]), axis=0)
    return np.nanmean(stacked, axis=0), count


@dataclass
class Attention:
    """What stats reads of one attention artifact: per condition the per-sample vectors (`per_sample`)."""
    conditions: list[str]
    layers: np.ndarray
    heads: np.ndarray
    n_orig: np.ndarray       # original (question) tokens per sample
    per: dict                # condition -> (original rows, full rows, span mass)
    spans: dict              # condition -> [sample, 2] span start and end
    provenance: dict         # the extraction's
    problem_index: np.ndarray


def read(f, query_set: str) -> Attention:
    """The vectors of the open attention artifact `f`, refused (one line naming the file) when a dataset is missing."""
    conditions = [str(c) for c in f.attrs["conditions"]]
    for c in conditions:
        missing = [f"{c}/{v}" for v in VECTORS + ("offsets", "original_pos", "span") if f"{c}/{v}" not in f]
        if missing:
            raise ArtifactError(f"{f.filename}: missing datasets {missing} (truncated or written by another version?)")
    n_orig = np.diff(f["none/offsets"][()])
    return Attention(conditions, f.attrs["layers"], f.attrs["heads"], n_orig,
                     {c: per_sample(f, c, query_set, n_orig) for c in conditions},
                     {c: f[c]["span"][()] for c in conditions}, json.loads(f.attrs["provenance"]),
                     f["problems/index"][()])


def averages(att: Attention, cfg) -> dict[str, dict[str, np.ndarray]]:
    """Per condition: the averaged attention vectors, the span's mass, and against `none` the drops with their
    seeded bootstrap intervals (DEFINITIONS)."""
    first = 1 if cfg.exclude_first else 0
    per, conditions = att.per, att.conditions
    results: dict[str, dict[str, np.ndarray]] = {}
    orig_mean = {c: np.stack([r[:, :, first:].mean(axis=2) for r in per[c][0]]) for c in conditions}  # [S, L, H]
    for c in conditions:
        orig_avg, orig_count = pad_mean(per[c][0])
        full_avg, full_count = pad_mean(per[c][1])
        span_mass = per[c][2]
        lo, hi = bootstrap_mean_ci(span_mass, cfg.seed, n_boot=cfg.n_boot)
        results[c] = {"original_avg": orig_avg, "original_count": orig_count, "full_avg": full_avg,
                      "full_count": full_count, "orig_mean": orig_mean[c], "span_mass": span_mass.mean(axis=0),
                      "span_mass_ci": np.stack([lo, hi]), "span_mass_per_sample": span_mass}
        if c != "none":
            delta = orig_mean["none"] - orig_mean[c]
            dlo, dhi = bootstrap_mean_ci(delta, cfg.seed, n_boot=cfg.n_boot)
            plo, phi = bootstrap_ratio_ci(delta, orig_mean["none"], cfg.seed, n_boot=cfg.n_boot)
            drop = delta.mean(axis=0)
            results[c] |= {"drop": drop, "drop_ci": np.stack([dlo, dhi]),
                           "drop_pct": 100 * drop / orig_mean["none"].mean(axis=0),
                           "drop_pct_ci": 100 * np.stack([plo, phi]),
                           "head_rank": np.argsort(-drop, axis=1, kind="stable").astype(np.int32)}
            results[c] |= layer_drops(orig_mean, c, cfg.seed, cfg.n_boot)
    return results


def layer_drops(orig_mean: dict[str, np.ndarray], c: str, seed: int, n_boot: int) -> dict[str, np.ndarray]:
    """The verdict's per-layer numbers for condition `c` (see DEFINITIONS), each with a paired
    bootstrap interval that resamples problems jointly for every condition."""
    base = orig_mean["none"].mean(axis=2)  # [S, L]: heads averaged per problem
    arms = {k: orig_mean[k].mean(axis=2) for k in ("none", c, "mful") if k in orig_mean}
    n, n_layers = base.shape

    def stats(idx):
        b = base[idx].mean(axis=-2)
        pct = {k: 100 * (b - a[idx].mean(axis=-2)) / b for k, a in arms.items()}
        out = [pct[c]]
        out.append(pct[c][..., :1] - pct[c][..., 1:].max(axis=-1, keepdims=True) if n_layers > 1 else pct[c][..., :0])
        out.append(pct[c] - pct["mful"] if c == "mless" and "mful" in pct else pct[c][..., :0])
        return np.concatenate(out, axis=-1)

    point = stats(np.arange(n))
    rng = np.random.default_rng(seed)
    boots = np.concatenate([stats(rng.integers(0, n, size=(min(1000, n_boot - b), n)))
                            for b in range(0, n_boot, 1000)])
    lo, hi = np.quantile(boots, [0.025, 0.975], axis=0)
    out = {"layer_drop_pct": point[:n_layers], "layer_drop_pct_ci": np.stack([lo, hi])[:, :n_layers]}
    k = n_layers
    if n_layers > 1:
        out |= {"first_layer_lead_pct": point[k:k + 1], "first_layer_lead_pct_ci": np.stack([lo, hi])[:, k:k + 1]}
        k += 1
    if len(point) > k:
        out |= {"mful_gap_pct": point[k:], "mful_gap_pct_ci": np.stack([lo, hi])[:, k:]}
    return out
