"""How the charts look: colours per condition, the attention curves and axes, and every text a chart draws,
one table per `figures.labels` mode, looked up in one place (`Labels(mode, kind)`).

descriptive: labels that say what is plotted. paper: the seed charts' own titles, legends, axis title and x range
(0..N); a mode's table lists only what differs from the descriptive one.
"""

from __future__ import annotations

import numpy as np

COLORS = {"none": "#1f77b4", "mless": "#d62728", "mful": "#2ca02c", "arm": "#9467bd"}
LABELS = {"none": "No insertion (none)", "mless": "Meaningless tokens (mless)", "mful": "Random sentence (mful)",
          "arm": "ARM on Layer 1's MLP (arm)"}
COLOR_NAMES = {"none": "blue", "mless": "red", "mful": "green", "arm": "purple"}

# per chart kind ("*": every attention chart), the texts it draws. Fields of a title: {disp} (display name),
# {layer} ("Layer 1"), {layer_head} ("Layer 1 Head 22"), {head} (1-based); legend: per condition, else LABELS.
# x_pad: the x range is -x_pad .. N - x_pad (0.5: centred on the token positions).
DESCRIPTIVE = {
    "*": {"y": "Average attention weight", "x_pad": 0.5, "legend": {}},
    "layer-sweep": {"x": "Original token position"},
    "heads": {"x": "Original token position", "x_full": "Token position (mless prompt)",
              "title_full": "{layer_head}: full mless prompt", "band": "Meaningless tokens"},
    "conditions": {"height": 3.6, "title": "{disp} {layer_head}", "x": "Original token position",
                   "title_full": "{disp} {layer_head}: full prompt", "x_full": "Token position",
                   "band": "Inserted span", "suptitle": None},
    "cross-model": {"x": "Token position", "band": "Inserted span",
                    "legend": {"mless": "Meaningless tokens", "mful": "Random sentence"}},
    "accuracy": {"y": "{benchmark} accuracy (%, math-verify)", "title": "Accuracy by prompt condition"},
}
PAPER = {
    "*": {"y": "Average Attention Weight", "x_pad": 0},
    "layer-sweep": {"x": "Token position", "legend": {"none": "None", "mless": "Mless"}},
    "heads": {"x": "Token position", "x_full": "Token position", "title_full": "{disp} {layer_head}",
              "legend": {"none": "w/o meaningless tokens", "mless": "w/ meaningless tokens"}},
    "conditions": {"height": 3.9, "title": "{disp} {layer}: original tokens", "x": "Token position",
                   "title_full": "{disp} {layer}: full prompt", "band": "Meaningless tokens",
                   "suptitle": "Average attention on Head {head}",
                   "legend": {"none": "None", "mless": "Mless", "mful": "Mful"}},
    # the seed's legend is the two curves; its band is the mless line's own label, so it stays out of the legend
    "cross-model": {"band": "_nolegend_"},
    # the seed's title names MATH-500: on another benchmark the descriptive title stays
    "accuracy": {"y": "Accuracy (%, math-verify)", "title@MATH-500": "Results on Math-500",
                 "legend": {"none": "w/o", "mless": "w/ Mless", "mful": "w/ Mful"}},
}
MODES = {"descriptive": DESCRIPTIVE, "paper": PAPER}


class Labels:
    """The texts chart `kind` draws in `mode`: the mode's own, else the descriptive ones."""

    def __init__(self, mode: str, kind: str):
        self.texts = {}
        for table in (DESCRIPTIVE, MODES[mode]):
            for part in ("*", kind):
                entry = table.get(part, {})
                legend = {**self.texts.get("legend", {}), **entry.get("legend", {})}
                self.texts.update(entry, legend=legend)

    def __getitem__(self, key: str):
        return self.texts[key]

    def get(self, key: str, default=None):
        return self.texts.get(key, default)

    def text(self, key: str, **fields) -> str | None:
        """Text `key` with its fields filled in (None where the mode draws none)."""
        value = self.texts[key]
        return None if value is None else value.format(**fields)

    def legend(self, cond: str) -> str:
        return self.texts["legend"].get(cond, LABELS[cond])


def colour_key(conds) -> str:
    """'blue none, red mless, ...' for the conditions a chart shows."""
    return ", ".join(f"{COLOR_NAMES[c]} {c}" for c in conds)


def curve(ax, st, cond, kind, li, hi, limit, **kw):
    y = st[cond][f"{kind}_avg"][li, hi][:limit]
    ax.plot(np.arange(len(y)), y, color=COLORS[cond], label=kw.pop("label", LABELS[cond]), lw=1.4, **kw)
    return y


def shade_span(ax, st, cond, limit, label="Meaningless tokens"):
    start, end = st["span"][cond]
    if 0 <= start < end:
        ax.axvspan(start - 0.5, min(end, limit) - 0.5, color=COLORS[cond], alpha=0.12, label=label)


def attention_axes(ax, labels: Labels, xlabel: str, limit: int):
    """Axis titles, x range and grid of an attention chart, in the mode's texts."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(labels["y"])
    pad = labels["x_pad"]
    ax.set_xlim(-pad, limit - pad)
    ax.grid(alpha=0.3, lw=0.5)
