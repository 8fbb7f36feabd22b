"""Sampled decoding (`evaluate.sampling`): per-sample seeded draws, pass@k, maj@n and distinct-n diversity.

Each sample of (problem, condition) draws one uniform per decode step t, a pure function of
(evaluate.sampling.seed, problem index, condition, sample index, t): the splitmix64 hash that ARM's draws use
(meaningless_tokens/arm/), computed in integer arithmetic on the device that holds the logits, so every device
draws the same uniforms. The uniform becomes a token by the inverse CDF of the warped distribution (temperature,
then top-k, then top-p, as transformers orders its warpers), batched over the rows on the logits' device with no
copy to the host. A row's tokens therefore depend on its own logits and its own key only, never on the other rows
of its batch or on what ran before (tests/test_sampling.py generates a sample alone and inside a batch).

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

from meaningless_tokens import draws
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
            "draw": "one uniform per decode step t: the top 53 bits of splitmix64 over (seed, problem index, "
                    "condition, sample index, t), computed on the logits' device; the token: inverse CDF of the "
                    "distribution after temperature, top-k (ties kept), top-p (ties by token id), in float64"}


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


def row_state(key: list[int]) -> int:
    """The hash state of one sample's draws from its `sample_seed` [seed, problem index, condition, sample index]:
    draws.key_state of the seed and one key of three words (ARM's keys have one or two, so the streams differ)."""
    return draws.key_state(key[0], [tuple(key[1:])])


def step_uniforms(states, step: int):
    """The uniforms (float64 on [0, 1), 53 bits) of decode step `step` (0: the first new token) for rows whose
    `row_state`s are lanes [rows, 2] (draws.lanes): the top 53 bits of the state after absorbing `step`, computed on
    the lanes' device."""
    import torch

    h = draws.step_states(states, step)
    # hi < 2**32, so hi * 2**21 + (lo >> 11) < 2**53: exact in int64 and in float64
    return ((h[:, 0] << 21) + (h[:, 1] >> 11)).to(torch.float64) * (1.0 / (1 << 53))


def draw(logits, u, temperature: float, top_p: float, top_k: int):
    """`sample_token` of every row of `logits` [rows, vocab] with its uniform `u` [rows] (float64), batched on
    their device without a copy to the host: the token ids, int64 [rows].

    In float64 as `sample_token`. Top-p keeps the smallest prefix, in (probability descending, token id) order, whose
    running sum reaches top_p: every token above the cut's probability and the first m by id of those equal to it.
    So only the probabilities in descending order are needed, never a sort of the token ids: under top-k the top k
    (torch.topk) followed by the other tokens tied with the k-th value (each of that probability), without top-k a
    sort of all. The running sums are float64 cumsums, sequential on the CPU (the same bits as numpy's); a GPU's
    parallel scan can round a sum differently in its last bit, which moves the cut only where top_p equals a
    partial sum to about 1e-16."""
    import torch

    x = logits.to(torch.float64, copy=True).div_(temperature)
    rows, vocab = x.shape
    k = min(top_k, vocab) if top_k else vocab
    if top_k:  # ties with the k-th value stay (transformers' TopKLogitsWarper); with fewer finite values kth = -inf
        kth = torch.topk(x, k, dim=-1).values[:, -1:]
        x.masked_fill_(x < kth, float("-inf"))
    p = x.sub_(x.max(dim=-1, keepdim=True).values).exp_()
    p.div_(p.sum(dim=-1, keepdim=True))
    if top_p < 1.0:
        if k < vocab:  # the top k, then the tokens tied with the k-th value past the k-th place (`extra` of them)
            top = torch.topk(p, k, dim=-1).values
            q = top[:, -1:]
            extra = (p == q).sum(-1, keepdim=True) - (top == q).sum(-1, keepdim=True)
            run = torch.cumsum(torch.cat([top, q.expand(rows, vocab - k)], dim=1), dim=-1)
        else:
            top = torch.sort(p, dim=-1, descending=True).values
            q, extra = top[:, -1:], 0
            run = torch.cumsum(top, dim=-1)
        target = torch.full((rows, 1), top_p, dtype=torch.float64, device=p.device)
        cut = torch.searchsorted(run, target)                             # the first place the sum reaches top_p
        keep_all = cut >= k + extra
        tau = torch.where(cut < k, top.gather(1, cut.clamp(max=k - 1)), q)
        m = cut + 1 - (top > tau).sum(-1, keepdim=True)                   # how many tokens equal to tau stay
        tie = p == tau
        kept = (p > tau) | (tie & (torch.cumsum(tie, dim=-1, dtype=torch.int32) <= m)) | keep_all
        p.masked_fill_(~kept, 0.0)
    cdf = torch.cumsum(p, dim=-1)
    tok = torch.searchsorted(cdf, u.to(torch.float64)[:, None] * cdf[:, -1:], right=True)
    return tok[:, 0].clamp(max=vocab - 1)


ON_HOST = ("cpu",)  # devices whose rows are drawn one by one with NumPy (tests point it elsewhere to run the other)


class RowSampler:
    """A transformers logits processor that draws each sampled row's next token (`draw` with the row's uniform of
    the step) and leaves only that token finite, so greedy search (do_sample=False) takes it; rows marked None are
    left alone. `seeds`: per row its `sample_seed` or None.

    No host-device synchronisation at a step: the step is counted on the host, and the rows' hash states (with
    their batch indices where the sampled rows are not one run) go to the logits' device once, at the first step."""

    def __init__(self, seeds: list[list[int] | None], temperature: float, top_p: float, top_k: int):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.rows = [r for r, s in enumerate(seeds) if s is not None]
        self.host = draws.lanes([row_state(seeds[r]) for r in self.rows])
        run = self.rows == list(range(self.rows[0], self.rows[-1] + 1)) if self.rows else True
        self.run = slice(self.rows[0], self.rows[-1] + 1) if self.rows and run else None
        self.step, self.prepared = 0, None

    def prepare(self, device) -> tuple:
        """(the sampled rows: a slice when they are one run, else their indices on the device; their states)."""
        import torch

        if self.run is not None:
            return self.run, self.host.to(device)
        dev = torch.cat([torch.tensor(self.rows)[:, None], self.host], dim=1).to(device)
        return dev[:, 0], dev[:, 1:]

    def __call__(self, input_ids, scores):
        import torch

        step, self.step = self.step, self.step + 1
        if not self.rows:
            return scores
        if self.prepared is None:
            self.prepared = self.prepare(scores.device)
        where, states = self.prepared
        picked = scores[where] if isinstance(where, slice) else scores.index_select(0, where)
        u = step_uniforms(states, step)
        if scores.device.type in ON_HOST:
            # the host's own rows: NumPy's partition-based draw per row, faster there than the batched sort and the
            # same token (`draw` equals `sample_token` for the same uniform; tests/test_sampling.py)
            rows, us = picked.float().numpy(), u.tolist()
            tok = torch.tensor([sample_token(rows[r], us[r], self.temperature, self.top_p, self.top_k)
                                for r in range(len(us))], dtype=torch.long)
        else:
            tok = draw(picked, u, self.temperature, self.top_p, self.top_k)
        only = torch.full_like(picked, float("-inf")).scatter_(1, tok[:, None], 0.0)
        out = scores.clone()
        if isinstance(where, slice):
            out[where] = only
        else:
            out.index_copy_(0, where, only)
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
