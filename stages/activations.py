"""activations@<model>: the activation shift, layer 0's gated-MLP activations under none / mless / mful (and arm),
per-sample measures, histograms and paired differences to `none` (DEFINITIONS: each dataset).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, cli, store
from meaningless_tokens.config import Params
from meaningless_tokens.dataset import dataset_spec, extraction_problems, put_problems
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.measures.activations import MEASURES, SETS, Measured, measure
from meaningless_tokens.stage import INDEXING, header, stage_context
from meaningless_tokens.tolerances import NOISE
from meaningless_tokens.store import put, put_json_attr, write_h5, write_prompt_timing

# what the artifact's `definitions` attribute says, and `--help`: a constant, not the docstring, so that an edit of the
# docstring leaves the attribute as it is (the file's code hash, in provenance, still changes: the stage reruns)
DEFINITIONS = """activations@<model>: the activation shift, layer 0's gated-MLP activations under none / mless / mful (and arm).

The paper's mechanism (notes/paper-method.md, section 1): the span scales the first layer's attention on
original keys by lambda < 1 and adds the span's values, which moves the gate pre-activations
`z = gate_proj(x)` of the MLP and spreads `a = act_fn(gate_proj(x))` (fewer activations near zero, more
of large magnitude). This stage runs the model on the extraction prompts (extract.n_samples,
extract.seed) up to a in the last of `activations.layers` and never further (that MLP's up_proj and
down_proj do not run), with forward hooks on `gate_proj` and `act_fn` (a is the tensor the paper's ARM
edits), and stores in
`artifacts/activations/<model>.h5`, per condition group:

  hist_<set>[l, bin]        counts (int64) of a over the set's tokens x channels, pooled over samples, on
                            the fixed bins `/bin_edges` (activations.range, activations.bins)
  outside_<set>[l, 2]       counts below and above the range
  hist_<set>_noise[l, bin], outside_<set>_noise[l, 2]   how far float noise can move each count: the values of
                            a within their tolerance (meaningless_tokens/tolerances.py, `activation-f32`) of the
                            bin's edges, pooled as the counts are (meaningless_tokens/noise.py)
  <set>/<measure>[s, l]     per sample, over the set's tokens x channels (MEASURES below)
  <set>/<measure>_mean[l], <set>/<measure>_ci[2, l]      mean over samples, bootstrap 95 % interval
  <set>/<measure>_diff[l], _diff_ci[2, l], _diff_p[l]     (mless / mful) paired difference to none:
                            mean, bootstrap 95 % interval, two-sided Wilcoxon signed-rank p
  <set>/<measure>_diff_p_noise[l]   how far float noise can move that p: the ranks that can swap when each
                            difference moves within its tolerance (`activation`; meaningless_tokens/noise.py)
  lambda[s, l, h]           attention mass the after-span original queries keep on original keys
                            (1 for none), from the same forward pass; lambda_mean[l, h]

Token sets (SETS): `original`, every token of the none prompt at its place in each condition, and
`after_span`, the original tokens from the span's insertion point on: under causal attention the tokens
before it see the same context in every condition, so their activations cannot change.
Full a and z ([layer, token, channel], float16) for the first `activations.showcase` samples.

`arm` (when configured): the none prompt with the ARM hook (meaningless_tokens/arm/hook.py, the one evaluate uses, seeded by
the problem index at step 0) on layer 0's act_fn, registered before the capturing hook, so `a` is the
ARM-transformed tensor the MLP goes on with; z = gate_proj(x) is none's.
"""

# the stage's outputs: role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "activations", "timing": "timing/activations"}


@names_the_file
def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "activations", name, root, **OUTPUTS)
    params, out = ctx.params, ctx.where["out"]
    chosen, data_sha = extraction_problems(dataset_spec(params.dataset, params.file), params.extract)
    m = measure(params, ctx.setup(layers=params.activations.layers), chosen)
    write_artifact(out, params, name, m, data_sha)
    n_prompts = len(m.problems) * len(m.conditions)
    write_prompt_timing(ctx.where["timing"], m.seconds, n_prompts, out)
    print(f"{name}: MLP activations of layers {[x + 1 for x in m.layers]} (1-based), {len(m.problems)} problems x "
          f"{len(m.conditions)} conditions in {m.seconds:.1f} s -> {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return out


def write_artifact(out: Path, params: Params, name: str, m: Measured, data_sha: str) -> None:
    """artifacts/activations/<model>.h5: per condition and token set the measures, histograms and their summary;
    the showcase prompts' a and z; provenance at the root."""
    arm_settings, conditions, manifest = m.arm_settings, m.conditions, m.manifest
    prov = {
        **store.model_provenance("activations", params, name, manifest, unused=() if arm_settings else ("arm",)),
        **m.builder.describe(),
        **({"arm": {**arm_settings.describe(), "differences_from_paper": arm.DIFFERENCES}} if arm_settings else {}),
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params.dataset, params.file).describe(),
    }
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, layers=np.array(m.layers, dtype=np.int32), conditions=list(conditions),
               n_samples=len(m.problems), mlp_class=type(m.mlp).__name__, act_fn=type(m.mlp.act_fn).__name__,
               intermediate_size=int(m.mlp.gate_proj.out_features), indexing=INDEXING, definitions=DEFINITIONS)
        put_json_attr(f, "sets", SETS)
        put_json_attr(f, "measures", MEASURES)
        put_json_attr(f, "provenance", prov)
        put_problems(f, m.problems)
        put(f, "bin_edges", m.edges)
        for c in conditions:
            g = f.create_group(c)
            put(g, "lambda", np.stack(m.lam[c]).astype(np.float64), shape="[sample, layer, head]")
            put(g, "lambda_mean", np.stack(m.lam[c]).mean(axis=0).astype(np.float64), shape="[layer, head]")
            for s in SETS:
                put(g, f"hist_{s}", m.hist[c][s], shape="[layer, bin]")
                put(g, f"outside_{s}", m.outside[c][s], shape="[layer, below/above]")
                put(g, f"hist_{s}{NOISE}", m.hist_noise[c][s], shape="[layer, bin]")
                put(g, f"outside_{s}{NOISE}", m.outside_noise[c][s], shape="[layer, below/above]")
                gs = g.create_group(s)
                for meas in MEASURES:
                    put(gs, meas, m.per[c][s][meas], shape="[sample, layer]")
                for (cc, ss, key), v in m.summary.items():
                    if cc == c and ss == s:
                        put(gs, key, v)
        sc = f.create_group("showcase")
        for (k, c), (a_all, z_all) in m.showcase.items():
            g = sc.require_group(f"{k:03d}")
            g.attrs["problem_index"] = m.problems[k].index
            put(g.require_group(c), "a", a_all.astype(np.float16), shape="[layer, token, channel]")
            put(g[c], "z", z_all.astype(np.float16), shape="[layer, token, channel]")


def main(argv: list[str] | None = None) -> int:
    return cli.main("activations", DEFINITIONS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
