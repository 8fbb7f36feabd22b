"""How far float noise moves layer 0's float32 MLP activations a (the values the activations stage counts into its
histogram; the stored showcase is float16, so the calibration's `activation` kind measures a rounded copy): a of the
first extraction prompts under each float-kernel variant, against this machine's default kernels.

    python benchmarks/activation_noise.py [MODEL ...]    (default: every model of params.yaml's models)

Prints per model and variant the largest |a - a_default| and the largest |a - a_default| / (1 + |a|); a variant runs
in a process of its own (its environment set before torch starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

VARIANTS = {"default": {}, "aten-default": {"ATEN_CPU_CAPABILITY": "default"}, "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
            "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"}, "threads-1": {"OMP_NUM_THREADS": "1"}}
N_PROMPTS = 4


def activations(name: str, out: str) -> None:
    from meaningless_tokens import hooks, models
    from meaningless_tokens.config import load_params
    from meaningless_tokens.dataset import dataset_spec, extraction_problems
    from meaningless_tokens.measures.activations import forward, gated_mlps
    from meaningless_tokens.prompts import builder_for

    params = load_params()
    layers = list(params.activations.layers)
    setup = models.setup_for(params, name, layers=layers)
    model, tokenizer = models.load(setup, layers=layers)
    chosen, _ = extraction_problems(dataset_spec(params.dataset, params.file), params.extract)
    builder = builder_for(params.prompt, setup, tokenizer)
    mlps = gated_mlps(model, setup, layers)
    arrays = {}
    with hooks.Hooks() as h:
        h.attention(model)  # forward() reads the captured attention, as the stage's does
        for k, p in enumerate(chosen[:N_PROMPTS]):
            for c, pr in builder.build(p).items():
                if c in ("none", "mless", "mful"):
                    _, a, _ = forward(model, mlps, layers, pr.input_ids)
                    for layer in layers:
                        arrays[f"{k}/{c}/{layer}"] = a[layer]
    np.savez(out, **arrays)


def main(argv: list[str]) -> int:
    from meaningless_tokens.config import load_params

    names = argv or list(load_params().models)
    for name in names:
        got = {}
        for variant, env in VARIANTS.items():
            out = f"/tmp/activation-noise-{name}-{variant}.npz"
            subprocess.run([sys.executable, __file__, "--one", name, out], env={**os.environ, **env}, check=True)
            got[variant] = np.load(out)
        base = got["default"]
        for variant in VARIANTS:
            if variant == "default":
                continue
            d = max(float(np.abs(got[variant][k] - base[k]).max()) for k in base.files)
            r = max(float((np.abs(got[variant][k] - base[k]) / (1 + np.abs(base[k]))).max()) for k in base.files)
            print(json.dumps({"model": name, "variant": variant, "max_abs": d, "max_rel_1": r}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        activations(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
