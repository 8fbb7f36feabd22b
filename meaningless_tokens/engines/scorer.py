"""Scoring's engine side: teacher-forced `loglikelihood` on a model loaded in this process (meaningless_tokens/scoring/
holds the arithmetic), and `TransformersScorer`, the likelihood stages' engine (`open_scorer`): transformers whatever
evaluate.engine says, the whole model as scoring.load loads it. The scoring-only stages import this module and no
generation code; the transformers engine (transformers.py) takes `Likelihood` for its own `loglikelihood`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from meaningless_tokens.engines.base import Closing, Scores

if TYPE_CHECKING:
    from meaningless_tokens import models
    from meaningless_tokens.scoring import Seq, TeacherForcedArm


class Likelihood:
    """`loglikelihood` on the loaded model (`self.model`, `self.tokenizer`): the functions of
    meaningless_tokens/scoring/, which hold the arithmetic (see Scorer.loglikelihood). scoring is imported where it runs: a generation stage never
    scores, and its outputs (and dvc.yaml's deps) do not depend on scoring/."""

    @property
    def pad(self) -> int:
        """The id right padding fills with (scoring.pad_id)."""
        from meaningless_tokens import scoring

        return scoring.pad_id(self.tokenizer)

    def loglikelihood(self, seqs: list[Seq], batch_tokens: int, arm: TeacherForcedArm | None = None, *,
                      method: str = "fastest", shown: bool = False, bar=None, warn=None, desc: str = "scoring",
                      name: str = "") -> Scores:
        from meaningless_tokens import scoring

        if shown:
            if method != "fastest" or bar is not None or warn is not None:
                raise ValueError("loglikelihood(shown=True) shows its own bar and warnings, with the fastest method")
            return Scores(*scoring.score_shown(self.model, seqs, batch_tokens, self.pad, arm, desc, name))
        started = time.perf_counter()
        if method == "fastest":
            logprobs, how = scoring.score_fastest(self.model, seqs, batch_tokens, self.pad, arm, bar, warn)
        elif method in ("packed", "whole"):
            score = scoring.score_packed if method == "packed" else scoring.score
            logprobs, how = score(self.model, seqs, batch_tokens, self.pad, arm, bar), {"method": method}
        else:
            raise ValueError(f"loglikelihood: method {method!r}: fastest, packed or whole")
        return Scores(logprobs, how, time.perf_counter() - started)


class TransformersScorer(Likelihood, Closing):
    """The likelihood stages' engine: the whole model as scoring.load loads it (SDPA where the family has it, else
    eager), for `loglikelihood` alone; these stages generate nothing and read none of evaluate's settings."""

    def __init__(self, setup: models.ModelSetup):
        from meaningless_tokens import scoring

        self.model, self.tokenizer, self.attn = scoring.load(setup)

    def close(self) -> None:
        """Nothing to remove: a scoring stage installs its ARM hook itself (hooks.Hooks) around its calls."""


def open_scorer(setup: models.ModelSetup) -> TransformersScorer:
    """The scoring engine (a `Scorer`) of the likelihood stages, the sweep's likelihood and ARM's tuning: transformers
    whatever evaluate.engine says (vLLM generates only), the whole model as scoring.load loads it; its `.model` takes
    the stage's TeacherForcedArm hook, `.attn` and `.pad` go into the provenance."""
    return TransformersScorer(setup)
