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
`TeacherForcedArm` applies ARM as generation would have applied it had the model generated exactly these tokens
(stages/likelihood.py's text says how).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, draws, models, progress
from meaningless_tokens.config import ANSWER_MARK, Likelihood
from meaningless_tokens.errors import DatasetError, UnsupportedModel
from meaningless_tokens.prompts import Problem


HEAD_CHUNK = 1 << 23  # logits per chunk of the LM head (1024 positions x 8192 words: 32 MiB in float32)
VOCAB_CHUNK = 8192    # words per slice of the LM head (a slice's weight stays in cache across its positions)


@dataclass(frozen=True)
class Seq:
    index: int                  # problem index (line of test.jsonl, 0-based)
    condition: str
    continuation: str
    input_ids: tuple[int, ...]  # prompt + context + scored
    prompt_len: int             # the condition's prompt (ARM's step 0)
    start: int                  # first scored position

    @property
    def scored(self) -> tuple[int, ...]:
        return self.input_ids[self.start:]


class Continuations:
    """The context and scored token ids of each continuation of a problem, tokenized as separate segments."""

    def __init__(self, cfg: Likelihood, builder, dataset: Path):
        """`cfg`: params' likelihood (its separator, answer frame and solution_tokens); `builder`: the prompts'."""
        self.builder, self.cfg = builder, cfg
        self.dataset = dataset  # the dataset file, named when a continuation is empty
        sep = cfg.separator if builder.template == "raw" else ""
        self.sep = builder.encode(sep) if sep else []
        head, self.tail = cfg.answer_frame.split(ANSWER_MARK)
        self.head = builder.encode(head) if head else []

    def build(self, problem: Problem) -> dict[str, tuple[list[int], list[int]]]:
        """{continuation: (context ids, scored ids)}."""
        solution = self.builder.encode(problem.solution)[:self.cfg.solution_tokens]
        answer = self.builder.encode(problem.answer + self.tail)
        for key, ids in (("solution", solution), ("answer", answer)):
            if not ids or not getattr(problem, key).strip():
                raise DatasetError(f"{self.dataset}:{problem.index + 1}: key '{key}' is empty (nothing to score)")
        return {"solution": (self.sep, solution), "answer": (self.sep + self.head, answer)}

    def sequences(self, problem: Problem, prompts: dict, continuations=("solution", "answer")) -> list[Seq]:
        """One problem's sequences, per condition (`prompts`: condition -> its prompt's ids) each continuation in
        turn: the prompt, the continuation's context, its scored ids."""
        parts = self.build(problem)
        seqs = []
        for condition, prompt_ids in prompts.items():
            ids = list(prompt_ids)
            for k in continuations:
                ctx, scored = parts[k]
                seqs.append(Seq(problem.index, condition, k, tuple(ids + ctx + scored), len(ids), len(ids) + len(ctx)))
        return seqs


def check_alignment(seqs: list[Seq]) -> None:
    """The scored tokens (and the context before them) of a problem's continuation are the same ids in every
    condition, and sit right after the condition's prompt."""
    ref: dict[tuple[int, str], tuple] = {}
    for s in seqs:
        tail = s.input_ids[s.prompt_len:]
        if not s.prompt_len <= s.start < len(s.input_ids):
            raise AssertionError(f"problem {s.index} {s.condition}/{s.continuation}: scored part not after the prompt")
        if ref.setdefault((s.index, s.continuation), (tail, s.start - s.prompt_len)) != (tail, s.start - s.prompt_len):
            raise AssertionError(f"problem {s.index}: the {s.continuation} tokens under {s.condition} differ from "
                                 "those under the other conditions (continuations not aligned)")


class TeacherForcedArm:
    """ARM on layer 0's act_fn for the rows `begin` marks, mapped onto teacher forcing (see the module text);
    installed by hooks.Hooks.arm.

    begin(rows): rows[r] = (problem index, prompt length, steps) of an arm row, or None: positions
    [0, prompt length) are the prompt (step 0, one pool), and position prompt length + i is edited alone as decode
    step steps[i] (a whole sequence: 1, 2, ...; a packed tree: its node's depth past the prompt, so two branches'
    nodes at one depth get the same step, as each sequence scored whole would). The draws are the greedy
    evaluation's: key (problem index,), the step as above; one copy of the steps' states to the device per call."""

    def __init__(self, mlp, settings: arm.ArmSettings):
        self.mlp, self.settings = mlp, settings
        self.rows: list = []
        self.fn = self  # what hooks.Hooks.arm registers on mlp.act_fn, for one block

    def begin(self, rows: list) -> None:
        self.rows = list(rows)

    def __call__(self, module, inputs, a):
        import torch

        if not any(r is not None for r in self.rows):
            return None
        if len(self.rows) != a.shape[0]:
            raise RuntimeError(f"ARM hook: {len(self.rows)} rows marked, the batch has {a.shape[0]}")
        s = self.settings
        out = a.clone()
        later, states = [], []  # the positions past each prompt, edited together as decode-step rows
        for r, row in enumerate(self.rows):
            if row is None:
                continue
            index, p, steps = row
            base = draws.key_state(s.seed, [draws.row_key(index)])
            out[r, :p] = arm.edit(a[r, :p], s, draws.absorb(base, 0))
            if s.apply == "all" and len(steps):
                later.append((r, p, len(steps)))
                states += [draws.absorb(base, step) for step in steps]
        if later:  # every row's step states in one copy to the device
            edited = arm.edit_rows(torch.cat([a[r, p:p + k] for r, p, k in later]), s, draws.lanes(states).to(a.device))
            at = 0
            for r, p, k in later:
                out[r, p:p + k] = edited[at:at + k]
                at += k
        return out


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


@dataclass
class Packed:
    """A problem's sequences as one token tree: each distinct prefix once (a prompt shared by its continuations,
    the instruction shared by the conditions), flattened in creation order (a parent before its children)."""
    ids: list[int]           # the token of each node
    parent: list[int]        # its parent node (-1: the first token)
    pos: list[int]           # its position in every sequence through it (the depth)
    paths: list[list[int]]   # per sequence (in the order given), the node of each of its tokens


def pack(seqs: list[Seq]) -> Packed:
    ids, parent, pos, paths = [], [], [], []
    children: dict[tuple[int, int], int] = {}
    for s in seqs:
        node, path = -1, []
        for t, tok in enumerate(s.input_ids):
            nxt = children.get((node, tok))
            if nxt is None:
                nxt = children[(node, tok)] = len(ids)
                ids.append(tok)
                parent.append(node)
                pos.append(t)
            path.append(nxt)
            node = nxt
        paths.append(path)
    return Packed(ids, parent, pos, paths)


def tree_bits(packs: list[Packed], width: int) -> np.ndarray:
    """Which nodes each node of a batch of packed rows sees: its ancestors and itself, a pad itself only (a row
    with no key would be NaN); [rows, width * width] bits packed into int64 words (`unpack_bits`), so that the
    mask travels to the device as 1/64 of a boolean [rows, width, width] and in the batch's one copy."""
    see = np.zeros((len(packs), width, width), dtype=bool)
    for r, pk in enumerate(packs):
        anc = see[r]
        for i, p in enumerate(pk.parent):
            if p >= 0:
                anc[i, :i] = anc[p, :i]
            anc[i, i] = True
        idx = np.arange(len(pk.ids), width)
        anc[idx, idx] = True
    bits = np.packbits(see.reshape(len(packs), -1), axis=1, bitorder="little")
    bits = np.pad(bits, ((0, 0), (0, -bits.shape[1] % 8)))
    return bits.view(np.int64)


def unpack_bits(words, width: int):
    """`tree_bits`' words [rows, n] (int64, on the device) back to booleans [rows, width, width]."""
    import torch

    octets = words.view(torch.uint8)  # the bytes np.packbits wrote, in order (the upload copies bytes)
    shifts = torch.arange(8, device=words.device, dtype=torch.uint8)
    bits = (octets[:, :, None] >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :width * width].reshape(-1, width, width).bool()


def tree_masks(model, see, pos, dtype):
    """The attention mask of a batch of packed rows, as the decoder takes a prepared one, built on the device
    from `see` (`unpack_bits`) and the nodes' positions [rows, width]: a node sees its ancestors and itself
    (within the sliding window, counted in positions, on sliding layers), pads themselves only; additive (0 or
    the dtype's minimum), [rows, 1, width, width]. A dict by layer type for the families whose layers mix full
    and sliding attention (`layer_types`), else one tensor (windowed where the config has a sliding window)."""
    import torch

    text = model.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    zero = torch.zeros((), dtype=dtype, device=see.device)
    minimum = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=see.device)

    def additive(allowed):
        return torch.where(allowed[:, None], zero, minimum)

    full = additive(see)
    sliding = additive(see & ((pos[:, :, None] - pos[:, None, :]) < window)) if window else full
    if getattr(text, "layer_types", None) is not None:
        return {"full_attention": full, "sliding_attention": sliding}
    return sliding


