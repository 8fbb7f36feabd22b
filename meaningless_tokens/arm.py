"""ARM, the paper's Activation Redistribution Module, as a forward hook on layer 0's gated MLP.

The condition `arm` is the `none` prompt with `a = act_fn(gate_proj(x))` of decoder layer 0 edited
before the product with `up_proj(x)` (notes/paper-method.md, section 2; the paper's code puts the same
edit into copied model files for three families). Two variants, as in that code:

  llama (its Qwen2 and Llama files)  eps = 1.4826 * MAD(|a|) * c, S = share of |a| < eps; the
        n = max(1, round(clamp(k * S, pmin, pmax) * N)) elements of smallest |a| move to sign * u * top
        (top = the `percentage` percentile of the signed a, 0..100) or to -u * |min a| when negative
  gemma (its Gemma 3 file)  every element with |a| <= the c-quantile of |a| moves (ties included), to
        u * top (top = the `percentage` quantile of |a|, 0..1) or -u * |min a|; k, pmin, pmax unused

with u uniform on [0, 1), one draw per moved element in position order, and 0 counted as positive.

Differences from the paper's code: DIFFERENCES below (docs/measures.md and the report list the same).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from meaningless_tokens.config import Arm
from meaningless_tokens.errors import ConfigError

VARIANTS = ("llama", "gemma")
DIFFERENCES = (
    "Seeded: the uniforms of a row come from a generator seeded with (arm.seed, problem index, step), step 0 "
    "being the prompt and step t the t-th decode step, so reruns are byte-identical (the paper's torch.rand has "
    "no seed).",
    "Statistics per sequence over its own non-pad positions (arm.pool: row), so a row's output does not depend "
    "on its batch; the paper's code pools over the whole tensor it is given, batch and pad positions included "
    "(arm.pool: batch reproduces that over the batch's arm rows).",
    "A forward hook on layer 0's act_fn for every family with a gated MLP instead of copied model files for "
    "three families; arm rows share a batch with the other conditions' rows, which the hook leaves untouched.",
    "Percentiles in float32 on the tensor's device (the paper's llama variant copies the activations to the "
    "CPU for np.percentile at every step, which also fails on bfloat16).",
    "Ties in |a| at the llama variant's cut are broken by position (the first ones move), and the uniforms "
    "are drawn in position order; the paper's torch.topk leaves both to the kernel.",
    "A tensor without negative activations gets |min a| = 0 (the paper's llama variant raises an error there: "
    "it reads `device` before assigning it).",
    "The gemma variant draws one uniform per moved element; the paper's draws one per element of the tensor "
    "and uses those at the moved positions (same distribution, other numbers).",
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


# ---- the edit --------------------------------------------------------------------------------------

def row_seed(seed: int, *entropy: int) -> int:
    """A 63-bit generator seed from (arm.seed, ...): numpy's SeedSequence mixes the integers, so nearby
    problem indices and steps do not give correlated streams."""
    return int(np.random.SeedSequence([seed, *entropy]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _entropy(row) -> tuple:
    """A row's seed entropy: its problem index (greedy), or (problem index, sample index) for a sampled output."""
    return row if isinstance(row, tuple) else (row,)


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
    lo = int(np.floor(pos))
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


