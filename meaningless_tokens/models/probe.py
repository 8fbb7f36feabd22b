"""The attention probe: before a model is used, refuse with one line a model whose attention the capture
(meaningless_tokens/capture.py) cannot record exactly. From the config alone first (a decoder-only causal LM of
this transformers?), then on layer 0 and the first layer of each layer type, float32 on the CPU: the capture must
equal the model's own eager output_attentions, be causal and sum to 1 per row. The result is memoized in
`<cache>/probes/` per weights, config, library versions and probe version.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from meaningless_tokens.errors import CaptureError, ModelSourceError, UnsupportedModel
from meaningless_tokens.models.cache import sha256_file
from meaningless_tokens.models.entry import ModelEntry
from meaningless_tokens.models.partial import from_pretrained
from meaningless_tokens.store import write_json_atomic


def _architecture(model_dir: Path, trust_remote_code: bool) -> tuple[str | None, dict]:
    """(reason to refuse or None, facts the probe needs) from the config alone."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    text = config.get_text_config()
    if getattr(config, "is_encoder_decoder", False) or getattr(text, "is_encoder_decoder", False):
        return "an encoder-decoder model; only decoder-only causal LMs are supported", {}
    if getattr(text, "num_attention_heads", None) is None or getattr(text, "num_hidden_layers", None) is None:
        return "its config names no attention heads or layers (num_attention_heads, num_hidden_layers)", {}
    remote = trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not remote:
        return (f"not a causal LM of transformers {transformers.__version__} (no AutoModelForCausalLM class "
                f"for it)"), {}
    return None, {"vocab_size": text.vocab_size, "layer_types": list(getattr(text, "layer_types", None) or [])}


def _refusal(entry: ModelEntry, model_type: str, reason: str) -> UnsupportedModel:
    return UnsupportedModel(f"{entry.where}: model_type '{model_type}' is not supported: {reason}")


def check_architecture(entry: ModelEntry, model_dir: Path) -> None:
    """Refuse, from its config alone, a model that is not a decoder-only causal LM (cheap; before
    anything reads its weights)."""
    from transformers import AutoConfig

    trust_remote_code = entry.spec.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - unknown model_type, remote code not trusted
        from meaningless_tokens.models.sources import read_config

        model_type = read_config(entry.name, model_dir / "config.json").get("model_type", "?")
        raise _refusal(entry, model_type, f"transformers cannot read its config: "
                       f"{' '.join(str(e).split())[:300]}") from None
    reason, _ = _architecture(model_dir, trust_remote_code)
    if reason:
        raise _refusal(entry, config.model_type, reason)


def probe_tolerance(dtype: str) -> float:
    from meaningless_tokens.capture import TOLERANCE

    return TOLERANCE if dtype == "float32" else 1e-2  # half-precision eager probabilities are rounded


def run_probe(entry: ModelEntry, model_dir: Path, facts: dict) -> dict:
    """Load layer 0 .. the first layer of each layer type (float32, CPU) and check on a fixed
    prompt that the capture equals the model's own eager output_attentions (to 1e-6), is causal and
    its rows sum to 1. Raises UnsupportedModel naming model, model_type and reason."""
    import torch

    from meaningless_tokens import capture

    name, trust_remote_code = entry.name, entry.spec.trust_remote_code

    def refuse(reason: str):
        return _refusal(entry, facts["model_type"], reason)

    reason, arch = _architecture(model_dir, trust_remote_code)
    if reason:
        raise refuse(reason)
    layers = capture.probe_layers(arch)
    try:
        model = from_pretrained(name, model_dir, torch.float32, "eager", trust_remote_code, max(layers) + 1)
    except ModelSourceError:
        raise
    except Exception as e:  # noqa: BLE001 - a model transformers cannot build is refused, not crashed on
        raise refuse(f"cannot be loaded as a causal LM: {type(e).__name__}: {' '.join(str(e).split())[:300]}") from None
    model.eval().requires_grad_(False)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a model without the interface warns on set_attn_implementation
    try:
        result = capture.compare(model, capture.probe_ids(arch["vocab_size"]), layers)
    except CaptureError as e:
        raise refuse(str(e)) from None
    except Exception as e:  # noqa: BLE001
        raise refuse(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        del model
    import transformers

    return {"passed": True, "version": capture.PROBE_VERSION, "dtype": "float32", "device": "cpu",
            "transformers": transformers.__version__, **result}


def probe(entry: ModelEntry, model_dir: Path, weights_sha256: str, facts: dict, cache: Path) -> dict:
    """The probe's result, memoized per weights, config, library versions and probe version."""
    import torch
    import transformers

    from meaningless_tokens.capture import PROBE_VERSION

    config_sha = sha256_file(model_dir / "config.json")
    key = hashlib.sha256(json.dumps([weights_sha256, config_sha, transformers.__version__, torch.__version__,
                                     entry.spec.trust_remote_code, PROBE_VERSION]).encode()).hexdigest()
    memo = cache / "probes" / f"{key}.json"
    if memo.is_file():
        return json.loads(memo.read_text())
    result = run_probe(entry, model_dir, facts)
    write_json_atomic(memo, result)
    return result
