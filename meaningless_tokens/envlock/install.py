"""Installing a lock with uv: exactly its pins, hashes required, each from the source pip's configuration (or
PyTorch's CPU index, for torch's +cpu build) names."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens.envlock.lock import ROOT, _pin, parse
from meaningless_tokens.errors import LockError

# PyTorch's CPU wheel index, where PyTorch's install guide sends CPU-only machines: the only public source of
# torch's CPU build (2.13.0+cpu; PyPI's torch 2.13.0 is the CUDA build). A lock pin with a local version (`+cpu`)
# comes from here, unless a wheel folder of pip's configuration already holds that file (`local_wheel_folder`).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Sources:
    """Where packages come from, as pip's configuration on this machine says (pip.conf files and PIP_* variables):
    uv reads neither, so `install` hands them over."""
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def uv_args(self) -> list[str]:
        args = ["--index-url", self.index_url] if self.index_url else []
        args += [a for url in self.extra_index_urls for a in ("--extra-index-url", url)]
        args += [a for link in self.find_links for a in ("--find-links", link)]
        if self.extra_index_urls:
            # pip merges every index and takes the best match; uv by default stops at the first index that knows a
            # package. The lock fixes the version and the hashes the file, so merging (pip's way) is safe here.
            args += ["--index-strategy", "unsafe-best-match"]
        return args


def pip_sources(python: str = sys.executable) -> Sources:
    """The index and find-links settings of pip's configuration, read by pip itself (`pip config list` shows the
    files and the PIP_* variables, the latter as `:env:.<key>`); none where pip is missing or reads nothing."""
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
    except (OSError, subprocess.SubprocessError):
        return Sources()
    values: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        option = key.rpartition(".")[2]
        if sep and key.split(".")[0] in ("global", "install", ":env:") and option in ("index-url", "extra-index-url",
                                                                                      "find-links"):
            try:  # pip prints each value as a Python literal ('a\\nb' for a value spread over lines)
                text = str(ast.literal_eval(value.strip()))
            except (ValueError, SyntaxError):
                text = value.strip()
            values.setdefault(option, []).extend(text.split())
    index = values.get("index-url", [None])[-1]
    return Sources(index, tuple(dict.fromkeys(values.get("extra-index-url", []))),
                   tuple(dict.fromkeys(values.get("find-links", []))))


def blocks(lock: Path) -> list[tuple[str, str, str]]:
    """(canonical name, version, text) of each pinned requirement of `lock`, its hash lines and comments included."""
    parse(lock)  # refuses a lock without exact pins, naming the line
    out: list[tuple[str, str, str]] = []
    for line in lock.read_text().splitlines(keepends=True):
        if line[:1].isalnum():
            out.append((*_pin(line)[:2], line))
        elif out and line[:1].isspace():
            out[-1] = (*out[-1][:2], out[-1][2] + line)
    return out


def local_wheel_folder(name: str, version: str, links: tuple[str, ...]) -> str | None:
    """A find-links entry of pip's configuration that is a folder on this machine holding a wheel of name==version."""
    for link in links:
        folder = Path(link.removeprefix("file://"))
        if folder.is_dir() and any(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl")):
            return str(folder)
    return None


def install(lock: Path, uv: str, python: str, torch_index: str = CPU_TORCH_INDEX,
            sources: Sources | None = None) -> None:
    """Install exactly the pins of `lock` into the environment of `python` with uv: hashes required, no resolver.
    Pins with a local version (torch's `+cpu` build) come from `torch_index` alone, or from a wheel folder of pip's
    configuration that holds the file (so a machine that serves it locally never waits on the index); every other
    pin from pip's configured sources (PyPI by default)."""
    import tempfile

    sources = pip_sources() if sources is None else sources
    entries = blocks(lock)
    groups: list[tuple[list[str], list[str]]] = []
    rest = [text for _, version, text in entries if "+" not in version]
    if rest:
        groups.append((rest, sources.uv_args()))
    for name, version, text in entries:
        if "+" in version:
            folder = local_wheel_folder(name, version, sources.find_links)
            groups.append(([text], ["--no-index", "--find-links", folder] if folder else ["--index-url", torch_index]))
    with tempfile.TemporaryDirectory(prefix="envlock-") as tmp:
        for i, (texts, args) in enumerate(groups):
            req = Path(tmp) / f"part{i}.txt"
            req.write_text("".join(texts))
            cmd = [uv, "pip", "install", "--python", python, "--require-hashes", "--no-deps", "--quiet", "-r", str(req),
                   *args]
            try:
                subprocess.run(cmd, check=True, env={**os.environ, "UV_NO_PROGRESS": "1"})
            except subprocess.CalledProcessError as e:
                shown = " ".join(cmd[1:cmd.index("-r")] + cmd[cmd.index("-r") + 2:])
                raise LockError(f"{lock.relative_to(ROOT) if lock.is_relative_to(ROOT) else lock}: "
                                f"`uv {shown}` failed (exit {e.returncode}) for "
                                f"{', '.join(t.split('==')[0] for t in texts[:5])}{' ...' if len(texts) > 5 else ''}") from None