def score_packed(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
                 bar=None) -> list[np.ndarray]:
    """`score`, each problem's sequences packed into one row (`pack`: every shared prefix computed once, the
    prompt for both continuations and the instruction for every condition), the tree's attention mask and each
    token's own position passed to the decoder; rows batched by length within batch_tokens, right-padded. The
    same log-probs as `score` within float rounding where the family honours a prepared 4D mask and position ids
    (`check_mask` and `check_packed` verify it on the model at hand). Per batch one copy to the device (ids,
    positions, the tree mask as bits and the scored nodes as one buffer) and one back (the log-probs). A problem's
    `arm` sequences are a tree of their own (ARM changes their prompt's hidden states from layer 0 on, so they
    share no node with `none`): the prompt's nodes come first and are edited as one pool (step 0), every later
    node alone as the decode step of its depth (`TeacherForcedArm`)."""
    import torch

    if arm_hook is None and any(s.condition == "arm" for s in seqs):
        raise ValueError("arm rows need the ARM hook")
    device = model.get_output_embeddings().weight.device
    dtype = model.get_output_embeddings().weight.dtype
    decoder = model.get_decoder()
    by_tree: dict[tuple[int, bool], list[int]] = {}
    for k, s in enumerate(seqs):
        by_tree.setdefault((s.index, s.condition == "arm"), []).append(k)
    members = list(by_tree.values())
    packs = [pack([seqs[k] for k in ks]) for ks in members]
    arm_rows = [arm_tree(pk, [seqs[k] for k in ks]) if seqs[ks[0]].condition == "arm" else None
                for pk, ks in zip(packs, members)]
    result: list = [None] * len(seqs)
    for batch in batches([len(pk.ids) for pk in packs], batch_tokens):
        rows = [packs[g] for g in batch]
        r_idx, at, targets, owners = [], [], [], []
        for r, g in enumerate(batch):
            for k, path in zip(members[g], packs[g].paths):
                s = seqs[k]
                r_idx += [r] * len(s.scored)
                at += path[s.start - 1:len(s.input_ids) - 1]
                targets += s.scored
                owners.append((k, len(s.scored)))
        ids = right_padded([pk.ids for pk in rows], pad)
        width = ids.shape[1]
        ids, pos, words, r_idx, at, targets = upload(
            [ids, right_padded([pk.pos for pk in rows], 0), tree_bits(rows, width), np.array(r_idx), np.array(at),
             np.array(targets)], device)
        mask = tree_masks(model, unpack_bits(words, width), pos, dtype)
        if arm_hook is not None:
            arm_hook.begin([arm_rows[g] for g in batch])
        try:
            with torch.no_grad():
                hidden = decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)[0]
                lp = head_logprobs(model, hidden[r_idx, at], targets)
        finally:
            if arm_hook is not None:
                arm_hook.begin([])
        i = 0
        for k, n in owners:
            result[k] = lp[i:i + n]
            i += n
        if bar is not None:
            bar.update(len(owners))
    return result


