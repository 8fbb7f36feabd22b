"""Models: a params source -> a local Hugging Face folder in a cache outside the DVC workspace -> a loaded model.

A stage turns its model's name into a `ModelSetup` once (`setup_for`: spec, prepared folder, device, dtype) and
passes that down; `load` builds the model from it, whole or only its first layers. `prepare` makes the folder:
it fetches the source, converts a GGUF once, checks the model against its params and runs the attention probe;
the prepare stage (stages/prepare.py) writes its manifest, which later stages depend on.

The package, one job per module:
- `sources`: where the files come from (hub at a pinned revision, local folder, GGUF file, GGUF in PyPI wheels);
- `cache`: the cache's root and layout, which converted folder holds a model (`converted_folder`), digests;
- `conversion`: GGUF -> float32 safetensors and tokenizer (whole, or only the first layers), its fast reader;
- `partial`: loading only the first layers (truncated config, the checkpoint tensors they need);
- `probe`: refuses, with one line, a model whose attention the capture cannot record exactly;
- `tokenizer`: a model's tokenizer read without converting or loading it (the explorer's);
- `entry`: one model's part of the params (`ModelEntry`: its name, entry, the runtime, the params file), what the
  functions below `prepare` read instead of the whole params.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from meaningless_tokens.config import ModelSpec, Params, Runtime, check_model_facts
from meaningless_tokens.errors import ConfigError, ModelSourceError, UnsupportedModel
from meaningless_tokens.models.cache import MANIFEST, cache_root, converted_folder, describe_dir, model_facts, sha256_file, verify_conversion, weights_digest
from meaningless_tokens.models.conversion import convert_gguf
from meaningless_tokens.models.entry import ModelEntry
from meaningless_tokens.models.partial import (LAYER_KEY, from_pretrained, needed_keys, prepare_layers,
                                               stage_layers)
from meaningless_tokens.models.probe import check_architecture, probe, probe_tolerance
from meaningless_tokens.models.sources import check_hf_dir, fetch_hub, fetch_pypi_gguf, gguf_file, local_dir
from meaningless_tokens.models.tokenizer import load_tokenizer, token_decoder, tokenizer_source

__all__ = [  # what the stages, the library and the tests call
    "MANIFEST", "LAYER_KEY", "ModelEntry", "ModelSetup", "ModelSourceError", "PreparedModel", "UnsupportedModel", "cache_root",
    "convert_gguf", "converted_folder", "fetch_pypi_gguf", "load", "load_tokenizer", "manifest_path", "model_facts",
    "needed_keys", "prepare", "prepare_layers", "probe_tolerance", "setup_for", "stage_layers", "token_decoder",
    "tokenizer_source", "torch_device", "torch_dtype", "weights_digest",
]


@dataclass(frozen=True)
class PreparedModel:
    name: str
    path: Path                # local Hugging Face directory (read-only)
    weights_sha256: str       # sha256 over the safetensors files (see weights_digest)
    files: dict               # safetensors file name -> sha256
    source: dict              # the params source spec, plus what it resolved to
    facts: dict               # architecture facts from config.json
    probe: dict               # the attention probe's result (see probe())

    def manifest(self) -> dict:
        d = asdict(self)
        del d["path"]  # machine-specific; the manifest must be identical on every machine
        return d


@dataclass(frozen=True)
class ModelSetup:
    """One model as a stage runs it, resolved once from params (`setup_for`) and passed down whole, so the
    code below a stage never looks the model up again in the full params."""
    entry: ModelEntry        # its name, params' models.<name>, the runtime, the params file
    prepared: PreparedModel  # the local folder and what it holds
    device: str              # the torch device runtime.device resolved to
    dtype: str               # runtime.dtype
    threads: int | None      # runtime.threads

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def spec(self) -> ModelSpec:
        return self.entry.spec

    @property
    def params_file(self) -> Path:
        return self.entry.params_file

    @property
    def where(self) -> str:
        return self.entry.where

    @property
    def facts(self) -> dict:
        return self.prepared.facts


def setup_for(params: Params, name: str, layers=None) -> ModelSetup:
    """Model `name` ready for a stage: runtime.device checked first (a stage asked for CUDA on a machine
    without it stops before any model is fetched, converted or loaded), then `prepare`."""
    device = torch_device(params.runtime, params.file)
    return ModelSetup(ModelEntry.of(params, name), prepare(params, name, layers), device, params.runtime.dtype,
                      params.runtime.threads)


def prepare(params: Params, name: str, layers=None) -> PreparedModel:
    """Resolve model `name` to a local folder, converting GGUF once; checks layers/heads against it.

    `layers`: the layers the caller runs; a GGUF source is then converted only up to them (and the
    probe's layers): embeddings, those decoder layers, the final norm. None: the whole model.
    A GGUF model's weights_sha256 is the GGUF file's: its conversion is a function of it (and of the
    transformers version, which provenance records), whichever layers were converted."""
    entry = ModelEntry.of(params, name)
    spec, src = entry.spec, entry.spec.source
    cache = cache_root(params.runtime, params.file)
    resolved = src.model_dump()
    if src.kind in ("pypi_gguf", "gguf_file"):
        if src.kind == "pypi_gguf":
            gguf_path, gguf_sha = fetch_pypi_gguf(name, src, cache), src.sha256
        else:
            gguf_path = gguf_file(entry)
            gguf_sha = sha256_file(gguf_path)
            if src.sha256 and gguf_sha != src.sha256:
                raise ModelSourceError(f"model '{name}': {gguf_path} sha256 {gguf_sha} != expected {src.sha256}")
        path = convert_gguf(name, gguf_path, gguf_sha, cache, None if layers is None else max(layers) + 1)
        desc = json.loads((path / MANIFEST).read_text())
        verify_conversion(name, path, desc, cache)
        resolved["gguf_sha256"] = gguf_sha
        desc = {**desc, "weights_sha256": gguf_sha, "files": {"model.gguf": gguf_sha}}
    else:
        if src.kind == "local_dir":
            path = local_dir(entry)
        else:
            path, resolved["resolved_commit"] = fetch_hub(name, src, cache, entry.runtime.offline)
        check_hf_dir(name, path)
        check_architecture(entry, path)
        desc = describe_dir(path, cache, spec.trust_remote_code)
    facts = desc["facts"]
    check_model_facts(params, name, facts)  # the whole params: the charts' layers and heads of the model too
    result = probe(entry, path, desc["weights_sha256"], facts, cache)
    return PreparedModel(name=name, path=path, weights_sha256=desc["weights_sha256"], files=desc["files"],
                         source=resolved, facts=facts, probe=result)


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def torch_device(runtime: Runtime, params_file: Path) -> str:
    """runtime.device resolved: auto is CUDA where torch sees it; CUDA asked for where there is none is refused."""
    import torch

    want = runtime.device
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{params_file}: runtime.device: 'cuda' requested but torch sees no CUDA device "
                          f"(torch {torch.__version__}); use 'cpu' or 'auto'")
    return want


def load(setup: ModelSetup, attn_implementation: str = "eager", layers=None):
    """(model, tokenizer) from the prepared folder: safetensors only, eval mode, no gradients.

    With `layers`, only the embeddings and decoder layers 0..max(layers) are built and read (the
    base model without the LM head, plus its final norm); the forward of those layers is the full
    model's."""
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weights bar per load only clutters the stage logs
    if setup.threads:
        torch.set_num_threads(setup.threads)
    prepared, trust = setup.prepared, setup.spec.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=trust)
    n_layers = max(layers) + 1 if layers else None
    model = from_pretrained(prepared.name, prepared.path, torch_dtype(setup.dtype), attn_implementation, trust,
                             n_layers)
    model.to(setup.device).eval().requires_grad_(False)
    return model, tokenizer


def manifest_path(name: str) -> Path:
    return Path("artifacts") / "models" / f"{name}.json"
