"""ARM, the paper's Activation Redistribution Module, as a forward hook on layer 0's gated MLP.

The condition `arm` is the `none` prompt with `a = act_fn(gate_proj(x))` of decoder layer 0 edited
before the product with `up_proj(x)` (notes/paper-method.md, section 2; the paper's code puts the same
edit into copied model files for three families). Two variants, as in that code:

  llama (its Qwen2 and Llama files)  eps = 1.4826 * MAD(|a|) * c, S = share of |a| < eps; the
        n = max(1, round(clamp(k * S, pmin, pmax) * N)) elements of smallest |a| move to sign * u * top
        (top = the `percentage` percentile of the signed a, 0..100) or to -u * |min a| when negative
  gemma (its Gemma 3 file)  every element with |a| <= the c-quantile of |a| moves (ties included), to
        u * top (top = the `percentage` quantile of |a|, 0..1) or -u * |min a|; k, pmin, pmax unused

with u uniform on [0, 1), +0 counted as positive and -0.0 as negative (by the sign bit). Every element has its own u, a pure function of (arm.seed, the
row's key, step, the element's index) computed by integer hashing on the tensor's device: the same numbers on any
device, and an element crossing the cut changes no other element's draw. Key: the problem index of a greedy row,
(problem index, sample index) of a sampled one; under `pool: batch` the arm rows' keys in batch order. Step 0 is the
prompt, step t the t-th decode step. Index: the element's place in the row's edited activations flattened over its
real tokens (a left-padded prompt draws what it draws unpadded; a decode step's row: its channel).

Differences from the paper's code: DIFFERENCES below (docs/measures.md and the report list the same).

The package, one module per part: settings (the paper's values, the variants, the checks), redistribution (the
edit), hook (the forward hook), teacher_forced (the edit under teacher forcing, which scoring installs); the draws
are meaningless_tokens/draws.py, which sampling shares.
"""

from meaningless_tokens.arm.hook import ArmHook
from meaningless_tokens.arm.redistribution import edit, edit_pooled, edit_rows
from meaningless_tokens.arm.settings import (DIFFERENCES, FALLBACK, OFF, PAPER, PAPER_BY_BENCHMARK, VARIANTS, ArmSettings,
                                             check_setting, hook_settings, layer0_mlp, model_type, settings_for,
                                             variant_for)

__all__ = ["ArmHook", "edit", "edit_pooled", "edit_rows", "DIFFERENCES", "FALLBACK", "OFF", "PAPER", "PAPER_BY_BENCHMARK",
           "VARIANTS", "ArmSettings", "check_setting", "hook_settings", "layer0_mlp", "model_type", "settings_for",
           "variant_for"]
