"""Reductions of attention probabilities, shared by the extract, stats and sweep stages.

Extraction keeps, per prompt, layer and head, only vectors over key positions (`reduce`); the statistics
average them (`sample_stats`); the sweep computes the same statistics on the fly, so its numbers are these
by construction.
"""

from __future__ import annotations

import numpy as np

# How `make verify` compares this measure's outputs (meaningless_tokens/verify/kinds.py assembles KINDS from every
# measure's): (artifact kind of store.PATHS, key glob, kind of quantity of verify's TOLERANCES), first match wins
QUANTITIES = (
    ("attention", "*/recv_*", "attention-received"),
)

# the conditions that differ in their prompt; `arm` (the none prompt, edited in layer 0's MLP) is skipped
PROMPT_CONDITIONS = ("none", "mless", "mful")

VECTORS = ("recv_all", "recv_original", "recv_last", "mass_span", "mass_first")
QUERY_SETS = {
    "recv_all": "all queries i >= j (the causal set), original and span tokens alike",
    "recv_original": "original (none) tokens among the queries i >= j; span queries excluded",
    "recv_last": "the last prompt token only",
}


def reduce(probs: np.ndarray, span: tuple[int, int], original_pos) -> dict[str, np.ndarray]:
    """The stored vectors of one prompt from its probabilities [L, H, T, T]."""
    start, end = span
    return {
        "recv_all": probs.sum(axis=2),
        "recv_original": probs[:, :, list(original_pos), :].sum(axis=2),
        "recv_last": probs[:, :, -1, :],
        "mass_span": probs[:, :, :, start:end].sum(axis=3),
        "mass_first": probs[:, :, :, 0],
    }


QUERY_VECTOR = {"original": "recv_original", "all": "recv_all", "last": "recv_last"}


def sample_stats(recv: np.ndarray, recv_all: np.ndarray, mass_span: np.ndarray, pos: np.ndarray,
                 span, query_set: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One prompt's [L, H, T] vectors -> (original_avg [L, H, N], full_avg [L, H, T], span_mass [L, H]).

    `recv` is the query set's received-attention vector, `pos` the positions of the N original tokens.
    The sweep stage calls this too, so its numbers are these statistics by construction."""
    T, n = recv.shape[-1], len(pos)
    queries = {"original": n - np.arange(n), "all": T - pos, "last": np.ones(n)}[query_set]
    start, end = span
    after = pos[pos >= end] if end > start else np.array([], dtype=int)
    return (recv[:, :, pos] / queries, recv_all / (T - np.arange(T)),
            mass_span[:, :, after].mean(axis=2) if len(after) else np.zeros(recv.shape[:2]))
