"""Generation and teacher-forced scoring behind one interface (`Engine`, base.py), one module per backend, registered
by name in base.BACKENDS and imported only when named: transformers.py (generation and scoring in this process) and
vllm.py (generation in worker processes, vllm_worker.py). The stages call `open_engine` (generation, the backend
`evaluate.engine` names) or `open_scorer` (scoring: scorer.py, which imports no generation code) and the journal
(journal.py). This package imports only base.py when imported (a vLLM worker imports it first): every other name
here is its module's, imported when first asked for. The transformers backend: transformers.py (the engine),
generation.py (its loop and stop rule), planning.py (shapes, compile, batch sizes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from meaningless_tokens.engines.base import (BACKENDS, Engine, Generated, Item, Scorer, Scores, backend,
                                             check_engine)

if TYPE_CHECKING:
    from meaningless_tokens import arm, models
    from meaningless_tokens.config import Evaluate

# the names this package gives of its modules, each imported when first asked for (`__getattr__`)
_LAZY = {
    "journal": ("JOURNAL_VERSION", "Journal", "Record", "journal_key", "make_batches", "merge_parts", "part_path",
                "run_journaled"),
    "scorer": ("TransformersScorer", "open_scorer"),
    "generation": ("ATTENTION", "_BoxedStop", "generate", "load_for_generation", "stop_ids"),
    "planning": ("SHAPE_STEP", "SLIDING", "auto_batch_size", "compile_for", "kv_bytes_per_token", "row_bytes"),
    "transformers": ("Shape", "TransformersEngine"),
    "vllm": ("VllmEngine",),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = ["BACKENDS", "Engine", "Generated", "Item", "Scorer", "Scores", "backend", "check_engine", "open_engine",
           *_WHERE]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        if name in _LAZY or name in ("vllm_worker", "base"):  # a submodule: engines.transformers
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def open_engine(cfg: Evaluate, conditions: list[str], setup: models.ModelSetup,
                arm_settings: arm.ArmSettings | None = None, sampled: bool = True) -> Engine:
    """The engine `evaluate.engine` names (its backend module imported now), loaded for the stage's model (the
    interface: `Engine`); `.fit(groups)` comes before `.settings` is read, `.close()` in the stage's finally (the ARM
    hook removed). `sampled`: whether sampled rows may come (evaluate.sampling is read only then: the sweep generates
    greedily)."""
    return backend(cfg.engine).open_engine(cfg, conditions, setup, arm_settings, sampled)