def edit(v, s: ArmSettings, generator, identity: bool = False):
    """ARM on the activations `v` (any shape; its statistics pool over all of v); returns a new tensor.

    With `identity` every step runs but the moved elements get their own values back (a switch for tests:
    the hook then must change nothing)."""
    import torch

    flat = v.reshape(-1).float()
    n_all = flat.numel()
    absx = flat.abs()
    # |min a| over the negatives, 0 when there are none; order statistics by kthvalue and masks, never a
    # full sort (a prompt's row holds tokens x channels elements: a sort of them costs more than the step)
    neg = (-flat.min()).clamp_min(0)
    if s.variant == "llama":
        med = _kth(absx, (n_all - 1) // 2)                # torch.median: the lower median
        mad = _kth((absx - med).abs_(), (n_all - 1) // 2).clamp_min(1e-12)
        eps = 1.4826 * mad * s.c
        share = (absx < eps).float().mean()
        frac = float(torch.clamp(s.k * share, min=s.pmin, max=s.pmax))
        n = max(1, int(round(frac * n_all)))
        cut = _kth(absx, n - 1)                           # the n-th smallest |a|
        moved = absx <= cut
        extra = int(moved.sum()) - n
        if extra > 0:  # ties at the cut: the first ones by position move, the last `extra` stay
            ties = torch.nonzero(absx == cut).flatten()
            moved[ties[len(ties) - extra:]] = False
        idx = torch.nonzero(moved).flatten()
        top = _quantile(flat, s.percentage / 100)
    else:
        tau = _quantile(absx, min(max(s.c, 0.0), 1.0))
        idx = torch.nonzero(absx <= tau).flatten()        # ties included
        top = _quantile(absx, s.percentage)
    picked = flat[idx]
    u = torch.rand(idx.numel(), generator=generator, device=flat.device, dtype=torch.float32)
    if identity:
        new = picked
    else:
        new = torch.where(picked >= 0, u * top, -u * neg)  # sign(0) counts as +1
    out = v.reshape(-1).clone()
    out[idx] = new.to(v.dtype)
    return out.view_as(v)


def edit_rows(v, s: ArmSettings, generators: list, identity: bool = False):
    """`edit` of each row of `v` ([rows, ...], statistics per row over all its elements) in one set of batched
    operations: a decode step's rows (every position real) cost about one row's operations, not one per row.
    Equals `edit` row by row exactly (the same order statistics, the same float32 arithmetic, the same draws)."""
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
        fracs = torch.clamp(s.k * share, min=s.pmin, max=s.pmax).tolist()
        n = torch.tensor([max(1, int(round(f * n_all))) for f in fracs], device=v.device)
        cut = torch.sort(absx, dim=1).values.gather(1, (n - 1)[:, None])
        moved = absx <= cut
        for r in torch.nonzero(moved.sum(dim=1) > n).flatten().tolist():  # ties at the cut (rare): as in `edit`
            ties = torch.nonzero(absx[r] == cut[r]).flatten()
            moved[r, ties[len(ties) - (int(moved[r].sum()) - int(n[r])):]] = False
        top = _quantile_rows(flat, s.percentage / 100)
    else:
        moved = absx <= _quantile_rows(absx, min(max(s.c, 0.0), 1.0))[:, None]
        top = _quantile_rows(absx, s.percentage)
    counts = moved.sum(dim=1).tolist()
    u = torch.zeros_like(flat)
    u[moved] = torch.cat([torch.rand(k, generator=g, device=v.device, dtype=torch.float32)
                          for k, g in zip(counts, generators)])
    if identity:
        return v.clone()
    new = torch.where(flat >= 0, u * top[:, None], -u * neg[:, None])
    return torch.where(moved, new, flat).to(v.dtype).view_as(v)


def _quantile_rows(v, q: float):
    """`_quantile` of each row of a 2-D float32 tensor."""
    import torch

    pos = q * (v.shape[1] - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, v.shape[1] - 1)
    x_lo = torch.kthvalue(v, lo + 1, dim=1).values
    if hi == lo or pos == lo:
        return x_lo
    return x_lo + (torch.kthvalue(v, hi + 1, dim=1).values - x_lo) * (pos - lo)


class ArmHook:
    """Forward hook on layer 0's act_fn applying ARM to the rows `begin` marks.

    Steps are counted by the hook's own calls since `begin` (step 0: the prompt). `begin(rows, valid)`:
    rows[r] is the problem index of an arm row or None (that row is left alone); valid[r, t] (bool, the
    prompt's attention mask) marks the real tokens of the prompt; decode steps are all real tokens."""

    def __init__(self, mlp, settings: ArmSettings, identity: bool = False):
        self.settings, self.identity = settings, identity
        self.rows: list[int | None] = []
        self.valid = None
        self.step = 0
        self.handle = mlp.act_fn.register_forward_hook(self)

    def begin(self, rows: list, valid=None) -> None:
        """Arm the hook for one batch: per row its problem index (or (index, sample)) when it is an arm row, else None."""
        self.rows, self.valid, self.step = list(rows), valid, 0

    def remove(self) -> None:
        self.handle.remove()

    def __call__(self, module, inputs, a):
        # (no torch.set_num_threads(1) around the edit: switching the thread count at every forward call
        # made generation of a batch 20x slower, arm rows or not, measured on 2 cores)
        import torch

        step, self.step = self.step, self.step + 1
        s = self.settings
        arm_rows = [r for r, p in enumerate(self.rows) if p is not None]
        if not arm_rows or (s.apply == "prefill" and step > 0):
            return None
        if len(self.rows) != a.shape[0]:
            raise RuntimeError(f"ARM hook: {len(self.rows)} rows marked, the batch has {a.shape[0]}")
        valid = self.valid if step == 0 else None
        if valid is not None and tuple(valid.shape) != tuple(a.shape[:2]):
            raise RuntimeError(f"ARM hook: prompt mask {tuple(valid.shape)} does not fit activations "
                               f"{tuple(a.shape)} at step 0 (a prompt split over several forward calls?)")
        out = a.clone()
        if s.pool == "batch":
            g = torch.Generator(device=a.device).manual_seed(
                row_seed(s.seed, step, *(e for r in arm_rows for e in _entropy(self.rows[r]))))
            out[arm_rows] = edit(a[arm_rows], s, g, self.identity)
            return out
        gens = [torch.Generator(device=a.device).manual_seed(row_seed(s.seed, *_entropy(self.rows[r]), step)) for r in arm_rows]
        if valid is None:  # a decode step (or a prompt without padding): the rows in one batched edit
            out[arm_rows] = edit_rows(a[arm_rows], s, gens, self.identity)
            return out
        for r, g in zip(arm_rows, gens):  # a padded prompt: each row over its own real tokens
            keep = valid[r].to(device=a.device, dtype=torch.bool)
            first = int(keep.int().argmax())
            if bool(keep[first:].all()):  # left padding: the real tokens are one run at the end
                out[r, first:] = edit(a[r, first:], s, g, self.identity)
            else:
                out[r, keep] = edit(a[r, keep], s, g, self.identity)
        return out
