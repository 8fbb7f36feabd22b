"""ARM, the paper's Activation Redistribution Module, as a forward hook on layer 0's gated MLP.

The condition `arm` is the `none` prompt with `a = act_fn(gate_proj(x))` of decoder layer 0 edited
before the product with `up_proj(x)` (notes/paper-method.md, section 2; the paper's code puts the same
edit into copied model files for three families). Two variants, as in that code:

  llama (its Qwen2 and Llama files)  eps = 1.4826 * MAD(|a|) * c, S = share of |a| < eps; the
        n = max(1, round(clamp(k * S, pmin, pmax) * N)) elements of smallest |a| move to sign * u * top
        (top = the `percentage` percentile of the signed a, 0..100) or to -u * |min a| when negative
  gemma (its Gemma 3 file)  every element with |a| <= the c-quantile of |a| moves (ties included), to
        u * top (top = the `percentage` quantile of |a|, 0..1) or -u * |min a|; k, pmin, pmax unused

with u uniform on [0, 1) and 0 counted as positive. Every element has its own u, a pure function of (arm.seed, the
row's key, step, the element's index) computed by integer hashing on the tensor's device: the same numbers on any
device, and an element crossing the cut changes no other element's draw. Key: the problem index of a greedy row,
(problem index, sample index) of a sampled one; under `pool: batch` the arm rows' keys in batch order. Step 0 is the
prompt, step t the t-th decode step. Index: the element's place in the row's edited activations flattened over its
real tokens (a left-padded prompt draws what it draws unpadded; a decode step's row: its channel).

Differences from the paper's code: DIFFERENCES below (docs/measures.md and the report list the same).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from meaningless_tokens.config import Arm
from meaningless_tokens.errors import ConfigError

VARIANTS = ("llama", "gemma")
DIFFERENCES = (
    "Seeded: each element's uniform is a hash (splitmix64) of (arm.seed, the row's problem index and, for a sampled "
    "output, its sample index, step, the element's index among the row's real tokens' activations), step 0 being the "
    "prompt and step t the t-th decode step, computed in integer arithmetic on the tensor's device, so reruns are "
    "byte-identical and a GPU draws what the CPU draws (the paper's torch.rand has no seed).",
    "Statistics per sequence over its own non-pad positions (arm.pool: row), so a row's output does not depend "
    "on its batch; the paper's code pools over the whole tensor it is given, batch and pad positions included "
    "(arm.pool: batch reproduces that over the batch's arm rows).",
    "A forward hook on layer 0's act_fn for every family with a gated MLP instead of copied model files for "
    "three families; arm rows share a batch with the other conditions' rows, which the hook leaves untouched.",
    "Percentiles in float32 on the tensor's device (the paper's llama variant copies the activations to the "
    "CPU for np.percentile at every step, which also fails on bfloat16).",
    "Ties in |a| at the llama variant's cut are broken by position (the first ones move); the paper's torch.topk "
    "leaves that to the kernel. Each element has its own draw, so an element crossing the cut changes its own "
    "value and its partner's, no other.",
    "A tensor without negative activations gets |min a| = 0 (the paper's llama variant raises an error there: "
    "it reads `device` before assigning it).",
    "Both variants draw one uniform per element of the tensor and use those at the moved positions, as the "
    "paper's gemma variant does; the paper's llama variant draws one per moved element in torch.topk's order "
    "(same distribution, other numbers).",
    "arm.apply: prefill leaves decode steps alone; the paper's code edits the prompt and every decode step "
    "(arm.apply: all, the default).",
)
# The paper's per-model (c, percentage) per benchmark (`choose_parameters` in each of its benchmark folders), by
# Hugging Face repo id; OFF: the paper runs that model on that benchmark without ARM. `dataset.benchmark` selects
# the column (other: MATH-500's). The llama variant's pmin/pmax come from the family's model file (Qwen2 0.02/0.25,
# Llama 0.20/0.25).
OFF = None
PAPER_BY_BENCHMARK = {
    "math500": {
        "qwen/qwen2.5-math-1.5b": (0.13, 99.5), "qwen/qwen2.5-math-7b": (0.1, 95.0),
        "qwen/qwen2.5-7b-instruct": (0.1, 99.5), "qwen/qwen2.5-32b-instruct": OFF,
        "meta-llama/llama-3.1-8b-instruct": (0.32, 90.0),
        "google/gemma-3-4b-it": (0.25, 0.85), "google/gemma-3-27b-it": (0.25, 0.85)},
    "aime2024": {
        "qwen/qwen2.5-math-1.5b": (0.13, 99.5), "qwen/qwen2.5-math-7b": (0.05, 90.0),
        "qwen/qwen2.5-7b-instruct": OFF, "qwen/qwen2.5-32b-instruct": (0.13, 99.5),
        "meta-llama/llama-3.1-8b-instruct": (0.32, 90.0),
        "google/gemma-3-4b-it": (0.25, 0.85), "google/gemma-3-27b-it": (0.25, 0.965)},
    "aime2025": {
        "qwen/qwen2.5-math-1.5b": (0.13, 99.5), "qwen/qwen2.5-math-7b": (0.13, 99.5),
        "qwen/qwen2.5-7b-instruct": (0.1, 99.5), "qwen/qwen2.5-32b-instruct": (0.05, 99.0),
        "meta-llama/llama-3.1-8b-instruct": OFF,
        "google/gemma-3-4b-it": (0.25, 0.85), "google/gemma-3-27b-it": (0.25, 0.7)},
}
PAPER = PAPER_BY_BENCHMARK["math500"]
# Fallbacks for models the paper has no entry for: its arm.py's (0.13, 99.5) for the llama variant;
# the gemma variant's percentage is a quantile (0..1), so its fallback is the paper's Gemma 3 entry.
FALLBACK = {"llama": (0.13, 99.5), "gemma": (0.25, 0.85)}
PMIN_PMAX = {"llama": (0.20, 0.25)}   # the Llama file's defaults; every other family: the Qwen2 file's
QWEN_PMIN_PMAX = (0.02, 0.25)
K = 1.0


@dataclass(frozen=True)
class ArmSettings:
    variant: str
    c: float
    percentage: float
    k: float
    pmin: float
    pmax: float
    pool: str
    apply: str
    seed: int
    origin: dict  # where each of c, percentage, k, pmin, pmax came from: params, paper (<repo>), fallback

    def describe(self) -> dict:
        return asdict(self)


def model_type(facts: dict) -> str:
    """The text model's model_type from a prepared manifest's facts (gemma3's wrapper: gemma3_text)."""
    return facts.get("text_model_type") or facts["model_type"]


def variant_for(model_type: str) -> str:
    return "gemma" if model_type.startswith("gemma") else "llama"


def check_setting(variant: str, c: float, percentage: float, only: str | None = None) -> str | None:
    """Why (c, percentage) is outside the variant's range (None when it is not); `only`: check that key alone."""
    if only in (None, "percentage"):
        if variant == "llama" and not 0 <= percentage <= 100:
            return (f"{percentage} is outside [0, 100], the llama variant's range (a percentile of the signed "
                    "activations, in percent)")
        if variant == "gemma" and not 0 <= percentage <= 1:
            return (f"{percentage} is outside [0, 1], the gemma variant's range (a quantile of |a|; the paper's code "
                    f"divides values above 1 by 100: write {percentage / 100:g})")
    if only in (None, "c"):
        if variant == "gemma" and not 0 < c <= 1:
            return f"{c} is outside (0, 1], the gemma variant's range (the share of activations moved)"
        if variant == "llama" and not c > 0:
            return f"{c} is not positive (the llama variant's near-zero radius is 1.4826 * MAD * c)"
    return None


def settings_for(cfg: Arm, benchmark: str, setup) -> ArmSettings:
    """The ARM settings of a stage's model (a models.ModelSetup) under params' `arm` and the dataset's
    benchmark; raises ConfigError naming the key for values outside the variant's range.

    Needs only the model's model_type (from its prepared manifest), so it runs before any model is loaded."""
    spec, own = setup.spec, setup.spec.arm
    name, mtype = setup.name, model_type(setup.facts)
    where = f"{setup.where}.arm"
    variant = variant_for(mtype) if cfg.variant == "auto" else cfg.variant
    repo = spec.source.repo_id.lower() if spec.source.kind == "hf" else None
    benchmark = benchmark if benchmark in PAPER_BY_BENCHMARK else "math500"
    table = PAPER_BY_BENCHMARK[benchmark]
    if repo in table and table[repo] is OFF and (own.c is None or own.percentage is None):
        raise ConfigError(f"{where}: the paper runs {spec.source.repo_id} on {benchmark} without ARM; set "
                          f"models.{name}.arm.c and percentage to run it anyway, or leave arm out of prompt.conditions")
    paper = table.get(repo) if repo else None
    if paper is not None and variant_for(mtype) != variant:
        paper = None  # the paper's values belong to the variant its code uses for this model
    base_c, base_p = paper or FALLBACK[variant]
    base_lo, base_hi = PMIN_PMAX.get(mtype, QWEN_PMIN_PMAX)
    tag = f"paper ({spec.source.repo_id}, {benchmark})" if paper else f"fallback ({variant} variant)"
    lo_tag = {"llama": "paper (Llama file)", "qwen2": "paper (Qwen2 file)"}.get(mtype, "fallback (Qwen2 file)")
    values, origin = {}, {}
    for key, base, base_tag in (("c", base_c, tag), ("percentage", base_p, tag), ("k", K, "paper (k = 1)"),
                                ("pmin", base_lo, lo_tag), ("pmax", base_hi, lo_tag)):
        given = getattr(own, key)
        values[key] = float(base if given is None else given)
        origin[key] = base_tag if given is None else "params"
    for key in ("percentage", "c"):
        why = check_setting(variant, values["c"], values["percentage"], key)
        if why:
            raise ConfigError(f"{where}.{key}: {why}")
    if values["pmin"] > values["pmax"]:
        raise ConfigError(f"{where}.pmin: {values['pmin']} is greater than pmax {values['pmax']}"
                          f" ({origin['pmax']})")
    return ArmSettings(variant, values["c"], values["percentage"], values["k"], values["pmin"], values["pmax"],
                       cfg.pool, cfg.apply, cfg.seed, origin)


def layer0_mlp(model, setup, key: str = "prompt.conditions"):
    """Decoder layer 0's MLP, refusing a model whose MLP is not gated (ARM edits act_fn(gate_proj(x)));
    `setup`: the stage's models.ModelSetup (its name and params file are named in the error), `key`: the params
    key that asked for `arm`."""
    name = setup.name
    mlp = getattr(model.get_decoder().layers[0], "mlp", None)
    if not all(hasattr(mlp, k) for k in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        raise ConfigError(
            f"{setup.params_file}: {key}: 'arm' needs a gated MLP with gate_proj, up_proj and act_fn in layer 0, "
            f"but model '{name}' has {type(mlp).__name__} (model_type {model.config.model_type!r})")
    # the hook sits on the act_fn module: one instance shared by several layers would fire in all of them
    if any(getattr(getattr(block, "mlp", None), "act_fn", None) is mlp.act_fn for block in model.get_decoder().layers[1:]):
        raise ConfigError(f"{setup.params_file}: {key}: 'arm' needs layer 0's own act_fn module, but model "
                          f"'{name}' shares one act_fn instance between layers")
    return mlp


# ---- the draws ---------------------------------------------------------------------------------------
# Each element's uniform is splitmix64 (Steele, Lea and Flood 2014; the finalizer of Java's SplittableRandom)
# absorbing, one word at a time, h = splitmix64(h xor word): h starts at arm.seed (mod 2**64), then takes the
# edit's key (per row pooled: its length, then its words), the step and the element's index; u = the top 24 bits
# of h / 2**24, a float32 on [0, 1). A pure function of those integers, so every device draws the same numbers.
# The host folds the words it knows (`stream`) in Python ints; the device folds the rest (`uniforms`).

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix(x: int) -> int:
    z = (x + _GAMMA) & _M64
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def absorb(h: int, *words: int) -> int:
    """The state h after absorbing `words` (Python ints, taken mod 2**64)."""
    for w in words:
        h = _splitmix(h ^ (w & _M64))
    return h


def row_key(row) -> tuple:
    """A row's key: its problem index (greedy), or (problem index, sample index) for a sampled output."""
    return row if isinstance(row, tuple) else (row,)


def key_state(seed: int, keys: list) -> int:
    """The state after arm.seed and the keys of the rows one edit pools (one row's under `pool: row`; the arm
    rows' keys in batch order under `pool: batch`), each key as its length and then its words."""
    h = seed & _M64
    for key in keys:
        h = absorb(h, len(key), *key)
    return h


def stream(seed: int, keys: list, step: int) -> int:
    """The state of one edit's draws: (arm.seed, the pooled rows' keys, step), step 0 being the prompt and step t
    the t-th decode step; `edit` takes it, and `lanes` of several make `edit_rows`' states."""
    return absorb(key_state(seed, keys), step)


def lanes(states: list[int]):
    """States as a CPU int64 tensor [len, 2] of their 32-bit halves (high, low): torch has no uint64."""
    import torch

    return torch.tensor([[h >> 32, h & _M32] for h in states], dtype=torch.int64).reshape(-1, 2)


# torch has no unsigned 64-bit integers, and int64 overflow is undefined in its kernels: a 64-bit state is two
# 32-bit lanes (hi, lo) held in int64, and every product is a 32-bit lane times a 16-bit half of a constant
# (< 2**48), so no intermediate reaches 2**63 and every value stays non-negative: right shifts never drag in a
# sign bit, and a mask after each sum and shifted-left term keeps a lane at 32 bits. The same code runs on Python
# ints (a host state) and on tensors of any device.

def _mul32(x, c: int):
    """x * c mod 2**32 (x a 32-bit lane, c a 32-bit constant)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mul64(hi, lo, c: int):
    """(hi, lo) * c mod 2**64."""
    c_hi, c_lo = c >> 32, c & _M32
    t, u = lo * (c_lo & 0xFFFF), lo * (c_lo >> 16)
    s = t + ((u & 0xFFFF) << 16)
    carry = (s >> 32) + (u >> 16)  # the high half of lo * c_lo
    return (carry + _mul32(hi, c_lo) + _mul32(lo, c_hi)) & _M32, s & _M32


def _xorshift(hi, lo, k: int):
    """(hi, lo) ^ ((hi, lo) >> k), 0 < k < 32."""
    return hi ^ (hi >> k), lo ^ ((((hi << (32 - k)) & _M32) | (lo >> k)))


def _absorb_lanes(hi, lo, w_hi, w_lo):
    """`absorb` of one word on lanes: splitmix64(h xor w)."""
    hi, lo = hi ^ w_hi, lo ^ w_lo
    lo = lo + (_GAMMA & _M32)
    hi = (hi + (_GAMMA >> 32) + (lo >> 32)) & _M32
    lo = lo & _M32
    hi, lo = _mul64(*_xorshift(hi, lo, 30), _MIX1)
    hi, lo = _mul64(*_xorshift(hi, lo, 27), _MIX2)
    return _xorshift(hi, lo, 31)


def _state_lanes(state):
    """A state (a Python int, or int64 lanes [..., 2] on a device) as (hi, lo) broadcasting over elements [..., n]."""
    if isinstance(state, int):
        return state >> 32, state & _M32
    return state[..., 0:1], state[..., 1:2]


def uniforms(state, index):
    """The uniforms (float32 on [0, 1)) of elements `index` (int64 tensor, >= 0) under `state` (a Python int from
    `stream`, or lanes [2] / [rows, 2] for index [n] / [rows, n]); computed on index's device."""
    import torch

    hi, lo = _state_lanes(state)
    hi, _ = _absorb_lanes(hi, lo, index >> 32, index & _M32)
    return (hi >> 8).to(torch.float32) * (1.0 / (1 << 24))


def step_states(base, step):
    """Lanes [rows, 2] of the states at `step` (a Python int, or a 0-d int64 tensor on base's device: the hook's
    clock) from lanes [rows, 2] of `key_state`s, on their device (no copy)."""
    import torch

    return torch.cat(_absorb_lanes(base[:, 0:1], base[:, 1:2], step >> 32, step & _M32), dim=1)


# ---- the edit --------------------------------------------------------------------------------------

# device types whose tensors the host reads without waiting for a device: there the edit reads its count to select
# the cut by kthvalue and hashes only the moved elements; elsewhere it selects by a sort and hashes every element.
# The values are the same (tests/test_arm.py checks both paths on the CPU).
ON_HOST = ("cpu",)


def _on_host(t) -> bool:
    """Whether the edit may read `t`'s counts on the host: not while torch.compile traces it (a value read there is a
    graph break), where the device path's values are the same."""
    import torch

    return t.device.type in ON_HOST and not torch.compiler.is_compiling()


def _kth(v, k: int):
    """The k-th smallest (0-based) element of a 1-D tensor."""
    import torch

    return torch.kthvalue(v, k + 1).values


def _quantile(v, q: float):
    """Linear-interpolation quantile (numpy's default, np.percentile's too) of a 1-D float32 tensor, without
    torch.quantile's limit of 2**24 elements."""
    import torch

    n_all = v.numel()
    pos = q * (n_all - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n_all - 1)
    if n_all - lo <= max(64, n_all // 16):
        # a high percentile (99.5 of a prompt's activations): one pass of topk over the tail, not two selections
        tail = torch.topk(v, n_all - lo, largest=True, sorted=True).values
        x_lo, x_hi = tail[-1], tail[-2] if hi > lo else tail[-1]
    else:
        x_lo = _kth(v, lo)
        x_hi = _kth(v, hi) if hi > lo and pos > lo else x_lo
    if hi == lo or pos == lo:
        return x_lo
    return x_lo + (x_hi - x_lo) * (pos - lo)


def _count(frac, n_all: int):
    """max(1, round(frac * n_all)) as Python computes it from float(frac): the float32 frac widened to float64, one
    float64 product, round half to even (torch.round's rule too); an int64 tensor of frac's shape."""
    import torch

    return torch.round(frac.double() * n_all).clamp_min(1).long()


def _first_n(absx, cut, n):
    """The n elements of smallest |a| along the last dimension, ties at the cut broken by position (the first
    ones move): all below the cut, then the first n - (count below) of those equal to it."""
    below = absx < cut
    tie = absx == cut
    return below | (tie & (tie.cumsum(-1) <= n - below.sum(-1, keepdim=True)))


def edit(v, s: ArmSettings, state, identity: bool = False):
    """ARM on the activations `v` (any shape; its statistics pool over all of v); returns a new tensor. `state`:
    the draws' `stream` (a Python int, or its lanes [2] on v's device); element i of v.reshape(-1) takes the uniform
    of index i.

    With `identity` every step runs but the moved elements get their own values back (a switch for tests:
    the hook then must change nothing)."""
    import torch

    flat = v.reshape(-1).float()
    n_all = flat.numel()
    absx = flat.abs()
    on_host = _on_host(flat)
    # |min a| over the negatives, 0 when there are none; order statistics by kthvalue and masks, never a full sort
    # on the host (a prompt's row holds tokens x channels elements: a sort of them costs more than the step)
    neg = (-flat.min()).clamp_min(0)
    if s.variant == "llama":
        med = _kth(absx, (n_all - 1) // 2)                # torch.median: the lower median
        mad = _kth((absx - med).abs_(), (n_all - 1) // 2).clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        share = (absx < eps).float().mean()
        n = _count(torch.clamp(s.k * share, min=s.pmin, max=s.pmax), n_all).reshape(1)
        if on_host:
            cut = _kth(absx, int(n) - 1)                  # the n-th smallest |a|
        else:  # n stays on the device: the sorted |a| at n - 1
            cut = torch.sort(absx).values.gather(0, n - 1)[0]
        moved = _first_n(absx, cut, n)
        top = _quantile(flat, s.percentage / 100)
    else:
        moved = absx <= _quantile(absx, min(max(s.c, 0.0), 1.0))  # ties included
        top = _quantile(absx, s.percentage)
    if on_host:
        idx = torch.nonzero(moved).flatten()
        picked = flat[idx]
        u = uniforms(state, idx)
        new = picked if identity else torch.where(picked >= 0, u * top, -u * neg)  # sign(0) counts as +1
        out = v.reshape(-1).clone()
        out[idx] = new.to(v.dtype)
        return out.view_as(v)
    u = uniforms(state, torch.arange(n_all, device=flat.device))
    new = flat if identity else torch.where(flat >= 0, u * top, -u * neg)
    return torch.where(moved, new.to(v.dtype), v.reshape(-1)).view_as(v)


def edit_rows(v, s: ArmSettings, states, identity: bool = False):
    """`edit` of each row of `v` ([rows, ...], statistics per row over all its elements) in one set of batched
    operations: a decode step's rows (every position real) cost about one row's operations, not one per row.
    `states`: lanes [rows, 2] of each row's `stream` on v's device. Equals `edit` row by row exactly (the same
    order statistics, the same float32 arithmetic, the same draws)."""
    import torch

    rows = v.shape[0]
    flat = v.reshape(rows, -1).float()
    n_all = flat.shape[1]
    absx = flat.abs()
    neg = (-flat.min(dim=1).values).clamp_min(0)
    if s.variant == "llama":
        half = (n_all - 1) // 2
        med = torch.kthvalue(absx, half + 1, dim=1).values
        mad = torch.kthvalue((absx - med[:, None]).abs_(), half + 1, dim=1).values.clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        share = (absx < eps[:, None]).float().mean(dim=1)
        n = _count(torch.clamp(s.k * share, min=s.pmin, max=s.pmax), n_all)[:, None]
        if _on_host(flat):  # a selection per row costs less than one sort of them all
            cut = torch.stack([torch.kthvalue(x, k).values for x, k in zip(absx, n[:, 0].tolist())])[:, None]
        else:
            cut = torch.sort(absx, dim=1).values.gather(1, n - 1)
        moved = _first_n(absx, cut, n)
        top = _quantile_rows(flat, s.percentage / 100)
    else:
        moved = absx <= _quantile_rows(absx, min(max(s.c, 0.0), 1.0))[:, None]
        top = _quantile_rows(absx, s.percentage)
    if identity:
        return v.clone()
    if _on_host(flat):
        r, i = torch.nonzero(moved, as_tuple=True)
        picked = flat[r, i]
        u = uniforms(states[r], i[:, None])[:, 0]
        out = v.reshape(rows, -1).clone()
        out[r, i] = torch.where(picked >= 0, u * top[r], -u * neg[r]).to(v.dtype)
        return out.view_as(v)
    u = uniforms(states, torch.arange(n_all, device=flat.device)[None, :])
    new = torch.where(flat >= 0, u * top[:, None], -u * neg[:, None])
    return torch.where(moved, new.to(v.dtype), v.reshape(rows, -1)).view_as(v)


def _quantile_rows(v, q: float):
    """`_quantile` of each row of a 2-D float32 tensor."""
    import torch

    pos = q * (v.shape[1] - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, v.shape[1] - 1)
    x_lo = torch.kthvalue(v, lo + 1, dim=1).values
    if hi == lo or pos == lo:
        return x_lo
    return x_lo + (torch.kthvalue(v, hi + 1, dim=1).values - x_lo) * (pos - lo)


def _sorted_masked(x, mask):
    """x's elements under `mask` ascending, in front of +inf for every other element (x flattened, static shape)."""
    import torch

    return torch.sort(torch.where(mask, x, float("inf")).reshape(-1)).values


def _quantile_sorted(values, n, q: float):
    """`_quantile` of the first n (a 0-d int64 tensor) of the ascending `values`: its float64 position, floor and
    weight as Python computes them, the weight rounded to float32 as a Python float's product with a float32 tensor is."""
    import torch

    pos = (n - 1).double() * q
    lo = torch.floor(pos)
    hi = torch.minimum(lo + 1, (n - 1).double())
    x_lo = values.gather(0, lo.long().clamp_min(0).reshape(1))[0]
    x_hi = values.gather(0, hi.long().clamp_min(0).reshape(1))[0]
    return torch.where((hi == lo) | (pos == lo), x_lo, x_lo + (x_hi - x_lo) * (pos - lo).float())


def edit_pooled(v, keep, s: ArmSettings, state, identity: bool = False):
    """`edit` of the rows of `v` ([rows, ...]) that the bool tensor `keep` [rows] marks, pooled over all their elements
    in batch order (`pool: batch`): equals `edit(v[keep], ...)` on those rows exactly, the other rows untouched, but
    every shape and count stays a tensor, so the one traced graph serves every set of rows (order statistics by one
    sort with the other rows' elements at +inf, never a count read on the host). `state`: the draws' lanes [2]."""
    import torch

    rows = v.shape[0]
    flat = v.reshape(rows, -1).float()
    per = flat.shape[1]
    mask = keep[:, None].expand_as(flat)
    n_all = keep.sum() * per
    absx = flat.abs()
    neg = (-torch.where(mask, flat, float("inf")).min()).clamp_min(0)

    def kth(values, k):  # the k-th smallest (0-based) of the sorted `values`
        return values.gather(0, k.clamp_min(0).reshape(1))[0]

    abs_sorted = _sorted_masked(absx, mask)
    if s.variant == "llama":
        half = torch.div(n_all - 1, 2, rounding_mode="floor")
        med = kth(abs_sorted, half)
        mad = kth(_sorted_masked((absx - med).abs_(), mask), half).clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        # the mean over the pooled elements: an exact float32 count over their number, as torch's CPU mean divides
        # (no pooled element: 0, not 0 / 0, whose NaN count would index nowhere)
        share = ((absx < eps) & mask).sum().float() / n_all.clamp_min(1).float()
        n = _count(torch.clamp(s.k * share, min=s.pmin, max=s.pmax), n_all).reshape(1)
        cut = kth(abs_sorted, n - 1)
        masked = torch.where(mask, absx, float("inf")).reshape(-1)  # other rows never below or at the cut
        moved = _first_n(masked, cut, n).view(rows, per)
        top = _quantile_sorted(_sorted_masked(flat, mask), n_all, s.percentage / 100)
    else:
        moved = absx <= _quantile_sorted(abs_sorted, n_all, min(max(s.c, 0.0), 1.0))  # ties included
        top = _quantile_sorted(abs_sorted, n_all, s.percentage)
    if identity:
        return v.clone()
    rank = (keep.long().cumsum(0) - 1).clamp_min(0)  # each kept row's place among the kept rows
    u = uniforms(state, rank[:, None] * per + torch.arange(per, device=flat.device)[None, :])
    new = torch.where(flat >= 0, u * top, -u * neg)
    return torch.where(mask & moved, new.to(v.dtype), v.reshape(rows, -1)).view_as(v)


class ArmHook:
    """Forward hook on layer 0's act_fn applying ARM to the rows `begin` marks; installed by hooks.Hooks.arm.

    Steps are counted by the hook's own calls since `begin` (step 0: the prompt). `begin(rows, valid)`:
    rows[r] is the problem index of an arm row or None (that row is left alone); valid[r, t] (bool, the
    prompt's attention mask) marks the real tokens of the prompt; decode steps are all real tokens.

    No host-device synchronisation at a decode step: at the prompt the hook reads the mask on the host (where the
    engines hand it over) and copies to the device, once, what the later steps need (`table`: per row its arm flag,
    its key state and the arm rows' batch indices; the pooled key state), and sets `clock`, a 0-d int64 device tensor
    holding the step, which every edited step advances in place.

    A decode step that torch.compile traces (transformers compiles the decode step alone; the prompt runs uncompiled)
    reads only those tensors: the step from `clock`, the rows from `table`, every row edited and the arm rows' result
    kept by torch.where, so one graph without a break serves every step and every batch of one shape."""

    def __init__(self, mlp, settings: ArmSettings, identity: bool = False):
        self.mlp, self.settings, self.identity = mlp, settings, identity
        self.clock = None
        self.begin([])
        self.fn = self  # what hooks.Hooks.arm registers on mlp.act_fn, for one block

    def begin(self, rows: list, valid=None) -> None:
        """Arm the hook for one batch: per row its problem index (or (index, sample)) when it is an arm row, else None."""
        self.rows, self.valid, self.step = list(rows), valid, 0
        self.arm_rows = [r for r, p in enumerate(self.rows) if p is not None]
        self.armed = bool(self.rows)  # what the traced step reads: a guard on the rows' values would recompile
        self.prepared = None  # (the arm rows: a slice or indices on the device, the keys' states), made at step 0
        self.table = None

    def prepare(self, device, step: int):
        """The batch's `table` on the device (one copy) and `clock` set to `step`; returns, without arm rows None,
        else the arm rows (a slice when they are one run, else their indices on the device) and their draws' key
        states (lanes on the device: under `pool: row` [arm rows, 2], under `pool: batch` the pooled key's [1, 2])."""
        import torch

        rows, s, n = self.arm_rows, self.settings, len(self.rows)
        # rows 0..n-1: (arm flag, key state hi, lo, the k-th arm row's batch index); row n: (0, pooled state hi, lo, 0)
        host = torch.zeros(n + 1, 4, dtype=torch.int64)
        if rows:
            host[rows, 0] = 1
            host[:len(rows), 3] = torch.tensor(rows, dtype=torch.int64)
            if s.pool == "batch":
                host[n, 1:3] = lanes([key_state(s.seed, [row_key(self.rows[r]) for r in rows])])[0]
            else:
                host[rows, 1:3] = lanes([key_state(s.seed, [row_key(self.rows[r])]) for r in rows])
        self.table = host.to(device)
        if self.clock is None or self.clock.device != self.table.device:
            import torch._dynamo

            self.clock = torch.zeros((), dtype=torch.int64, device=device)
            # one tensor for the hook's life, advanced inside the compiled step: a static address lets CUDA graphs
            # replay that in-place update
            torch._dynamo.mark_static_address(self.clock)
        self.clock.fill_(step)
        if not rows:
            return None
        if rows == list(range(rows[0], rows[-1] + 1)):
            where = slice(rows[0], rows[-1] + 1)
            states = self.table[where, 1:3]
        else:
            where = self.table[:len(rows), 3]
            states = self.table[where, 1:3]
        return where, (self.table[n:, 1:3] if s.pool == "batch" else states)

    def __call__(self, module, inputs, a):
        import torch

        if torch.compiler.is_compiling():
            return self.traced(a)
        # (no torch.set_num_threads(1) around the edit: switching the thread count at every forward call
        # made generation of a batch 20x slower, arm rows or not, measured on 2 cores)
        step, self.step = self.step, self.step + 1
        s = self.settings
        if not self.rows or (s.apply == "prefill" and step > 0):
            return None
        if len(self.rows) != a.shape[0]:
            raise RuntimeError(f"ARM hook: {len(self.rows)} rows marked, the batch has {a.shape[0]}")
        valid = self.valid if step == 0 else None
        if valid is not None and tuple(valid.shape) != tuple(a.shape[:2]):
            raise RuntimeError(f"ARM hook: prompt mask {tuple(valid.shape)} does not fit activations "
                               f"{tuple(a.shape)} at step 0 (a prompt split over several forward calls?)")
        if step == 0 or self.table is None:  # a batch without arm rows too: its compiled steps read the table
            self.prepared = self.prepare(a.device, step)
        if self.prepared is None:
            return None
        where, states = self.prepared
        out = a.clone()
        if s.pool == "batch":  # one edit over every position (pads included) of the arm rows, in batch order
            out[where] = edit(a[where], s, step_states(states, self.clock)[0], self.identity)
        elif valid is None:  # a decode step (or a prompt without padding): the rows in one batched edit
            out[where] = edit_rows(a[where], s, step_states(states, self.clock), self.identity)
        else:
            self.prompt(a, out, valid)
        self.clock.add_(1)
        return out

    def traced(self, a):
        """A decode step under torch.compile: every row edited with its table entry's draws at `clock`, the arm rows'
        values kept (shapes and settings are the graph's only constants)."""
        import torch

        s = self.settings
        if not self.armed or s.apply == "prefill":
            return None
        if self.table is None:
            raise RuntimeError("ARM hook: a compiled forward pass before the prompt's: the prompt (step 0) must run "
                               "uncompiled, where the hook reads its rows and mask on the host")
        n = self.table.shape[0] - 1
        if n != a.shape[0] or a.shape[1] != 1:
            raise RuntimeError(f"ARM hook: a compiled forward pass of {tuple(a.shape[:2])} (rows, tokens) for "
                               f"{n} marked rows: only a decode step (one token per row) may be compiled")
        keep = self.table[:n, 0] == 1
        if s.pool == "batch":
            out = edit_pooled(a, keep, s, step_states(self.table[n:, 1:3], self.clock)[0], self.identity)
        else:
            edited = edit_rows(a, s, step_states(self.table[:n, 1:3], self.clock), self.identity)
            out = torch.where(keep.view(-1, *[1] * (a.dim() - 1)), edited, a)
        self.clock.add_(1)
        return out

    def prompt(self, a, out, valid) -> None:
        """A padded prompt under `pool: row`: each arm row over its own real tokens, the element index running over
        those tokens' activations alone (a left-padded prompt draws what it draws unpadded)."""
        import torch

        s = self.settings
        mask = valid.cpu().numpy().astype(bool)  # the engines build it on the host: no copy there
        other = []
        for r in self.arm_rows:
            state = stream(s.seed, [row_key(self.rows[r])], 0)
            first = int(mask[r].argmax())
            if mask[r, first:].all():  # left padding: the real tokens are one run at the end
                out[r, first:] = edit(a[r, first:], s, state, self.identity)
            else:
                other.append((r, state, np.flatnonzero(mask[r])))
        if other:  # any other mask: the real positions of all such rows in one copy
            at = torch.from_numpy(np.concatenate([p for _, _, p in other])).to(a.device)
            k = 0
            for r, state, p in other:
                pos = at[k:k + len(p)]
                k += len(p)
                out[r, pos] = edit(a[r, pos], s, state, self.identity)
