"""Phrases several charts' explanations use: layer and head names, signed changes said with words, counts,
and the stock sentences of the hypothesis and the axes."""

from __future__ import annotations

from meaningless_tokens.report.trace import Num, Text, excludes_zero, interval


def label(layer: int, head: int | None = None) -> str:
    """"Layer 1 Head 1" for 0-based layer 0, head 0: charts and report count both from 1, as the paper does."""
    return f"Layer {layer + 1}" + (f" Head {head + 1}" if head is not None else "")


def head_list(heads) -> str:
    """0-based heads as the charts number them: "1, 2, 8"."""
    return ", ".join(str(h + 1) for h in heads)


def verdict_drop(pct: Num, lo: Num, hi: Num, where: str) -> Text:
    """The paper's prediction for attention on original tokens, checked against one drop interval."""
    if excludes_zero(lo, hi):
        agree = "agrees with" if pct.value > 0 else "runs against"
        return Text(f"At {where} the original tokens' attention ", change(pct), " %; the drop's interval ",
                    interval(lo, hi),
                    f", which excludes zero: this run {agree} the prediction.")
    return Text(f"At {where} the original tokens' attention ", change(pct), " %, but the drop's interval ",
                interval(lo, hi),
                " includes zero: this run neither confirms nor refutes the prediction there.")


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


HYPOTHESIS = ("The paper's account: in the first layers the inserted meaningless tokens take part of the "
              "attention that the original tokens would otherwise receive, so the original tokens' weights "
              "drop and the attention outputs shift; a meaningful span of the same length should not act "
              "the same way.")
AXES_ORIGINAL = ("x axis: original token position j, the token's index in the none prompt (0 is the first "
                 "token, the attention sink); under mless and mful the same token sits after the span, and "
                 "the curves compare it with itself.")
AXES_WEIGHT = ("y axis: average attention weight the token receives, averaged over its queries, then over "
               "problems (rows of attention sum to 1, so small values are normal for long prompts).")
AXES_LAYERS = "Layers and heads are numbered from 1 (see Conventions)."
