"""Generation and teacher-forced scoring behind one interface (`Engine`, base.py), one module per backend:
transformers.py (generation and scoring in this process) and vllm.py (generation in worker processes). The stages
call `open_engine` (generation, the backend `evaluate.engine` names) or `open_scorer` (scoring) and the shared journal
machinery re-exported here.
"""

from __future__ import annotations

from meaningless_tokens import arm, models
from meaningless_tokens.config import Evaluate
from meaningless_tokens.engines.base import (JOURNAL_VERSION, Engine, Generated, Item, Journal, Record, Scorer, Scores,
                                             check_engine, journal_key, make_batches, merge_parts, part_path,
                                             run_journaled)
from meaningless_tokens.engines.transformers import (ATTENTION, SHAPE_STEP, SLIDING, Shape, TransformersEngine,
                                                     TransformersScorer, _BoxedStop, auto_batch_size, compile_for,
                                                     generate, kv_bytes_per_token, load_for_generation, row_bytes,
                                                     stop_ids)
from meaningless_tokens.engines.vllm import VllmEngine

__all__ = ["ATTENTION", "JOURNAL_VERSION", "SHAPE_STEP", "SLIDING", "Engine", "Generated", "Item", "Journal", "Record",
           "Scorer", "Scores", "Shape", "TransformersEngine", "TransformersScorer", "VllmEngine", "_BoxedStop",
           "auto_batch_size", "check_engine", "compile_for", "generate", "journal_key", "kv_bytes_per_token",
           "load_for_generation", "make_batches", "merge_parts", "open_engine", "open_scorer", "part_path", "row_bytes",
           "run_journaled", "stop_ids"]


def open_engine(cfg: Evaluate, conditions: list[str], setup: models.ModelSetup,
                arm_settings: arm.ArmSettings | None = None, sampled: bool = True) -> Engine:
    """The engine `evaluate.engine` names, loaded for the stage's model (the interface: `Engine`); `.fit(groups)`
    comes before `.settings` is read, `.close()` in the stage's finally (the ARM hook removed).
    `sampled`: whether sampled rows may come (evaluate.sampling is read only then: the sweep generates greedily)."""
    if cfg.engine == "vllm":
        return VllmEngine(cfg, conditions, setup, sampled)
    return TransformersEngine(cfg, setup, arm_settings, sampled)


def open_scorer(setup: models.ModelSetup) -> TransformersScorer:
    """The scoring engine (a `Scorer`) of the likelihood stages, the sweep's likelihood and ARM's tuning: transformers
    whatever evaluate.engine says (vLLM generates only), the whole model as scoring.load loads it; its `.model` takes
    the stage's TeacherForcedArm hook, `.attn` and `.pad` go into the provenance."""
    return TransformersScorer(setup)
