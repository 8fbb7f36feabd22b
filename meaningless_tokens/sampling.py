"""Sampled decoding (`evaluate.sampling`): per-sample seeded draws, pass@k, maj@n and distinct-n diversity.

Each sample of (problem, condition) draws its tokens from a generator of its own, seeded with
(evaluate.sampling.seed, problem index, condition, sample index): one uniform per decode step, turned into a
token by the inverse CDF of the warped distribution (temperature, then top-k, then top-p, as transformers orders
its warpers). A row's tokens therefore depend on its own logits and its own seed only, never on the other rows of
its batch or on what ran before (tests/test_sampling.py generates a sample alone and inside a batch).

Metrics per condition, macro-averaged over problems (the paper's pass@3 is `1 - C(n-c, 3) / C(n, 3)`, averaged
over problems, c correct of n samples):
  pass@k   the unbiased estimator 1 - C(n-c, k) / C(n, k), every k <= n (Chen et al. 2021)
  maj@n    right when the most frequent extracted answer among the n samples is right (ties: the answer seen
           first; samples with no extracted answer do not vote; none voting: wrong)
  distinct-m   for m = 1..4: distinct word m-grams / all word m-grams over the n samples of a problem
           (Li et al. 2016); distinct-2 is what this project takes as the paper's "2-gram diversity score"
Contrasts (c - none for every other condition) are paired over problems with a seeded bootstrap interval.
"""

from __future__ import annotations

from collections import Counter
from math import comb

import numpy as np

from meaningless_tokens.config import CONDITIONS, Evaluate
from meaningless_tokens.intervals import bootstrap_mean_ci

# transformers' values when neither the call nor the checkpoint's generation_config sets them
# (GenerationConfig's "global defaults": what generate(do_sample=True) applies)
HF_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}
NGRAMS = (1, 2, 3, 4)


def settings_for(cfg: Evaluate, generation_config) -> dict:
    """The sampling values a run uses (`cfg`: params' evaluate) and where each came from (params,
    generation_config, transformers default)."""
    s = cfg.sampling
    values, origin = {}, {}
    for key in ("temperature", "top_p", "top_k"):
        given = getattr(s, key)
        from_config = getattr(generation_config, key, None) if generation_config is not None else None
        if given is not None:
            values[key], origin[key] = given, "params"
        elif from_config is not None:
            values[key], origin[key] = from_config, "generation_config"
        else:
            values[key], origin[key] = HF_DEFAULTS[key], "transformers default"
    values["top_k"] = int(values["top_k"]) if values["top_k"] else 0
    values["temperature"], values["top_p"] = float(values["temperature"]), float(values["top_p"])
    return {"n": s.n, "max_new_tokens": s.max_new_tokens or cfg.max_new_tokens, "seed": s.seed,
            **values, "origin": origin,
            "draw": "one uniform per step from numpy PCG64 seeded with (seed, problem index, condition, sample "
                    "index); inverse CDF of the distribution after temperature, top-k, top-p (float64)"}


def sample_seed(seed: int, index: int, condition: str, sample: int) -> list[int]:
    return [seed, index, CONDITIONS.index(condition), sample]


def sample_token(logits: np.ndarray, u: float, temperature: float, top_p: float, top_k: int) -> int:
    """The token that uniform `u` in [0, 1) picks from one row of logits after temperature, top-k and top-p."""
    x = logits.astype(np.float64) / temperature
    finite = np.isfinite(x)
    if top_k and top_k < int(finite.sum()):
        kth = np.partition(x[finite], -top_k)[-top_k]
        x = np.where(x < kth, -np.inf, x)  # ties with the k-th value stay, as transformers' TopKLogitsWarper keeps them
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        # the smallest set of most probable tokens whose mass reaches top_p (at least one); ties by token id
        cand = np.flatnonzero(p > 0)
        if len(cand) > 1024:  # the nucleus is among the most probable tokens: sort those first, all only if needed
            top = cand[np.argpartition(-p[cand], 1023)[:1024]]
            cand = top if p[top].sum() >= top_p else cand
        order = cand[np.lexsort((cand, -p[cand]))]
        cut = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(p) - 1))


