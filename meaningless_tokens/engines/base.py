"""The engine interface and what every backend shares: the items of a generation, the backends by name and the
check of the named one's settings.

`Engine` is what the stages call, whichever backend `evaluate.engine` names: `generate(batches, done)` (greedy or
seeded sampled continuations), `loglikelihood(seqs, ...)` (teacher-forced log-probs), `fit`, `settings`, `close`.
`Scorer` is its scoring part alone: what the likelihood stages need, which read none of evaluate's settings.
The backends, by name (`BACKENDS`): meaningless_tokens/engines/transformers.py and meaningless_tokens/engines/vllm.py;
the journal a generation is kept in: journal.py.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Iterator, NamedTuple, Protocol, runtime_checkable

import numpy as np

from meaningless_tokens.config import Evaluate, Runtime

if TYPE_CHECKING:
    from meaningless_tokens import models
    from meaningless_tokens.scoring import Seq

# the backends `evaluate.engine` names, each a module imported only when named (`backend`); a module of this table
# defines `check_params(cfg, conditions, runtime, params_file)` (its own bad input, before any work) and
# `open_engine(cfg, conditions, setup, arm_settings, sampled)` (its Engine). Its name is also in the config's
# `Evaluate.engine` (tests/test_engine_protocol.py checks they agree).
BACKENDS = {
    "transformers": "meaningless_tokens.engines.transformers",
    "vllm": "meaningless_tokens.engines.vllm",
}


def backend(name: str) -> ModuleType:
    """The backend module `evaluate.engine` names, imported now (a run imports no backend it does not use)."""
    return importlib.import_module(BACKENDS[name])


@dataclass(frozen=True)
class Item:
    index: int              # problem index (row of the dataset file)
    condition: str
    input_ids: tuple[int, ...]
    sample: int = -1        # -1: the greedy output; 0..n-1: a sampled one (evaluate.sampling)

    @property
    def key(self) -> tuple:
        return (self.index, self.condition) if self.sample < 0 else (self.index, self.condition, self.sample)


Generated = tuple[Item, str, int, str, float]  # item, text, n_tokens, stop reason, seconds


class Scores(NamedTuple):
    """What `loglikelihood` returns: per sequence the log-prob of each scored token (float64), how they were computed
    (scoring's method and checks, for the provenance) and the seconds the scoring took."""
    logprobs: list[np.ndarray]
    how: dict
    seconds: float


class Closing:
    """`with engine:` closes it on every exit (what each backend's `close` removes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@runtime_checkable
class Scorer(Protocol):
    """Teacher-forced scoring (the likelihood stages, the sweep's likelihood, ARM's tuning)."""

    tokenizer: object

    def loglikelihood(self, seqs: list[Seq], batch_tokens: int, arm=None, *, method: str = "fastest",
                      shown: bool = False, bar=None, warn=None, desc: str = "scoring", name: str = "") -> Scores:
        """Per sequence (scoring.Seq) the log-prob of each scored token given everything before it, batched within
        `batch_tokens`; `arm`: a TeacherForcedArm hook installed on the model, editing the `arm` rows. `method`:
        "fastest" (packed where the model passes the packing checks, else whole), "packed" or "whole". `shown`: a
        progress bar `desc` over the sequences and a fall-back said on stderr as `<name>: <why>`; else `bar` (one
        shared by several calls) and `warn` (called with a fall-back's reason)."""

    def close(self) -> None:
        """What the engine installed on the model removed (the stage's finally; a `with` block closes it too)."""

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class Engine(Scorer, Protocol):
    """A generation backend (`evaluate.engine`), loaded for one model by `open_engine`."""

    eos: list[int]               # end-of-text ids
    settings: dict               # what the outputs depend on beyond prompts and weights: provenance, journal key
    stats: dict                  # how the run went (warm-up, auto batch size, vLLM's start): the timing sidecar
    sampling: dict | None        # the sampled rows' settings (sampling.settings_for); None: greedy rows only
    batch_size: int | str | None  # rows per journaled batch, resolved by `fit`

    def fit(self, groups: list[tuple[list[Item], int]], like=None) -> int:
        """The batch size (and a compiled plan's shape) from every item the stage generates, `groups`: (items, their
        max_new_tokens); called before `settings` is read. `like`: another stage's shape to adopt where the items fit.
        """

    def row_key(self) -> dict | None:
        """What a kept greedy row depends on beyond its prompt (meaningless_tokens/generations.py), after `fit`; None
        where this run keeps none (a row's tokens depend on its batch)."""

    def take(self, kept) -> int:
        """Rows of evaluate's run (generations.Kept) to reuse where their key is `row_key()`; how many."""

    def generate(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        """The continuations of every batch (`done`: the keys already journaled, which a backend may skip), as
        they finish: (item, text, n_tokens, stop reason, seconds)."""


def _common_settings(cfg: Evaluate, setup: models.ModelSetup, eos: list[int], device: str) -> dict:
    return {"max_new_tokens": cfg.max_new_tokens, "stop_at_boxed": cfg.stop_at_boxed, "greedy": True,
            "eos_token_ids": eos, "device": device, "dtype": setup.dtype}


def check_engine(cfg: Evaluate, conditions: list[str], runtime: Runtime, params_file: Path) -> None:
    """The named backend's own bad input (vLLM missing, more devices than there are, arm on vLLM), before any work
    (before the model is prepared: a stage checks this first). `cfg`: params' evaluate, `conditions`: the
    stage's (evaluate: prompt.conditions; the sweep: its own); `runtime`'s device is resolved here only for vLLM or
    evaluate.batch_size auto (else the stage resolves it when it prepares the model)."""
    backend(cfg.engine).check_params(cfg, conditions, runtime, params_file)