def arm_tree(pk: Packed, seqs: list[Seq]) -> tuple:
    """The TeacherForcedArm row of one problem's packed arm sequences: the shared prompt is the tree's first
    nodes (asserted), every later node is the decode step of its depth past the prompt."""
    p = seqs[0].prompt_len
    if any(s.prompt_len != p or path[:p] != list(range(p)) for s, path in zip(seqs, pk.paths)):
        raise AssertionError(f"problem {seqs[0].index}: the arm sequences do not share their prompt")
    return (seqs[0].index, p, [d - p + 1 for d in pk.pos[p:]])


def check_packed(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None) -> float:
    """The max abs difference of the summed log-probs between `score_packed` and `score` on the given sequences
    (one problem's, arm rows included: the stage's guard that the family honours the prepared tree mask)."""
    a = score(model, seqs, batch_tokens, pad, arm_hook)
    b = score_packed(model, seqs, batch_tokens, pad, arm_hook)
    return float(max(abs(x.sum() - y.sum()) for x, y in zip(a, b)))


def decoy(tree: list[Seq], vocab: int, k: int) -> Seq:
    """A branch off the tree's first sequence at its first scored position that no sequence of the tree takes:
    there the k-th token (counting on from the sequence's own, modulo the vocabulary) that no sequence of the tree
    has after the same prefix, then each later token of the sequence k words further on."""
    s = tree[0]
    b = s.start
    taken = {t.input_ids[b] for t in tree if len(t.input_ids) > b and t.input_ids[:b] == s.input_ids[:b]}
    free = [w % vocab for w in range(s.input_ids[b] + 1, s.input_ids[b] + vocab) if w % vocab not in taken]
    ids = s.input_ids[:b] + (free[k - 1],) + tuple((t + k) % vocab for t in s.input_ids[b + 1:])
    return Seq(s.index, s.condition, s.continuation, ids, s.prompt_len, s.start)


def check_mask(model, seqs: list[Seq], batch_tokens: int, pad: int,
               arm_hook: TeacherForcedArm | None = None) -> tuple[float, Seq]:
    """Whether the decoder honours the prepared tree mask, tested exactly, in any dtype: the given sequences (one
    problem's, its arm tree included) scored packed twice, each tree led by a `decoy` branch whose tokens differ
    between the two runs. No node of the sequences descends from a decoy, so where the mask holds, their
    log-probs are bit-identical (a masked key's weight is exactly 0, and a node's MLP and norms see that node
    alone); where the mask leaks, the tokens after a decoy see it. Returns the largest move of a log-prob (nats;
    0.0: the mask holds, inf: a NaN) and the sequence it moved."""
    vocab = model.get_output_embeddings().weight.shape[0]
    trees: dict[tuple[int, bool], list[Seq]] = {}
    for s in seqs:
        trees.setdefault((s.index, s.condition == "arm"), []).append(s)
    runs = []
    for k in (1, 2):
        lead = [decoy(tree, vocab, k) for tree in trees.values()]
        runs.append(score_packed(model, lead + seqs, batch_tokens, pad, arm_hook)[len(lead):])
    moves = [0.0 if np.array_equal(a, b) else float(np.nan_to_num(np.abs(a - b), nan=np.inf).max())
             for a, b in zip(*runs)]
    k = int(np.argmax(moves))
    return moves[k], seqs[k]


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
