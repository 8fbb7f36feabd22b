"""Teacher-forced scoring: the log-probability of each token of a continuation given everything before it,
shared by the likelihood stage and the sweep's likelihood.

A sequence is prompt + context + scored tokens, every part tokenized as a separate segment, as the prompt's parts
are, so the scored ids are the same in every condition (`check_alignment`). The whole model runs (no early exit);
the LM head runs only at the positions that predict a scored token, over slices of the vocabulary (never a
[T, vocab] tensor for the whole prompt). `score` batches whole sequences by length up to a token budget (right
padding: causal attention keeps the pads out of every real token); `score_packed`, what the likelihood stage
runs, packs each problem's sequences into one token tree (every shared prefix once) with the tree's attention
mask and each token's own position, the same log-probs within 1e-4 nats in float32 and faster on a 2-core CPU
(docs/benchmarks.md); a problem's `arm` sequences form a tree of their own. `score_fastest` takes the packed
scoring where the model honours the tree mask (an exact test, in any dtype) and, in float32, the positions.
`TeacherForcedArm` (meaningless_tokens/arm/teacher_forced.py) applies ARM as generation would have applied it had
the model generated exactly these tokens (stages/likelihood.py's text says how).

One module per idea: sequences.py (the sequences), batched.py (whole sequences, the chunked LM head), packed.py (token
trees and their checks), choice.py (which of the two a run takes), model.py (loading).
"""

from meaningless_tokens.arm.teacher_forced import TeacherForcedArm
from meaningless_tokens.scoring.batched import (HEAD_CHUNK, VOCAB_CHUNK, batches, head_logprobs, right_padded, score,
                                                upload, whole_steps)
from meaningless_tokens.scoring.choice import PACKED_TOLERANCE, check_head, score_fastest, score_shown
from meaningless_tokens.scoring.model import load, pad_id
from meaningless_tokens.scoring.packed import (Packed, arm_tree, check_mask, check_packed, decoy, pack, score_packed,
                                               tree_bits, tree_masks, unpack_bits)
from meaningless_tokens.scoring.sequences import Continuations, Seq, check_alignment

__all__ = ["HEAD_CHUNK", "PACKED_TOLERANCE", "VOCAB_CHUNK", "Continuations", "Packed", "Seq", "TeacherForcedArm",
           "arm_tree", "batches", "check_alignment", "check_head", "check_mask", "check_packed", "decoy",
           "head_logprobs", "load", "pack", "pad_id", "right_padded", "score", "score_fastest", "score_packed",
           "score_shown", "tree_bits", "tree_masks", "unpack_bits", "upload", "whole_steps"]
