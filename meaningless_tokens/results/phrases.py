"""Phrases several charts' explanations use: layer and head names, signed changes said with words, counts. The
stock sentences of the hypothesis and the axes are written in templates/charts/phrases.j2 (report/prose.py, `shared`)."""

from __future__ import annotations

from meaningless_tokens.results.trace import Num, Text


def label(layer: int, head: int | None = None) -> str:
    """"Layer 1 Head 1" for 0-based layer 0, head 0: charts and report count both from 1, as the paper does."""
    return f"Layer {layer + 1}" + (f" Head {head + 1}" if head is not None else "")


def head_list(heads) -> str:
    """0-based heads as the charts number them: "1, 2, 8"."""
    return ", ".join(str(h + 1) for h in heads)


def count_of(names: list[str], total: int, noun: str = "models", one: str = "model") -> str:
    """"no model", "both models", "all 3 models", "the one model", or "2 of 3 models (A, B)": no zero counts,
    no list that names every model."""
    k = len(names)
    if k == 0:
        return f"no {one}"
    if k == total:
        return f"both {noun}" if total == 2 else f"all {total} {noun}" if total > 1 else f"the one {one}"
    return f"{k} of {total} {noun} ({', '.join(names)})"


def change(n: Num, down: str = "drops by", up: str = "rises by") -> Text:
    """A signed change said with words: "drops by 28.2" for +28.2 as a drop, "rises by 3.1" for -3.1; the number
    keeps its trace (a negative one is read with scale -1)."""
    sign = -1.0 if n.value < 0 else 1.0
    return Text(down if sign > 0 else up, " ", Num(abs(n.value), n.src, n.key, n.op, n.scale * sign,
                                                   n.fmt.replace("+", "")))
