"""Numbers that know where they come from: `Num` (a value with its file and key), `Text` (a sentence of strings
and Nums rendered escaped for HTML or Markdown) and `Sources` (reads and caches them from the artifacts).

A lookup names the element it reads by its axes (`layer=`, `head=`, `bound="low"`, ...: `AXES` holds each dataset's
axes in the order its file stores them); the key a reader sees, `ds[i,j]`, is written from those names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from markupsafe import Markup, escape

from meaningless_tokens import store
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.store import read_h5, read_metrics


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
H5_KINDS = {template.split("{name}")[0]: k for k, template in store.PATHS.items() if template.endswith("/{name}.h5")}


def artifact(kind: str, name: str | None = None) -> str:
    """An artifact's path as a number's `src` names it (store.PATHS, relative to the project root)."""
    return store.path(kind, name).as_posix()


# each dataset's axes, in the order its stage stores them (the stages' docstrings): per artifact kind, by the
# dataset's last name, or by a suffix ("*_ci") for the families of measures. Values are indices into the file's
# axes: `layer` counts the file's layers (the extracted or measured ones), `head` its heads.
ALL = slice(None)  # every index of an axis (":" in a key)
_LH, _BLH, _L, _BL = ("layer", "head"), ("bound", "layer", "head"), ("layer",), ("bound", "layer")
AXES = {
    "stats": {"orig_mean": ("sample", "layer", "head"), "span_mass_per_sample": ("sample", "layer", "head"),
              "drop": _LH, "drop_pct": _LH, "span_mass": _LH, "head_rank": _LH,
              "drop_ci": _BLH, "drop_pct_ci": _BLH, "span_mass_ci": _BLH,
              "original_avg": ("layer", "head", "position"), "full_avg": ("layer", "head", "position"),
              "layer_drop_pct": _L, "mful_gap_pct": _L, "first_layer_lead_pct": _L,  # the first analysed layer only
              "layer_drop_pct_ci": _BL, "mful_gap_pct_ci": _BL, "first_layer_lead_pct_ci": _BL},
    "activations": {"lambda": ("sample", "layer", "head"), "lambda_mean": _LH,
                    "*_diff_ci": _BL, "*_diff_p": _L, "*_diff": _L, "*_ci": _BL, "*_mean": _L},
    "sweep": {**dict.fromkeys(("drop", "drop_pct", "span_mass"), ("count", "head")),
              **dict.fromkeys(("drop_ci", "drop_pct_ci", "span_mass_ci"), ("count", "bound", "head")),
              **dict.fromkeys(("orig_mean", "span_mass_per_sample"), ("count", "sample", "head")),
              "correct": ("count", "problem"), "likelihood": ("count", "problem"),
              "*_ci": ("count", "bound"), "*": ("count",)},
    "likelihood": {"level_ci": ("level", "bound"), "level_mean": ("level",), "level_n": ("level",),
                   "tokens": ("problem",), "diff": ("problem",), "ci": ("group", "bound"), "*": ("group",)},
    "arm_tuning": {"ci": ("bound",)},
}
BOUNDS = {"low": 0, "high": 1}  # an interval's ends, as its `bound` axis stores them


def axes(kind: str, ds: str) -> tuple[str, ...]:
    """The axes of dataset `ds` of an artifact of `kind`, outermost first."""
    table, base = AXES.get(kind, {}), ds.rsplit("/", 1)[-1]
    if base in table:
        return table[base]
    suffix = max((k for k in table if k.startswith("*") and base.endswith(k[1:])), key=len, default=None)
    if suffix is None:
        raise ValueError(f"{kind}: {ds}: no axes known for this dataset (results/trace.py, AXES)")
    return table[suffix]


def index_text(kind: str, ds: str, at: dict) -> str:
    """The index `ds[...]` of the element named by axis in `at` (an int or a slice each), as a key states it: every
    axis up to the last one named, in the file's order."""
    names = axes(kind, ds)
    unknown = sorted(set(at) - set(names))
    if unknown:
        raise ValueError(f"{kind}: {ds}: no axis {unknown} (its axes: {', '.join(names)})")
    last = max(names.index(a) for a in at)
    skipped = [a for a in names[:last] if a not in at]
    if skipped:
        raise ValueError(f"{kind}: {ds}: name the axes {skipped} too (ALL for every index)")

    def one(axis: str, v) -> str:
        if isinstance(v, slice):
            if v.step is not None:
                raise ValueError(f"{kind}: {ds}: {axis}: a step is not a key's slice")
            return f"{'' if v.start is None else int(v.start)}:{'' if v.stop is None else int(v.stop)}"
        return str(BOUNDS[v] if axis == "bound" and v in BOUNDS else int(v))

    return ",".join(one(a, at[a]) for a in names[:last + 1])


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

    def h5(self, src: str, ds: str, op: str = "value", scale: float = 1.0, fmt: str = ".3g", **at) -> Num:
        """Dataset (or `@attribute`) `ds` of file `src`, at the element its axes name (`layer=0, head=2`; none:
        the whole dataset), reduced by `op`."""
        if "[" in ds:
            raise ValueError(f"{src}: {ds}: name the index by its axes (layer=, head=, ...), not in the key")
        kind = next(k for prefix, k in H5_KINDS.items() if src.startswith(prefix))
        key = f"{ds}[{index_text(kind, ds, at)}]" if at else ds
        idx = parse_index(_INDEX.match(key)["idx"])
        if (src, ds) not in self._arrays:
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
            self._json[src] = read_metrics(self.root / src)
        return self._json[src]


def interval(lo: Num, hi: Num) -> Text:
    return Text("[", lo, ", ", hi, "]")


def excludes_zero(lo: Num, hi: Num) -> bool:
    return lo.value > 0 or hi.value < 0
