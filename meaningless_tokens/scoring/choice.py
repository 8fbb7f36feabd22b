"""Which scoring a run takes: packed where the model passes the packing checks on one problem, else whole
(`score_fastest`, `score_shown` behind a progress bar), and the LM head's check against the model's own logits."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from meaningless_tokens import progress
from meaningless_tokens.errors import UnsupportedModel
from meaningless_tokens.scoring.batched import score
from meaningless_tokens.scoring.packed import check_mask, check_packed, score_packed
from meaningless_tokens.scoring.sequences import Seq

if TYPE_CHECKING:
    from meaningless_tokens.arm.teacher_forced import TeacherForcedArm


# the largest difference of a summed log-prob (nats) between the packed and the whole-sequence scoring on the
# checked problem for which `score_fastest` uses the packed one, in float32 and float64. float32 rounding of a sum
# over at most 32 tokens reaches 1.1e-4 (SmolLM2-135M, the first of 100 problems: at 1e-4 that run fell back to
# whole scoring, 1.7x the time). In bfloat16 the two orders of summation differ by 0.03 nats on the tiny test
# models and by 1.2 and 3.0 nats at the widths of the paper's 1.5B and 7B models: no tolerance there tells
# rounding from a leaking mask, so there `check_mask`, exact in every dtype, decides alone
PACKED_TOLERANCE = 1e-3


def score_fastest(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
                  bar=None, warn=None) -> tuple[list[np.ndarray], dict]:
    """Per sequence, the log-probs of `score`: `score_packed` where the packing is checked on one problem (the
    first, its arm rows included): the tree mask exactly (`check_mask`) and, in float32 and float64, the sums
    against whole-sequence scoring within PACKED_TOLERANCE (`check_packed`: the positions too); else `score` for
    every sequence, and `warn` is called with the check that failed. Returns (log-probs, how): how holds
    "method" ("packed" or "whole") and "packed_check_max_abs_diff"; in another dtype also
    "packed_check_compared": False (that difference is the dtype's rounding, recorded, not compared) and
    "mask_check_max_abs_diff"; after a fall-back "mask_check_max_abs_diff" and "why"."""
    import torch

    first = [s for s in seqs if s.index == seqs[0].index] if seqs else []
    if not first:
        return [], {"method": "whole", "packed_check_max_abs_diff": None}
    check = check_packed(model, first, batch_tokens, pad, arm_hook)
    move, moved = check_mask(model, first, batch_tokens, pad, arm_hook)
    dtype = model.get_output_embeddings().weight.dtype
    compared = dtype in (torch.float32, torch.float64)
    where, kind = f"problem {first[0].index}", f"model_type '{model.config.model_type}'"
    why = None
    if move > 0:
        why = (f"the tree mask check failed on {where}: a branch that no scored token may see, its tokens replaced, "
               f"moved the {moved.condition}/{moved.continuation} log-probs by {move:.3g} nats (a masked token must "
               f"move nothing: {kind} does not honour a prepared attention mask)")
    elif compared and not check < PACKED_TOLERANCE:
        why = (f"the packed scoring differs from whole-sequence scoring by {check:.3g} nats on {where} in "
               f"{str(dtype).removeprefix('torch.')} (tolerance {PACKED_TOLERANCE:g}) although the tree mask holds "
               f"exactly: {kind} does not place the packed tokens at their position ids, or rounds beyond the "
               f"tolerance")
    method = "whole" if why else "packed"
    info = {"method": method, "packed_check_max_abs_diff": check}
    if not compared:
        info["packed_check_compared"] = False
    if not compared or why:
        info["mask_check_max_abs_diff"] = move
    if why:
        info["why"] = why
        if warn is not None:
            warn(f"scoring each sequence whole: {why}")
        return score(model, seqs, batch_tokens, pad, arm_hook, bar), info
    return score_packed(model, seqs, batch_tokens, pad, arm_hook, bar), info


def score_shown(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
                desc: str = "scoring", name: str = "") -> tuple[list[np.ndarray], dict, float]:
    """`score_fastest` behind a progress bar over the sequences, a fall-back to whole scoring said on stderr as
    `<name>: <why>`: (log-probs, how, seconds the scoring took)."""
    bar = progress.bar(total=len(seqs), desc=desc, unit="seq")
    started = time.perf_counter()
    try:
        logprobs, how = score_fastest(model, seqs, batch_tokens, pad, arm_hook, bar,
                                      warn=lambda why: print(f"{name}: {why}", file=sys.stderr))
        return logprobs, how, time.perf_counter() - started
    finally:
        bar.close()


def check_head(model, seq: Seq, pad: int) -> float:
    """The max abs difference between `score` and the model's own logits + log_softmax on one sequence;
    refuses a family whose final logits this stage does not reproduce."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq.input_ids], device=model.get_output_embeddings().weight.device),
                       use_cache=False).logits[0].float()
        ref = torch.log_softmax(logits, -1)[torch.arange(seq.start - 1, len(seq.input_ids) - 1),
                                            torch.tensor(seq.scored)].double().cpu().numpy()
    got = score(model, [seq], len(seq.input_ids), pad)[0]
    diff = float(np.max(np.abs(got - ref)))
    if not diff < 1e-3:
        raise UnsupportedModel(
            f"model_type '{model.config.model_type}': the LM head applied at the scored positions differs from the "
            f"model's own logits by {diff:.3g} nats (a final-logit transformation this stage does not know)")
    return diff
