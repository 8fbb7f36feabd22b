"""Packed scoring: a problem's sequences as one token tree (every shared prefix once) with the tree's attention mask and
each token's own position, the same log-probs as whole scoring within float rounding; a problem's `arm` sequences form
a tree of their own. Its checks: the tree mask exactly (`check_mask`), the sums against whole scoring
(`check_packed`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from meaningless_tokens.scoring.batched import batches, head_logprobs, right_padded, score, upload
from meaningless_tokens.scoring.sequences import Seq

if TYPE_CHECKING:
    from meaningless_tokens.arm.teacher_forced import TeacherForcedArm


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
