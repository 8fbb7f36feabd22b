"""A GGUF file -> float32 safetensors and its tokenizer, once, in the model cache.

transformers' GGUF loader dequantizes (reading the file with a faster GGUFReader, `fast_reader_class`); the result is
saved under `converted/<gguf sha256>-v<V>/` (the whole model) or `-layers<n>/` (only the embeddings, the first n
decoder layers and the final norm, for the layer-only stages: the same tensors as the whole conversion's), with a
manifest of its digests and facts. Later loads read the safetensors in seconds.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import tempfile
import time
from pathlib import Path

from meaningless_tokens.errors import ModelSourceError
from meaningless_tokens.models.cache import CONVERSION_VERSION, MANIFEST, Staging, conversion_dir, converted_folder, converter, model_facts, weights_digest
from meaningless_tokens.models.partial import truncated_config
from meaningless_tokens.store import write_json_atomic


def gguf_header(path: Path) -> tuple[str, list[str], dict]:
    """(architecture, the tensor types gguf's numpy code cannot dequantize, the special tokens the file says a
    tokenizer adds: {"add_bos_token": bool, "add_eos_token": bool}, the keys it declares) of a GGUF file;
    transformers dequantizes with that code, so a GGUF holding such a type is refused naming it."""
    import gguf
    from gguf import quants

    try:
        reader = fast_reader_class()(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        adds = {key: bool(reader.fields[f"tokenizer.ggml.{key}"].contents()) for key in ("add_bos_token", "add_eos_token")
                if f"tokenizer.ggml.{key}" in reader.fields}
    except Exception as e:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise ModelSourceError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    traits = getattr(quants, "_type_traits", None)
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    if traits is None:  # another gguf layout: transformers' own error then speaks
        return arch, [], adds
    return arch, sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in plain
                         and t.tensor_type not in traits}), adds


def gguf_tokenizer(src_dir: Path, adds: dict):
    """The GGUF's tokenizer as transformers converts it, adding the special tokens the file says it adds:
    transformers 5.19 (the vLLM environment's) converts Gemma-3's without the BOS its GGUF declares, 5.24 with
    it; reloaded with the file's flags, 5.19's saves byte-identical to 5.24's tokenizer.json. A tokenizer that
    already agrees is left as converted (passing the flags would rewrite its post-processor). Whether transformers
    follows a flag on reload is its own (5.24 keeps Gemma-3's BOS when told add_bos_token=False)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file="model.gguf")
    ids = tokenizer("x", add_special_tokens=True).input_ids
    bare = tokenizer("x", add_special_tokens=False).input_ids
    does = {"add_bos_token": tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id] != bare[:1],
            "add_eos_token": tokenizer.eos_token_id is not None and ids[-1:] == [tokenizer.eos_token_id] != bare[-1:]}
    if all(does[k] == v for k, v in adds.items()):
        return tokenizer
    return AutoTokenizer.from_pretrained(src_dir, gguf_file="model.gguf", **adds)


# GGUF's untied LM head: a truncated model never runs it (the partial load builds the base model)
GGUF_HEAD = "output.weight"


@functools.cache
def fast_reader_class():
    """gguf's GGUFReader reading its memory map through a plain ndarray view: the same bytes and fields,
    but slicing a np.memmap runs its __array_finalize__ for every one of the millions of parts of a
    151k-token vocabulary (16 s per parse of Qwen2.5's GGUF on 2 cores, most of a layer-only conversion)."""
    import gguf
    import numpy as np

    class FastReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            count = int(count)
            dtype = np.dtype(dtype)
            arr = plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return FastReader


@contextlib.contextmanager
def gguf_reader(n_layers: int | None = None):
    """transformers' GGUF loader, reading with the fast reader, each file parsed once per outermost block (the
    config, the tokenizer and the model each call load_gguf_checkpoint, which only reads the reader: four parses of
    the same file otherwise, about 4 s each for a 151k-token vocabulary; a nested block takes its enclosing block's
    parse); with `n_layers`, seeing only the tensors of the first `n_layers` blocks and the rest of the model but its
    untied LM head: it dequantizes and processes each kept tensor exactly as in a full load (the same code runs), and
    never touches the others (the file is memory-mapped)."""
    import gguf

    base = gguf.GGUFReader
    fast = fast_reader_class()

    def keep(tensor_name: str) -> bool:
        if n_layers is None:
            return True
        if tensor_name.startswith("blk."):
            return int(tensor_name.split(".")[1]) < n_layers
        return tensor_name != GGUF_HEAD

    parsed: dict[str, object] = {}
    outer = base if getattr(base, "parses_once", False) else fast

    def reader(path):
        whole = parsed.get(os.fspath(path))
        if whole is None:
            whole = parsed[os.fspath(path)] = outer(path)
        view = copy.copy(whole)
        view.tensors = [t for t in whole.tensors if keep(t.name)]
        return view

    reader.parses_once = True
    gguf.GGUFReader = reader  # load_gguf_checkpoint imports it from the module at each call
    try:
        yield
    finally:
        gguf.GGUFReader = base


def convert_gguf(name: str, gguf_path: Path, gguf_sha256: str, cache: Path, n_layers: int | None = None) -> Path:
    """Dequantize a GGUF once into float32 safetensors + tokenizer: `<cache>/converted/<sha256>-v<V>/`.

    With `n_layers` (layer-only conversion), only the embeddings, the first `n_layers` decoder layers and
    the final norm are read and dequantized, into `<sha256>-v<V>-layers<n>/`, with the whole model's
    config and tokenizer: the partial load (`load(..., layers=...)`) reads it as it reads a full
    checkpoint. Its tensors are exactly the full conversion's (tested)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.utils import logging as hf_logging

    found = converted_folder(cache, gguf_sha256, n_layers)
    if found is not None:
        return found
    arch, unsupported, adds = gguf_header(gguf_path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelSourceError(
            f"model '{name}': GGUF architecture '{arch}' is not supported by transformers "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    if unsupported:
        raise ModelSourceError(f"model '{name}': GGUF {gguf_path} holds tensors of type {', '.join(unsupported)}, "
                               f"which gguf {_gguf_version()} cannot dequantize")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=cache) as link_dir:
        # from_pretrained wants a folder + file name; link the GGUF into a folder of its own
        src_dir = Path(link_dir)
        os.symlink(gguf_path.resolve(), src_dir / "model.gguf")
        try:
            with gguf_reader():
                config = AutoConfig.from_pretrained(src_dir, gguf_file="model.gguf")
                full_layers = config.get_text_config().num_hidden_layers
                if n_layers is not None:  # the attention probe's layers come along (layer 0 and the first of each type)
                    from meaningless_tokens.capture import probe_layers

                    types = list(getattr(config.get_text_config(), "layer_types", None) or [])
                    n_layers = max(n_layers, max(probe_layers({"layer_types": types})) + 1)
                    if n_layers >= full_layers:
                        n_layers = None
                final = conversion_dir(cache, gguf_sha256, n_layers)
                if (final / MANIFEST).is_file():  # finished meanwhile, or the probe's layers made it the whole model
                    return final
                tokenizer = gguf_tokenizer(src_dir, adds)
                if n_layers is None:
                    model = AutoModelForCausalLM.from_pretrained(
                        src_dir, gguf_file="model.gguf", dtype=torch.float32, attn_implementation="eager")
                else:
                    verbosity = hf_logging.get_verbosity()
                    hf_logging.set_verbosity_error()  # the untied LM head, absent on purpose, is reported missing
                    try:
                        with gguf_reader(n_layers):  # nested: sees the first n_layers blocks only
                            model = AutoModelForCausalLM.from_pretrained(
                                src_dir, gguf_file="model.gguf", config=truncated_config(copy.deepcopy(config), n_layers),
                                dtype=torch.float32, attn_implementation="eager")
                    finally:
                        hf_logging.set_verbosity(verbosity)
        except ModelSourceError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ModelSourceError(f"model '{name}': transformers cannot load GGUF {gguf_path}: {type(e).__name__}: {e}") from None
        packed = [n for n, m in model.named_modules() if "gguf" in type(m).__name__.lower()]
        if packed:
            raise ModelSourceError(f"model '{name}': GGUF modules still packed after loading: {packed[:3]}")
        # every weight is dequantized already; save_pretrained refuses while the quantizer is attached
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        with Staging(final) as tmp:
            if n_layers is None:
                model.save_pretrained(tmp, safe_serialization=True)
            else:
                _save_layers(model, config, tmp)
            tokenizer.save_pretrained(tmp)
            digest, files = weights_digest(tmp)
            write_json_atomic(tmp / MANIFEST, {
                "gguf_sha256": gguf_sha256, "gguf_architecture": arch, "weights_sha256": digest, "files": files,
                "facts": model_facts(tmp), "conversion_version": CONVERSION_VERSION,
                "transformers": converter(), "layers": n_layers,
                "convert_seconds": round(time.perf_counter() - started, 1),
            })
    return final


def _save_layers(model, full_config, out: Path) -> None:
    """The truncated model's tensors but its LM head, under the names a full conversion saves them, and
    the whole model's config (its layer count and per-layer lists), as save_pretrained writes it."""
    from safetensors.torch import save_file

    head = model.get_output_embeddings()
    embed = model.get_input_embeddings().weight
    state, saved_embed = {}, False
    for key, value in model.state_dict(keep_vars=True).items():
        if value is embed:  # a tied head is the embedding: saved once, under the embedding's name
            if saved_embed:
                continue
            saved_embed = True
        elif head is not None and value is head.weight:  # untied: never loaded, so not saved
            continue
        state[key] = value.detach().contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]  # as save_pretrained records it
    full_text, text = full_config.get_text_config(), config.get_text_config()
    for attr, value in vars(full_text).items():  # undo truncated_config: the per-layer lists and the count
        if "layer" in attr:
            setattr(text, attr, copy.deepcopy(value))
    config.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)


def _gguf_version() -> str:
    from importlib import metadata

    return metadata.version("gguf")
