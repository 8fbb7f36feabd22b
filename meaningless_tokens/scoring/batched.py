"""Whole sequences batched by length up to a token budget (right padding: causal attention keeps the pads out of every
real token), the LM head run only at the positions that predict a scored token, over slices of the vocabulary (never
a [T, vocab] tensor for the whole prompt)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from meaningless_tokens.scoring.sequences import Seq

if TYPE_CHECKING:
    from meaningless_tokens.arm.teacher_forced import TeacherForcedArm

HEAD_CHUNK = 1 << 23  # logits per chunk of the LM head (1024 positions x 8192 words: 32 MiB in float32)
VOCAB_CHUNK = 8192    # words per slice of the LM head (a slice's weight stays in cache across its positions)


def whole_steps(s: Seq) -> tuple:
    """A whole arm sequence's TeacherForcedArm row: every position after the prompt is the next decode step."""
    return (s.index, s.prompt_len, range(1, len(s.input_ids) - s.prompt_len + 1))


def head_logprobs(model, hidden, targets):
    """log P(target) from final hidden states [N, D] (after the final norm): the LM head over slices of the
    vocabulary (VOCAB_CHUNK words, for up to HEAD_CHUNK // VOCAB_CHUNK positions at a time), a running log-sum-exp
    across the slices, so the head's weight is read once per block of positions, not once per 32 positions; with
    the family's final logit transformations (Gemma's softcapping, Granite's scaling, Cohere's scale); float64 [N]."""
    import torch

    text = model.config.get_text_config()
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    cap = getattr(text, "final_logit_softcapping", None)
    scaling = getattr(text, "logits_scaling", None)
    scale = getattr(text, "logit_scale", None)
    vocab = weight.shape[0]
    cols = min(vocab, VOCAB_CHUNK)
    rows = max(1, HEAD_CHUNK // cols)
    out = []
    for i in range(0, hidden.shape[0], rows):
        h, t = hidden[i:i + rows], targets[i:i + rows]
        lse = torch.full((h.shape[0],), -float("inf"), device=h.device)
        picked = torch.zeros(h.shape[0], device=h.device)
        for j in range(0, vocab, cols):
            logits = torch.nn.functional.linear(h, weight[j:j + cols], None if bias is None else bias[j:j + cols])
            logits = logits.float()
            if scale is not None:
                logits = logits * scale
            if scaling is not None:
                logits = logits / scaling
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
            inside = (t >= j) & (t < j + logits.shape[1])
            picked = torch.where(inside, logits.gather(1, (t - j).clamp(0, logits.shape[1] - 1)[:, None])[:, 0], picked)
        out.append(picked - lse)
    return torch.cat(out).double().cpu().numpy() if out else np.zeros(0)


def batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices of the rows sorted by length, cut so that rows x longest row stays within batch_tokens (right
    padding: every row of a batch is as long as its longest)."""
    order = sorted(range(len(lengths)), key=lambda k: (lengths[k], k))
    out, cur = [], []
    for k in order:
        if cur and (len(cur) + 1) * lengths[k] > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(k)
    return out + ([cur] if cur else [])


def right_padded(rows: list, fill: int) -> np.ndarray:
    """The rows as one [rows, longest] int64 array, each filled on the right with `fill`."""
    out = np.full((len(rows), max(len(r) for r in rows)), fill, dtype=np.int64)
    for r, row in enumerate(rows):
        out[r, :len(row)] = row
    return out


def upload(parts: list[np.ndarray], device) -> list:
    """The host arrays on the device as int64 tensors of their shapes, copied in one transfer (on CUDA each copy
    of a batch would block the host until the GPU catches up): one buffer, sliced on the device."""
    import torch

    flat = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in parts])
    buf = torch.from_numpy(flat).to(device)
    out, at = [], 0
    for a in parts:
        out.append(buf[at:at + a.size].view(a.shape))
        at += a.size
    return out


def score(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
          bar=None) -> list[np.ndarray]:
    """Per sequence, the log-prob of each scored token given everything before it (float64). Per batch one copy
    to the device (ids, lengths and the scored rows and positions as one buffer) and one back (the log-probs)."""
    import torch

    device = model.get_output_embeddings().weight.device
    decoder = model.get_decoder()
    result: list = [None] * len(seqs)
    for batch in batches([len(s.input_ids) for s in seqs], batch_tokens):
        rows = [seqs[k] for k in batch]
        lengths = np.array([len(s.input_ids) for s in rows], dtype=np.int64)
        r_idx = np.repeat(np.arange(len(rows)), [len(s.scored) for s in rows])
        pos = np.concatenate([np.arange(s.start - 1, len(s.input_ids) - 1) for s in rows])
        padded = lengths.min() < lengths.max()
        ids, lengths, r_idx, pos = upload([right_padded([s.input_ids for s in rows], pad), lengths, r_idx, pos],
                                          device)
        # no padding: no mask, the causal attention an all-ones mask gives, without transformers' check of the
        # mask's values (a copy to the host per batch)
        mask = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long() if padded else None
        if arm_hook is not None:
            arm_hook.begin([whole_steps(s) if s.condition == "arm" else None for s in rows])
        elif any(s.condition == "arm" for s in rows):
            raise ValueError("arm rows need the ARM hook")
        try:
            with torch.no_grad():
                hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False)[0]
                lp = head_logprobs(model, hidden[r_idx, pos], ids[r_idx, pos + 1])
        finally:
            if arm_hook is not None:
                arm_hook.begin([])
        at = 0
        for k, s in zip(batch, rows):
            result[k] = lp[at:at + len(s.scored)]
            at += len(s.scored)
        if bar is not None:
            bar.update(len(rows))
    return result
