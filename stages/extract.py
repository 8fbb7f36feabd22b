"""extract@<model>: attention weights of the first layers for the none / mless / mful prompts.

Loads only the embeddings and layers 0..max(layers) (meaningless_tokens/models.py), runs the decoder up to the
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
from pathlib import Path

import numpy as np

from meaningless_tokens import cli, models, progress, store
from meaningless_tokens.capture import CaptureError, attention, compare
from meaningless_tokens.attention import PROMPT_CONDITIONS, QUERY_SETS, VECTORS, reduce
from meaningless_tokens.config import ConfigError, Params, model_spec
from meaningless_tokens.prompts import builder_for, dataset_spec, load_problems, put_problems, select_problems
from meaningless_tokens.store import provenance, put, put_json_attr, write_h5, write_prompt_timing

def run(params: Params, name: str, out: Path | None = None, timing: Path | None = None) -> Path:
    spec = model_spec(params, name)
    out = out or params.resolve(str(store.path("attention", name)))
    cfg = params.extract
    problems, data_sha = load_problems(params)
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "extract.n_samples")
    if not chosen:
        raise ConfigError(f"{params.file}: extract.n_samples: the subset is empty")
    setup = models.resolve(params, name, layers=spec.layers)
    prepared, facts = setup.prepared, setup.facts
    heads = list(range(facts["num_heads"])) if spec.heads == "all" else list(spec.heads)
    layers = list(spec.layers)
    # only the embeddings and layers 0..max(layers), read from the checkpoint; never the later layers
    model, tokenizer = models.load(setup, layers=layers)
    builder = builder_for(params.prompt, setup, tokenizer)
    prompts = [builder.build(p) for p in chosen]
    conditions = [c for c in params.prompt.conditions if c in PROMPT_CONDITIONS]
    skipped = [c for c in params.prompt.conditions if c not in PROMPT_CONDITIONS]
    longest = max(len(pr[c].input_ids) for pr in prompts for c in conditions)
    context = facts["max_position_embeddings"]
    if context and longest > context:
        raise ConfigError(f"{params.file}: extract.n_samples: a prompt has {longest} tokens, more than "
                          f"the context of model '{name}' ({context} positions)")
    # the probe of the configured layers, on the first prompt: capture == the model's own eager
    # output_attentions, causal, rows sum to 1 (prepare probed layer 0 and each layer type)
    first = prompts[0]["mless" if "mless" in conditions else "none"].input_ids
    try:
        check = compare(model, first, layers, tolerance=models.probe_tolerance(setup.dtype))
    except CaptureError as e:
        raise models.UnsupportedModel(f"{params.file}: models.{name}.layers: model_type "
                                      f"'{facts['model_type']}': {e}") from None

    dtype = np.float16 if cfg.dtype == "float16" else np.float32
    vectors = {c: {v: [] for v in VECTORS} for c in conditions}
    showcase = {}
    started = time.perf_counter()
    bar = progress.bar(prompts, desc=f"extract {name}", unit="problem")
    for k, pr in enumerate(bar):
        for c in conditions:
            captured = attention(model, pr[c].input_ids, layers)
            probs = np.stack([captured[layer][heads].cpu().numpy() for layer in layers])  # [L, H, T, T]
            for v, arr in reduce(probs, pr[c].span, pr[c].original_pos).items():
                vectors[c][v].append(arr)
            if k < cfg.showcase:
                showcase[(k, c)] = probs
        bar.set_postfix(tokens=len(pr["mless" if "mless" in conditions else "none"].input_ids), refresh=False)
    seconds = time.perf_counter() - started

    prov = {
        **provenance("extract"),
        "model": {"name": name, **prepared.manifest()},
        "layers_probe": check,
        "loaded_layers": model.config.get_text_config().num_hidden_layers,
        **builder.describe(),
        "params": {"models": {name: spec.model_dump(exclude={"display_name"})}, "prompt": params.prompt.model_dump(),
                   "extract": cfg.model_dump(), "dataset": params.dataset.model_dump(),
                   "runtime": params.runtime.model_dump(include={"device", "dtype"})},
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params).describe(),
    }
    with write_h5(out) as f:
        f.attrs["kind"] = "attention"
        f.attrs["model"] = name
        f.attrs["layers"] = np.array(layers, dtype=np.int32)
        f.attrs["heads"] = np.array(heads, dtype=np.int32)
        f.attrs["conditions"] = list(conditions)
        if skipped:
            f.attrs["skipped_conditions"] = skipped
            f.attrs["skipped_note"] = ("arm: the none prompt with layer 0's MLP edited; layer 0's attention runs before "
                                       "that MLP, so it equals none's, and there is no span to measure attention on")
        f.attrs["num_kv_heads"] = facts["num_kv_heads"]
        f.attrs["heads_note"] = (f"heads are query heads (num_attention_heads={facts['num_heads']}); with grouped-query "
                                 f"attention query head h reads kv head h // {facts['num_heads'] // facts['num_kv_heads']}")
        f.attrs["indexing"] = "layers and heads are 0-based; charts say 'Layer 1' for index 0"
        f.attrs["position_0"] = ("position 0 is the first prompt token (BOS where the tokenizer adds one) and is an "
                                 "original token; mass_first keeps the attention it receives for statistics that exclude it")
        put_json_attr(f, "query_sets", QUERY_SETS)
        put_json_attr(f, "provenance", prov)
        put_problems(f, chosen)
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
            put(g, "span_text", np.array([pr[c].span_text for pr in prompts], dtype=object), compress=False)
            for v in VECTORS:
                put(g, v, np.concatenate(vectors[c][v], axis=-1).astype(dtype), shape="[layer, head, position]")
        s = f.create_group("showcase")
        for (k, c), probs in showcase.items():
            put(s.require_group(f"{k:03d}"), c, probs.astype(dtype), shape="[layer, head, query, key]")
            s[f"{k:03d}"].attrs["problem_index"] = chosen[k].index
    n_prompts = len(prompts) * len(conditions)
    write_prompt_timing(timing or params.resolve(str(store.path("timing/extract", name))), seconds, n_prompts, out)
    if skipped:
        print(f"{name}: conditions {skipped} not extracted (the none prompt; layer-0 attention equals none's)")
    print(f"{name}: {len(prompts)} problems x {len(conditions)} conditions in {seconds:.1f} s "
          f"({1000 * seconds / n_prompts:.0f} ms per prompt) -> {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return out


def main(argv: list[str] | None = None) -> int:
    return cli.main("extract", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
