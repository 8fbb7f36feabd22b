"""prepare@<model>: the model's source -> a local Hugging Face folder in the model cache (outside the DVC
workspace), and its manifest `artifacts/models/<model>.json` (source, weights sha256, architecture facts, the
attention probe) for later stages.

Sources, conversion and the cache: meaningless_tokens/models/. A GGUF source is converted whole when a
whole-model stage runs the model (evaluate.models, likelihood.models, the sweep's accuracy or likelihood), so
one conversion serves every stage; otherwise only up to the layers the layer-only stages run (extract's,
activations', the sweep's attention). `metrics/timing/prepare-<model>.json`: the run's seconds and peak RSS
(the conversion is the memory peak of a cold run). The probe refuses, with one line, a model whose attention the capture cannot record
exactly; `hf` sources record the commit their revision resolved to.
"""

from __future__ import annotations

import sys
from pathlib import Path

from meaningless_tokens import cli
from meaningless_tokens.config import Params
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.models import PreparedModel
from meaningless_tokens.stage import stage_context
from meaningless_tokens.store import environment, write_json_atomic, write_timing


# the stage's outputs: role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "manifest", "timing": "timing/prepare"}


@names_the_file
def run(params: Params, name: str, root: Path | None = None) -> PreparedModel:
    ctx = stage_context(params, "prepare", name, root, **OUTPUTS)
    prepared, layers = ctx.prepare()
    # the environment's lock: a reinstall from another lock changes the manifest, so every stage reruns
    write_json_atomic(ctx.where["out"], {**prepared.manifest(), "environment": environment()})
    print(f"{name}: {prepared.path} (weights sha256 {prepared.weights_sha256[:12]}…, "
          f"{prepared.facts['num_layers']} layers, {prepared.facts['num_heads']} heads) "
          f"in {ctx.seconds():.1f} s")
    write_timing(ctx.where["timing"], {"seconds": ctx.seconds(), "converted": "whole"
                                       if layers is None else f"layers 0-{max(layers)}", "folder": prepared.path.name})
    return prepared


def main(argv: list[str] | None = None) -> int:
    return cli.main("prepare", __doc__, run, argv, many=True)


if __name__ == "__main__":
    sys.exit(main())
