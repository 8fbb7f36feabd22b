"""extract@<model>: attention weights of the first layers for the none / mless / mful prompts.

Loads only the embeddings and layers 0..max(layers) (meaningless_tokens/models/partial.py), runs the decoder up to the
last configured layer (never the LM head), with eager attention captured by a registered attention
function (meaningless_tokens/capture.py; checked against the model's own eager output_attentions on the first
prompt), and stores per sample, condition, layer and head the
reduced vectors every statistic needs, in `artifacts/attention/<model>.h5`:

  recv_all[l, h, j]      attention key position j receives, summed over all queries i >= j
  recv_original[l, h, j] the same, summed over original (non-span) queries only
  recv_last[l, h, j]     attention the last query gives to j
  mass_span[l, h, i]     attention query i gives to the span, summed over span keys (0 for none)
  mass_first[l, h, i]    attention query i gives to position 0 (BOS on Gemma)

Positions of one condition are concatenated over samples; `offsets` delimits the samples.
Full [layer, head, T, T] matrices are kept for the first `extract.showcase` samples.

The `arm` condition is not extracted (root attribute `skipped_conditions` says so when it is configured):
its prompt is the `none` prompt and ARM edits layer 0's MLP, which runs after layer 0's attention, so its
layer-0 attention is exactly none's, and it has no span whose attention these statistics measure.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens import cli, models, progress, store
from meaningless_tokens.measures.extract import PROMPT_CONDITIONS, QUERY_SETS, VECTORS, reduce
from meaningless_tokens.capture import attention, compare
from meaningless_tokens.config import Params
from meaningless_tokens.dataset import dataset_spec, extraction_problems, put_problems
from meaningless_tokens.errors import CaptureError, UnsupportedModel, names_the_file
from meaningless_tokens.prompts import PromptBuilder, builder_for, check_context
from meaningless_tokens.stage import INDEXING, header, stage_context
from meaningless_tokens.store import put, put_json_attr, write_h5, write_prompt_timing

# the stage's outputs: role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "attention", "timing": "timing/extract"}

@dataclass
class Capture:
    problems: list
    layers: list[int]
    heads: list[int]
    conditions: list[str]        # the conditions extracted
    skipped: list[str]           # those whose layer-0 attention equals none's (arm)
    builder: PromptBuilder
    prompts: list[dict]          # per problem: condition -> PromptIds
    probe: dict                  # capture == the model's eager attention on the configured layers
    loaded_layers: int
    vectors: dict                # condition -> vector -> [per problem: [layer, head, position]]
    showcase: dict               # (problem k, condition) -> [layer, head, query, key]
    seconds: float


@names_the_file
def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "extract", name, root, **OUTPUTS)
    params, out = ctx.params, ctx.where["out"]
    chosen, data_sha = extraction_problems(dataset_spec(params.dataset, params.file), params.extract)
    setup = ctx.setup(layers=params.models[name].layers)
    cap = capture(params, setup, chosen)
    write_artifact(out, params, setup, cap, data_sha)
    n_prompts = len(cap.prompts) * len(cap.conditions)
    tokens = sum(len(pr[c].input_ids) for pr in cap.prompts for c in cap.conditions)
    write_prompt_timing(ctx.where["timing"], cap.seconds, n_prompts, out, tokens)
    if cap.skipped:
        print(f"{name}: conditions {cap.skipped} not extracted (the none prompt; layer-0 attention equals none's)")
    print(f"{name}: {len(cap.prompts)} problems x {len(cap.conditions)} conditions in {cap.seconds:.1f} s "
          f"({1000 * cap.seconds / n_prompts:.0f} ms per prompt) -> {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return out


def capture(params: Params, setup: models.ModelSetup, chosen: list) -> Capture:
    """Every prompt's attention on the configured layers, reduced (attention.py: `reduce`), after the probe; only
    the embeddings and layers 0..max(layers) are read from the checkpoint and run, never the later layers."""
    import torch

    cfg, spec, facts, name = params.extract, setup.spec, setup.facts, setup.name
    heads = list(range(facts["num_heads"])) if spec.heads == "all" else list(spec.heads)
    layers = list(spec.layers)
    model, tokenizer = models.load(setup, layers=layers)
    builder = builder_for(params.prompt, setup, tokenizer)
    prompts = [builder.build(p) for p in chosen]
    conditions = [c for c in params.prompt.conditions if c in PROMPT_CONDITIONS]
    skipped = [c for c in params.prompt.conditions if c not in PROMPT_CONDITIONS]
    check_context(setup, "extract.n_samples", "a prompt", max(len(pr[c].input_ids) for pr in prompts for c in conditions))
    # the probe of the configured layers, on the first prompt: capture == the model's own eager
    # output_attentions, causal, rows sum to 1 (prepare probed layer 0 and each layer type)
    first = prompts[0]["mless" if "mless" in conditions else "none"].input_ids
    try:
        probe = compare(model, first, layers, tolerance=models.probe_tolerance(setup.dtype))
    except CaptureError as e:
        raise UnsupportedModel(f"{params.file}: models.{name}.layers: model_type "
                                      f"'{facts['model_type']}': {e}") from None
    vectors = {c: {v: [] for v in VECTORS} for c in conditions}
    showcase = {}
    # the heads' index lives on the device, uploaded once: a list index would be uploaded at every prompt
    chosen_heads = None if heads == list(range(facts["num_heads"])) else torch.tensor(heads, device=model.device)
    started = time.perf_counter()
    bar = progress.bar(prompts, desc=f"extract {name}", unit="problem")
    for k, pr in enumerate(bar):
        for c in conditions:
            captured = attention(model, pr[c].input_ids, layers)
            # stacked on the device and copied to the host once per prompt, not once per layer
            stacked = torch.stack([captured[layer] for layer in layers])
            if chosen_heads is not None:
                stacked = stacked.index_select(1, chosen_heads)
            probs = stacked.cpu().numpy()  # [L, H, T, T]
            for v, arr in reduce(probs, pr[c].span, pr[c].original_pos).items():
                vectors[c][v].append(arr)
            if k < cfg.showcase:
                showcase[(k, c)] = probs
        bar.set_postfix(tokens=len(pr["mless" if "mless" in conditions else "none"].input_ids), refresh=False)
    return Capture(chosen, layers, heads, conditions, skipped, builder, prompts, probe,
                   model.config.get_text_config().num_hidden_layers, vectors, showcase, time.perf_counter() - started)


def write_artifact(out: Path, params: Params, setup: models.ModelSetup, cap: Capture, data_sha: str) -> None:
    """artifacts/attention/<model>.h5: per condition the prompts' tokens, spans and reduced vectors; the showcase
    prompts' full matrices; provenance at the root."""
    name, facts, conditions, prompts = setup.name, setup.facts, cap.conditions, cap.prompts
    dtype = np.float16 if params.extract.dtype == "float16" else np.float32
    prov = {
        **store.model_provenance("extract", params, name, setup.prepared.manifest()),
        "layers_probe": cap.probe,
        "loaded_layers": cap.loaded_layers,
        **cap.builder.describe(),
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params.dataset, params.file).describe(),
    }
    skipped = {"skipped_conditions": cap.skipped,
               "skipped_note": ("arm: the none prompt with layer 0's MLP edited; layer 0's attention runs before that "
                                "MLP, so it equals none's, and there is no span to measure attention on")}
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, layers=np.array(cap.layers, dtype=np.int32),
               heads=np.array(cap.heads, dtype=np.int32), conditions=list(conditions), **(skipped if cap.skipped else {}),
               num_kv_heads=facts["num_kv_heads"],
               heads_note=(f"heads are query heads (num_attention_heads={facts['num_heads']}); with grouped-query "
                           f"attention query head h reads kv head h // {facts['num_heads'] // facts['num_kv_heads']}"),
               indexing=INDEXING,
               position_0=("position 0 is the first prompt token (BOS where the tokenizer adds one) and is an original "
                           "token; mass_first keeps the attention it receives for statistics that exclude it"))
        put_json_attr(f, "query_sets", QUERY_SETS)
        put_json_attr(f, "provenance", prov)
        put_problems(f, cap.problems)
        for c in conditions:
            g = f.create_group(c)
            lengths = [len(pr[c].input_ids) for pr in prompts]
            put(g, "offsets", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
            put(g, "input_ids", np.concatenate([pr[c].input_ids for pr in prompts]).astype(np.int32))
            put(g, "span", np.array([pr[c].span for pr in prompts], dtype=np.int32),
                note="[start, end) of the inserted span; [0, 0] for none")
            put(g, "original_pos", np.concatenate([pr[c].original_pos for pr in prompts]).astype(np.int32),
                note="position in this condition of each none token; delimited by none/offsets")
            put(g, "joint_match", np.array([pr[c].joint_match for pr in prompts], dtype=bool))
            store.put_texts(g, "span_text", [pr[c].span_text for pr in prompts], compress=False)
            for v in VECTORS:
                put(g, v, np.concatenate(cap.vectors[c][v], axis=-1).astype(dtype), shape="[layer, head, position]")
        s = f.create_group("showcase")
        for (k, c), probs in cap.showcase.items():
            put(s.require_group(f"{k:03d}"), c, probs.astype(dtype), shape="[layer, head, query, key]")
            s[f"{k:03d}"].attrs["problem_index"] = cap.problems[k].index


def main(argv: list[str] | None = None) -> int:
    return cli.main("extract", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
