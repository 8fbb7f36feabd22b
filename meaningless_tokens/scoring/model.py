"""The model scoring runs: the whole model, SDPA where the family has it, and the id right padding fills with."""

from __future__ import annotations

from meaningless_tokens import models


def load(setup: models.ModelSetup) -> tuple:
    """(model, tokenizer, attention implementation): the whole model, SDPA where the family has it."""
    try:
        return (*models.load(setup, attn_implementation="sdpa"), "sdpa")
    except ValueError as e:
        if "scaled_dot_product" not in str(e):
            raise
    return (*models.load(setup, attn_implementation="eager"), "eager")


def pad_id(tokenizer) -> int:
    for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if t is not None:
            return int(t)
    return 0
