"""Numbers that know where they come from: `Num` (a value with its file and key), `Text` (a sentence of strings
and Nums rendered escaped for HTML or Markdown) and `Sources` (reads and caches them from the artifacts)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from markupsafe import Markup, escape

from meaningless_tokens import store
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.store import read_h5


@dataclass(frozen=True)
class Num:
    """A number read from an artifact: `src` file, `key` inside it, reduced by `op`, times `scale`."""
    value: float
    src: str
    key: str
    op: str = "value"
    scale: float = 1.0
    fmt: str = ".3g"

    def __str__(self) -> str:
        return format(round(self.value) if self.fmt == "d" else self.value, self.fmt)

    def __html__(self) -> str:
        attrs = {"src": self.src, "key": self.key, "op": self.op, "scale": repr(self.scale),
                 "fmt": self.fmt, "value": repr(float(self.value))}
        title = f"{self.src}: {self.key}" + ("" if self.op == "value" else f" ({self.op})") + \
            ("" if self.scale == 1 else f" x {self.scale:g}")
        return Markup('<span class="num" title="{}" {}>{}</span>').format(
            title, Markup(" ".join(f'data-{k}="{escape(v)}"' for k, v in attrs.items())), str(self))


# characters that start Markdown markup inline (a bracket escaped makes "(" and "!" inert too)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~$])")


def md_escape(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", str(text))


class Text:
    """A sentence of literal strings and Nums, rendered escaped for HTML (`__html__`) or Markdown (`str`)."""

    def __init__(self, *parts):
        self.parts = parts

    def __html__(self) -> str:
        return Markup("").join(p if isinstance(p, (Num, Text)) else escape(p) for p in self.parts)

    def __str__(self) -> str:
        return "".join(str(p) if isinstance(p, (Num, Text)) else md_escape(p) for p in self.parts)


_INDEX = re.compile(r"^(?P<ds>[^\[]+)(?:\[(?P<idx>[^\]]*)\])?$")
# the artifact kind of each folder a number can come from
H5_KINDS = {store.PATHS[k].split("{name}")[0]: k for k in ("stats", "eval", "activations", "sweep", "likelihood",
                                                                  "arm_tuning")}


def artifact(kind: str, name: str | None = None) -> str:
    """An artifact's path as a number's `src` names it (store.PATHS, relative to the project root)."""
    return store.path(kind, name).as_posix()


def parse_index(text: str | None) -> tuple:
    if not text:
        return ()
    out = []
    for part in text.split(","):
        if ":" in part:
            a, b = part.split(":")
            out.append(slice(int(a) if a else None, int(b) if b else None))
        else:
            out.append(int(part))
    return tuple(out)


class Sources:
    """Reads numbers from the artifacts under `root`, caching opened arrays."""

    def __init__(self, root: Path):
        self.root = root
        self._arrays: dict[tuple[str, str], np.ndarray] = {}
        self._json: dict[str, dict] = {}

    def h5(self, src: str, key: str, op: str = "value", scale: float = 1.0, fmt: str = ".3g") -> Num:
        m = _INDEX.match(key)
        ds, idx = m["ds"], parse_index(m["idx"])
        if (src, ds) not in self._arrays:
            kind = next(k for prefix, k in H5_KINDS.items() if src.startswith(prefix))
            with read_h5(self.root / src, kind) as f:
                if ds.startswith("@"):  # a root attribute
                    self._arrays[(src, ds)] = np.asarray(f.attrs[ds[1:]])
                elif ds in f:
                    self._arrays[(src, ds)] = f[ds][()]
                else:
                    raise ArtifactError(f"{self.root / src}: missing dataset {ds} (written by another version?)")
        sel = self._arrays[(src, ds)][idx]
        if op == "value":
            value = float(sel)
        elif op == "mean":
            value = float(np.nanmean(sel))
        elif op == "max":
            value = float(np.nanmax(sel))
        elif op == "argmax":  # position on the sliced axis, counted from the start of the array
            start = next((s.start or 0 for s in idx if isinstance(s, slice)), 0)
            value = float(np.nanargmax(sel) + start)
        else:
            raise ValueError(op)
        return Num(value * scale, src, key, op, scale, fmt)

    def js(self, src: str, key: str, scale: float = 1.0, fmt: str = ".3g") -> Num:
        value = self.json(src)
        try:
            for k in key.split("."):
                value = value[k]
        except KeyError:
            raise ArtifactError(f"{self.root / src}: no key {key!r} (written by another version?)") from None
        return Num(float(value) * scale, src, key, "value", scale, fmt)

    def json(self, src: str) -> dict:
        if src not in self._json:
            path = self.root / src
            if not path.is_file():
                raise ArtifactError(f"{path}: missing (run: dvc repro)")
            try:
                self._json[src] = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ArtifactError(f"{path}: not valid JSON ({e})") from None
        return self._json[src]


def interval(lo: Num, hi: Num) -> Text:
    return Text("[", lo, ", ", hi, "]")


def excludes_zero(lo: Num, hi: Num) -> bool:
    return lo.value > 0 or hi.value < 0
