"""Layer l's gated-MLP activations a = act_fn(gate_proj(x)) and pre-activations z = gate_proj(x) of each prompt under
each condition (none / mless / mful, and arm: the none prompt with ARM's edit): per-sample measures of a, histograms,
lambda (the attention mass after-span queries keep on original keys) and paired differences to none.
stages/activations.py's DEFINITIONS says what each one is.

    m = mlp_activations.measure(params, models.setup_for(params, name, layers=params.activations.layers), problems)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from meaningless_tokens import arm, hooks, models, noise, progress
from meaningless_tokens.capture import capturing, prompt_inputs
from meaningless_tokens.config import Params
from meaningless_tokens.errors import BadParam, ConfigError, StopForward
from meaningless_tokens.intervals import bootstrap_mean_ci, wilcoxon_p
from meaningless_tokens.prompts import PromptBuilder, builder_for

# How `make verify` compares this measure's outputs (meaningless_tokens/verify/kinds.py assembles KINDS from every
# measure's): (artifact kind of store.PATHS, key glob, kind of quantity of verify's TOLERANCES), first match wins
QUANTITIES = (
    ("activations", "*/hist_*", "count"),
    ("activations", "*/outside_*", "count"),
    ("activations", "*_diff_p", "rank-p"),
    ("activations", "*", "activation"),
)

SETS = {
    "original": "every original (none) token, at its position in the condition's prompt",
    "after_span": "original tokens from the span's insertion point on (the tokens before it see the same "
                  "context in every condition under causal attention)",
}
MEASURES = {
    "near_zero_robust": "share of |a| < eps, eps = 1.4826 * MAD(|a|) * activations.mad_c over the sample's "
                        "tokens x channels (the paper's ARM radius, so eps follows each condition's own spread)",
    "near_zero_fixed": "share of |a| < activations.eps (the same radius in every condition)",
    "l1": "mean |a|",
    "l2": "root mean square of a",
    "gini": "Gini coefficient of |a| (0: all equal, 1: all mass on one activation)",
    "z_var": "variance of the gate pre-activation z over channels, averaged over tokens",
}


def gated_mlps(model, setup: models.ModelSetup, layers: list[int]) -> list:
    """Layer l's MLP for each l, refusing a model whose MLP has no separate gate_proj and act_fn."""
    blocks = model.get_decoder().layers
    mlps = []
    for layer in layers:
        mlp = getattr(blocks[layer], "mlp", None)
        if not all(hasattr(mlp, k) for k in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            raise ConfigError(
                f"{setup.where}: layer {layer}'s MLP ({type(mlp).__name__}, model_type "
                f"{model.config.model_type!r}) is not a gated MLP with gate_proj, up_proj and act_fn; "
                "the activations stage (and ARM) need a = act_fn(gate_proj(x))")
        mlps.append(mlp)
    return mlps


def forward(model, mlps, layers: list[int], input_ids) -> tuple[dict, dict, dict]:
    """One prompt up to a of max(layers): ({layer: attention [H, T, T]}, {layer: a [T, I]},
    {layer: z [T, I]}), float32 numpy arrays."""
    import torch

    inputs = prompt_inputs(model, input_ids)
    with hooks.Hooks() as h, capturing(layers, stop_after_attention=False) as request, torch.no_grad():
        a, z = h.capture_mlp(mlps, layers)
        # after a of the last layer: its up_proj and down_proj (two of the MLP's three matrices) never run
        h.stop_after(mlps[layers.index(max(layers))].act_fn)
        try:
            model.get_decoder()(**inputs, use_cache=False)
        except StopForward:
            pass
    missing = sorted(set(layers) - set(a) | set(layers) - set(request.captured))
    if missing:
        raise RuntimeError(f"layers {missing}: MLP activations or attention not captured")
    # packed into one float32 buffer on the device and copied to the host once per prompt, not once per layer
    parts = [(k, layer, t[layer].detach()) for k, t in (("attn", request.captured), ("a", a), ("z", z))
             for layer in layers]
    host = torch.cat([t.float().reshape(-1) for _, _, t in parts]).cpu().numpy()
    out, at = {"attn": {}, "a": {}, "z": {}}, 0
    for k, layer, t in parts:
        out[k][layer] = host[at:at + t.numel()].reshape(tuple(t.shape))
        at += t.numel()
    return out["attn"], out["a"], out["z"]


def _median_sorted(s: np.ndarray) -> float:
    n = len(s)
    return (float(s[(n - 1) // 2]) + float(s[n // 2])) / 2


def _merge(descending: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """Two sorted runs as one ascending array (a stable sort merges runs in linear time)."""
    return np.sort(np.concatenate([descending[::-1], ascending]), kind="stable")


def measures(a: np.ndarray, z: np.ndarray, mad_c: float, eps: float, edges: np.ndarray
             ) -> tuple[dict, np.ndarray, np.ndarray]:
    """MEASURES of one sample's a and z ([tokens, channels], float32), the histogram of a on `edges`
    with the counts below and above them: [below, bin counts..., above], and per edge how many values of a lie
    within their tolerance of it (noise.near: a count moves by at most those at its edges on other float kernels).

    One sort of a serves the histogram (as np.histogram counts: bins closed on the left, the last one on
    both sides), the median and MAD of |a| and the Gini coefficient."""
    signed = np.sort(a.ravel())
    n = len(signed)
    cut = np.searchsorted(signed, 0)
    absolute = _merge(-signed[:cut], signed[cut:])
    x = absolute.astype(np.float64)
    med = _median_sorted(x)
    j = np.searchsorted(x, med)
    mad = _median_sorted(_merge(med - x[:j], x[j:] - med))
    robust = 1.4826 * mad * mad_c
    total = x.sum()
    at = np.searchsorted(signed, edges)
    at[-1] = np.searchsorted(signed, edges[-1], side="right")
    counts = np.concatenate([[at[0]], np.diff(at), [n - at[-1]]])
    at_edges = noise.near(signed, edges, "activation-f32", ordered=True)
    zz = z.astype(np.float64)
    return {
        "near_zero_robust": np.searchsorted(absolute, np.float32(robust)) / n,
        "near_zero_fixed": np.searchsorted(absolute, np.float32(eps)) / n,
        "l1": total / n,
        "l2": float(np.sqrt(np.dot(x, x) / n)),
        "gini": float(2 * np.dot(np.arange(1, n + 1, dtype=np.float64), x) / (n * total) - (n + 1) / n)
        if total > 0 else 0.0,
        "z_var": float(zz.var(axis=1).mean()),
    }, counts, at_edges


def summarize(per: dict, conditions: list[str], seed: int, n_boot: int) -> dict:
    """{(cond, set, dataset): array}: per-condition means and intervals, paired differences to none."""
    out = {}
    for c in conditions:
        for s in SETS:
            for m in MEASURES:
                values = per[c][s][m]  # [S, L]
                lo, hi = bootstrap_mean_ci(values, seed, n_boot=n_boot)
                out[(c, s, f"{m}_mean")] = values.mean(axis=0)
                out[(c, s, f"{m}_ci")] = np.stack([lo, hi])
                if c != "none":
                    diff = values - per["none"][s][m]
                    lo, hi = bootstrap_mean_ci(diff, seed, n_boot=n_boot)
                    out[(c, s, f"{m}_diff")] = diff.mean(axis=0)
                    out[(c, s, f"{m}_diff_ci")] = np.stack([lo, hi])
                    out[(c, s, f"{m}_diff_p")] = np.array([wilcoxon_p(diff[:, k]) for k in range(diff.shape[1])])
                    out[(c, s, f"{m}_diff_p{noise.NOISE}")] = np.array([noise.wilcoxon(diff[:, k], "activation")
                                                                        for k in range(diff.shape[1])])
    return out


@dataclass
class Measured:
    problems: list
    layers: list[int]
    conditions: list[str]
    builder: PromptBuilder
    arm_settings: object         # arm.ArmSettings, None without the arm condition
    mlp: object                  # the first measured layer's MLP module (its class, act_fn and width are recorded)
    edges: np.ndarray            # histogram bin edges
    per: dict                    # condition -> set -> measure -> [sample, layer]
    hist: dict                   # condition -> set -> [layer, bin]
    outside: dict                # condition -> set -> [layer, below/above]
    hist_noise: dict             # condition -> set -> [layer, bin]: values within their tolerance of the bin's edges
    outside_noise: dict          # condition -> set -> [layer, below/above]: of the range's first and last edge
    lam: dict                    # condition -> [sample: [layer, head]]
    summary: dict                # `summarize`
    showcase: dict               # (problem k, condition) -> (a, z) [layer, token, channel]
    seconds: float
    manifest: dict               # the prepared model's


def measure(params: Params, setup: models.ModelSetup, chosen: list) -> Measured:
    """Every prompt's MLP activations on activations.layers under each condition: per-sample measures,
    histograms, lambda; only the embeddings and layers 0..max(layers) are read from the checkpoint."""
    cfg, name = params.activations, setup.name
    n_layers = setup.facts["num_layers"]
    layers = list(cfg.layers)
    if max(layers) >= n_layers:
        raise BadParam(f"activations.layers: {[x for x in layers if x >= n_layers]} out of range; "
                       f"{name} has {n_layers} layers (allowed 0..{n_layers - 1})")
    conditions = params.prompt.conditions
    arm_settings = arm.hook_settings(params.arm, params.dataset.benchmark, setup, conditions)
    model, tokenizer = models.load(setup, layers=layers)
    mlps = gated_mlps(model, setup, layers)
    with hooks.Hooks() as h:
        # installed before forward()'s capturing hooks, which therefore see the edited a
        arm_hook = h.arm(arm.ArmHook(arm.layer0_mlp(model, setup), arm_settings)) if arm_settings else None
        h.attention(model)
        return _measure(params, setup, chosen, model, tokenizer, mlps, arm_hook, arm_settings)


def _measure(params: Params, setup: models.ModelSetup, chosen: list, model, tokenizer, mlps, arm_hook,
             arm_settings) -> Measured:
    """`measure` with the model's hooks installed."""
    cfg, name, conditions = params.activations, setup.name, params.prompt.conditions
    layers = list(cfg.layers)
    builder = builder_for(params.prompt, setup, tokenizer)
    insertion = len(builder.prefix) + (0 if builder.before else len(builder.instruction))
    prompts = [builder.build(p) for p in chosen]
    edges = np.linspace(cfg.range[0], cfg.range[1], cfg.bins + 1)

    per = {c: {s: {m: [] for m in MEASURES} for s in SETS} for c in conditions}
    hist = {c: {s: np.zeros((len(layers), cfg.bins), np.int64) for s in SETS} for c in conditions}
    outside = {c: {s: np.zeros((len(layers), 2), np.int64) for s in SETS} for c in conditions}
    hist_noise = {c: {s: np.zeros((len(layers), cfg.bins), np.int64) for s in SETS} for c in conditions}
    outside_noise = {c: {s: np.zeros((len(layers), 2), np.int64) for s in SETS} for c in conditions}
    lam = {c: [] for c in conditions}
    showcase = {}
    started = time.perf_counter()
    for k, pr in enumerate(progress.bar(prompts, desc=f"activations {name}", unit="problem")):
        for c in conditions:
            if arm_hook is not None:
                arm_hook.begin([chosen[k].index] if c == "arm" else [])
            attn, a, z = forward(model, mlps, layers, pr[c].input_ids)
            pos = np.array(pr[c].original_pos)
            rows = {"original": pos, "after_span": pos[insertion:]}
            q = rows["after_span"]
            lam[c].append(np.stack([attn[layer][:, q][:, :, pos].sum(-1).mean(-1) for layer in layers]))
            for s, r in rows.items():
                values = []
                for li, layer in enumerate(layers):
                    v, counts, at_edges = measures(a[layer][r], z[layer][r], cfg.mad_c, cfg.eps, edges)
                    values.append(v)
                    hist[c][s][li] += counts[1:-1]
                    outside[c][s][li] += counts[[0, -1]]
                    hist_noise[c][s][li] += at_edges[:-1] + at_edges[1:]
                    outside_noise[c][s][li] += at_edges[[0, -1]]
                for m in MEASURES:
                    per[c][s][m].append([v[m] for v in values])
            if k < cfg.showcase:
                showcase[(k, c)] = (np.stack([a[layer] for layer in layers]), np.stack([z[layer] for layer in layers]))
    seconds = time.perf_counter() - started
    per = {c: {s: {m: np.array(v, dtype=np.float64) for m, v in ms.items()} for s, ms in sets.items()}
           for c, sets in per.items()}  # [sample, layer]
    return Measured(chosen, layers, conditions, builder, arm_settings, mlps[0], edges, per, hist, outside, hist_noise,
                    outside_noise, lam,
                    summarize(per, conditions, cfg.seed, cfg.n_boot), showcase, seconds,
                    setup.prepared.manifest())
