"""Loading only the first layers of a model: which layers the layer-only stages run, which checkpoint tensors
those layers need, a config cut to them, and transformers' from_pretrained shown only that part (the forward of
the kept layers is the whole model's).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from meaningless_tokens.config import Params, model_spec
from meaningless_tokens.errors import ModelSourceError


def stage_layers(params: Params, name: str) -> list[int]:
    """Every layer a layer-only stage of model `name` runs (extract's, activations', the sweep's): the
    prepare stage converts a GGUF source this far once, and those stages reuse it."""
    return sorted({*model_spec(params, name).layers, *params.activations.layers, params.sweep.layer})


def prepare_layers(params: Params, name: str) -> list[int] | None:
    """The layers the prepare stage converts a GGUF source to: None (the whole model) when a whole-model stage
    of these params runs the model (evaluate, likelihood, the sweep's accuracy or likelihood), so that one
    conversion serves every stage; else only the layer-only stages' (`stage_layers`)."""
    sweep_whole = params.sweep.accuracy_samples > 0 or params.sweep.likelihood_samples > 0
    if name in params.evaluated or name in params.scored or sweep_whole:
        return None
    return stage_layers(params, name)


# a decoder layer's index inside a checkpoint key: model.layers.3.mlp..., transformer.h.3.attn...
LAYER_KEY = re.compile(r"(?:^|\.)(?:layers|h|blocks|block|decoder_layers)\.(\d+)\.")
# keys of other towers (a vision encoder's layers are not the text decoder's)
OTHER_TOWERS = re.compile(r"(?:^|[._])(?:vision|visual|audio|image|speech|mm_projector)", re.I)


def checkpoint_keys(model_dir: Path) -> dict[str, str]:
    """{tensor name: safetensors file name} from the index of a sharded checkpoint, or the headers."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    keys = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(f, framework="pt") as st:
            keys.update({k: f.name for k in st.keys()})
    return keys


def needed_keys(keys: dict[str, str], n_layers: int) -> dict[str, str]:
    """The checkpoint tensors a model truncated to its first `n_layers` decoder layers reads:
    everything but the decoder layers >= n_layers."""
    def needed(key: str) -> bool:
        m = LAYER_KEY.search(key)
        return m is None or int(m.group(1)) < n_layers or bool(OTHER_TOWERS.search(key[:m.start()]))
    return {k: f for k, f in keys.items() if needed(k)}


def truncated_config(config, n_layers: int):
    """`config` with its text model cut to the first `n_layers` layers (in place; returned).

    num_hidden_layers, layer_types and any other per-layer list of the text config (an attribute
    named *layer* with one entry per layer) are cut; every layer keeps its type, so layer i of the
    truncated model is layer i of the full one."""
    text = config.get_text_config()
    full = text.num_hidden_layers
    for attr, value in list(vars(text).items()):
        if "layer" in attr and isinstance(value, (list, tuple)) and len(value) == full:
            setattr(text, attr, type(value)(value[:n_layers]))
    text.num_hidden_layers = n_layers
    return config


def _base_is_inside(config) -> bool:
    """Whether the causal LM of `config` is its AutoModel class plus an LM head (then the base model
    alone loads from the same checkpoint; BERT's LM head model, say, lacks the base model's pooler)."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    if type(config) not in AutoModel._model_mapping or type(config) not in AutoModelForCausalLM._model_mapping:
        return False
    causal, base = AutoModelForCausalLM._model_mapping[type(config)], AutoModel._model_mapping[type(config)]
    with torch.device("meta"):
        inner = getattr(causal(config), causal.base_model_prefix, None)
        return type(inner) is base and set(inner.state_dict()) == set(base(config).state_dict())


def from_pretrained(name: str, model_dir: Path, dtype, attn_implementation: str, trust_remote_code: bool,
                     n_layers: int | None = None):
    """AutoModelForCausalLM from safetensors; with `n_layers`, the base model without its LM head
    (AutoModel: embeddings, decoder layers, final norm; never run by extraction, an untied LM head is
    as big as the embedding) from a config truncated to the first `n_layers` layers and a view of
    the checkpoint that holds only the shards with needed tensors (tensors of later layers in those
    shards are mapped, never read). Refuses a checkpoint that lacks a tensor the model needs
    (transformers would initialize it at random)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kw = dict(local_files_only=True, trust_remote_code=trust_remote_code)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report lists every skipped tensor of the later layers
    try:
        with tempfile.TemporaryDirectory(prefix="mless-view-") as view:
            source, auto = model_dir, AutoModelForCausalLM
            config = AutoConfig.from_pretrained(model_dir, **kw)
            full = config.get_text_config().num_hidden_layers
            if n_layers is not None and n_layers < full:
                truncated_config(config, n_layers)
                if _base_is_inside(config):
                    auto = AutoModel
                keys = needed_keys(checkpoint_keys(model_dir), n_layers)
                source = Path(view)
                for p in model_dir.iterdir():  # tokenizer, generation config, remote code: as they are
                    if not p.name.endswith(".safetensors") and p.name not in ("config.json", "model.safetensors.index.json"):
                        os.symlink(p.resolve(), source / p.name)
                for shard in sorted(set(keys.values())):
                    os.symlink((model_dir / shard).resolve(), source / shard)
                if (model_dir / "model.safetensors.index.json").is_file():
                    (source / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": keys}))
                config.save_pretrained(source)
            model, info = auto.from_pretrained(
                source, config=config, dtype=dtype, attn_implementation=attn_implementation, use_safetensors=True,
                output_loading_info=True, **kw)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        what = f"the first {n_layers} layers need" if n_layers else "the model needs"
        raise ModelSourceError(f"model '{name}': checkpoint {model_dir} lacks {len(missing)} tensor(s) {what}: "
                               f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return model
