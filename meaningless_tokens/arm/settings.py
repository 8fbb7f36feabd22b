"""ARM's settings: the paper's per-model values and fallbacks, the variant of a model's family, the checks of a
setting, and the layer-0 MLP the hook edits. The differences from the paper's code are listed here (DIFFERENCES)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
    "A moved element's side is its sign bit: -0.0 moves to -u * |min a| as a negative activation (the paper's code "
    "counts every 0 as +1). -0.0 is an activation far below zero that underflowed (GELU's and SiLU's tail), and which "
    "kernels round it to -0.0 and which to -1e-7 differs between CPUs and kernel sets: counted as +1 it goes to +u * top "
    "on one machine and to -u * |min a| on another.",
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


def hook_settings(cfg: Arm, benchmark: str, setup, conditions) -> ArmSettings | None:
    """The ARM settings of the hook a stage's model carries (`settings_for`), None without one: the model carries the
    hook iff 'arm' is among `conditions` (the stage's; the sweep: prompt.conditions, as evaluate's engine)."""
    return settings_for(cfg, benchmark, setup) if "arm" in conditions else None


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