class RowSampler:
    """A transformers logits processor that draws each row's next token with the row's own generator and leaves
    only that token finite, so greedy search (do_sample=False) takes it; rows marked None are left alone."""

    def __init__(self, seeds: list[list[int] | None], temperature: float, top_p: float, top_k: int):
        self.rngs = [None if s is None else np.random.Generator(np.random.PCG64(np.random.SeedSequence(s)))
                     for s in seeds]
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def __call__(self, input_ids, scores):
        import torch

        rows = scores.detach().to("cpu", torch.float32).numpy()
        out = scores.clone()
        for r, rng in enumerate(self.rngs):
            if rng is None:
                continue
            tok = sample_token(rows[r], float(rng.random()), self.temperature, self.top_p, self.top_k)
            out[r] = float("-inf")
            out[r, tok] = 0.0
        return out


# ---- metrics ------------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct among n samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"k must be in 1..n (k={k}, n={n})")
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_right(answers: list[str], correct: list[bool]) -> bool:
    """maj@n: the most frequent non-empty answer (ties: the one seen first) decides."""
    votes = Counter(a for a in answers if a)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in answers if a and votes[a] == top)
    return bool(correct[answers.index(winner)])


def distinct_n(texts: list[str], m: int) -> float:
    """Distinct word m-grams / all word m-grams over the texts (0 when they hold no m-gram)."""
    grams = [tuple(w[i:i + m]) for w in (t.split() for t in texts) for i in range(len(w) - m + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def summarize(outputs: dict[str, list[list[str]]], extracted: dict[str, list[list[str]]],
              correct: dict[str, np.ndarray], paper: dict[str, np.ndarray], seed: int) -> dict:
    """Metrics of the sampled outputs: per condition [problems][samples] texts, answers and grades."""
    conds = list(correct)
    n = correct[conds[0]].shape[1]
    per_problem: dict[str, dict[str, np.ndarray]] = {c: {} for c in conds}
    for c in conds:
        counts, pcounts = correct[c].sum(axis=1), paper[c].sum(axis=1)
        for k in range(1, n + 1):
            per_problem[c][f"pass@{k}"] = np.array([pass_at_k(n, int(x), k) for x in counts])
            per_problem[c][f"paper_pass@{k}"] = np.array([pass_at_k(n, int(x), k) for x in pcounts])
        per_problem[c][f"maj@{n}"] = np.array([majority_right(a, list(ok)) for a, ok in zip(extracted[c], correct[c])],
                                              dtype=np.float64)
        for m in NGRAMS:
            per_problem[c][f"distinct-{m}"] = np.array([distinct_n(texts, m) for texts in outputs[c]])
    names = list(per_problem[conds[0]])
    m = {"n": n, "n_problems": int(correct[conds[0]].shape[0]),
         **{name: {c: float(per_problem[c][name].mean()) for c in conds} for name in names}}
    # each condition's own interval (bootstrap over problems), beside the paired contrasts below
    bounds = {name: {c: bootstrap_mean_ci(per_problem[c][name], seed) for c in conds} for name in names}
    m["ci95_low"] = {name: {c: float(b[c][0]) for c in conds} for name, b in bounds.items()}
    m["ci95_high"] = {name: {c: float(b[c][1]) for c in conds} for name, b in bounds.items()}
    for c in conds:
        if c == "none":
            continue
        m[f"{c}-none"] = {}
        for name in names:
            diff = per_problem[c][name] - per_problem["none"][name]
            lo, hi = bootstrap_mean_ci(diff, seed)
            m[f"{c}-none"][name] = {"delta": float(diff.mean()), "ci95_low": float(lo), "ci95_high": float(hi)}
    return m
