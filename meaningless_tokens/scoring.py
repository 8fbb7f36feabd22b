"""Teacher-forced scoring: the log-probability of each token of a continuation given everything before it,
shared by the likelihood stage and the sweep's likelihood.

A sequence is prompt + context + scored tokens, every part tokenized as a separate segment, as the prompt's parts
are, so the scored ids are the same in every condition (`check_alignment`). The whole model runs (no early exit);
the LM head runs only at the positions that predict a scored token, over slices of the vocabulary (never a
[T, vocab] tensor for the whole prompt). `score` batches whole sequences by length up to a token budget (right
padding: causal attention keeps the pads out of every real token); `score_packed`, what the likelihood stage
runs, packs each problem's sequences into one token tree (every shared prefix once) with the tree's attention
mask and each token's own position, the same log-probs within 1e-4 nats and faster on a 2-core CPU
(docs/benchmarks.md); a problem's `arm` sequences form a tree of their own. `TeacherForcedArm` applies ARM as generation would have applied it had the model generated
exactly these tokens (stages/likelihood.py's text says how).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, models, progress
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
    """ARM on layer 0's act_fn for the rows `begin` marks, mapped onto teacher forcing (see the module text).

    begin(rows): rows[r] = (problem index, prompt length, steps) of an arm row, or None: positions
    [0, prompt length) are the prompt (step 0, one pool), and position prompt length + i is edited alone as decode
    step steps[i] (a whole sequence: 1, 2, ...; a packed tree: its node's depth past the prompt, so two branches'
    nodes at one depth get the same step, as each sequence scored whole would)."""

    def __init__(self, mlp, settings: arm.ArmSettings):
        self.settings = settings
        self.rows: list = []
        self.handle = mlp.act_fn.register_forward_hook(self)

    def begin(self, rows: list) -> None:
        self.rows = list(rows)

    def remove(self) -> None:
        self.handle.remove()

    def __call__(self, module, inputs, a):
        import torch

        if not any(r is not None for r in self.rows):
            return None
        if len(self.rows) != a.shape[0]:
            raise RuntimeError(f"ARM hook: {len(self.rows)} rows marked, the batch has {a.shape[0]}")
        s = self.settings
        out = a.clone()
        for r, row in enumerate(self.rows):
            if row is None:
                continue
            index, p, steps = row
            g = torch.Generator(device=a.device).manual_seed(arm.row_seed(s.seed, index, 0))
            out[r, :p] = arm.edit(a[r, :p], s, g)
            if s.apply == "all" and len(steps):
                gens = [torch.Generator(device=a.device).manual_seed(arm.row_seed(s.seed, index, step))
                        for step in steps]
                out[r, p:p + len(steps)] = arm.edit_rows(a[r, p:p + len(steps)], s, gens)
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


def right_padded(rows: list[list[int]], fill: int):
    """The rows as one [rows, longest] long tensor, each filled on the right with `fill`."""
    import torch

    out = torch.full((len(rows), max(len(r) for r in rows)), fill, dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def score(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
          bar=None) -> list[np.ndarray]:
    """Per sequence, the log-prob of each scored token given everything before it (float64)."""
    import torch

    device = model.get_output_embeddings().weight.device
    decoder = model.get_decoder()
    result: list = [None] * len(seqs)
    for batch in batches([len(s.input_ids) for s in seqs], batch_tokens):
        rows = [seqs[k] for k in batch]
        ids = right_padded([s.input_ids for s in rows], pad)
        mask = right_padded([[1] * len(s.input_ids) for s in rows], 0)
        if arm_hook is not None:
            arm_hook.begin([whole_steps(s) if s.condition == "arm" else None for s in rows])
        elif any(s.condition == "arm" for s in rows):
            raise ValueError("arm rows need the ARM hook")
        try:
            with torch.no_grad():
                hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)[0]
                r_idx = torch.cat([torch.full((len(s.scored),), r) for r, s in enumerate(rows)])
                pos = torch.cat([torch.arange(s.start - 1, len(s.input_ids) - 1) for s in rows])
                lp = head_logprobs(model, hidden[r_idx.to(device), pos.to(device)], ids[r_idx, pos + 1].to(device))
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


def tree_masks(model, packs: list[Packed], width: int, dtype):
    """The attention mask of a batch of packed rows, as the decoder takes a prepared one: a node sees its
    ancestors and itself (within the sliding window, counted in positions, on sliding layers), pads themselves
    only; additive (0 or the dtype's minimum), [rows, 1, width, width]. A dict by layer type for the families
    whose layers mix full and sliding attention (`layer_types`), else one tensor (windowed where the config has
    a sliding window)."""
    import torch

    text = model.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    see = np.zeros((len(packs), width, width), dtype=bool)
    dist = np.zeros((len(packs), width, width), dtype=np.int64)
    for r, pk in enumerate(packs):
        n = len(pk.ids)
        anc = see[r]
        for i, p in enumerate(pk.parent):
            if p >= 0:
                anc[i, :i] = anc[p, :i]
            anc[i, i] = True
        q = np.asarray(pk.pos)
        dist[r, :n, :n] = q[:, None] - q[None, :]
        idx = np.arange(n, width)
        anc[idx, idx] = True  # pads: themselves only (a row with no key would be NaN)
    minimum = torch.finfo(dtype).min

    def additive(allowed):
        return torch.where(torch.from_numpy(allowed)[:, None], torch.tensor(0.0, dtype=dtype),
                           torch.tensor(minimum, dtype=dtype))

    full = additive(see)
    sliding = additive(see & (dist < window)) if window else full
    if getattr(text, "layer_types", None) is not None:
        return {"full_attention": full, "sliding_attention": sliding}
    return sliding


def score_packed(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
                 bar=None) -> list[np.ndarray]:
    """`score`, each problem's sequences packed into one row (`pack`: every shared prefix computed once, the
    prompt for both continuations and the instruction for every condition), the tree's attention mask and each
    token's own position passed to the decoder; rows batched by length within batch_tokens, right-padded. The
    same log-probs as `score` within float rounding where the family honours a prepared 4D mask (`check_packed`
    verifies it on the model at hand). A problem's `arm` sequences are a tree of their own (ARM changes their
    prompt's hidden states from layer 0 on, so they share no node with `none`): the prompt's nodes come first and
    are edited as one pool (step 0), every later node alone as the decode step of its depth (`TeacherForcedArm`)."""
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
        ids, pos = right_padded([pk.ids for pk in rows], pad), right_padded([pk.pos for pk in rows], 0)
        mask = tree_masks(model, rows, ids.shape[1], dtype)
        mask = {k: v.to(device) for k, v in mask.items()} if isinstance(mask, dict) else mask.to(device)
        r_idx, at, targets, owners = [], [], [], []
        for r, g in enumerate(batch):
            for k, path in zip(members[g], packs[g].paths):
                s = seqs[k]
                r_idx += [r] * len(s.scored)
                at += path[s.start - 1:len(s.input_ids) - 1]
                targets += s.scored
                owners.append((k, len(s.scored)))
        if arm_hook is not None:
            arm_hook.begin([arm_rows[g] for g in batch])
        try:
            with torch.no_grad():
                hidden = decoder(input_ids=ids.to(device), attention_mask=mask, position_ids=pos.to(device),
                                 use_cache=False)[0]
                lp = head_logprobs(model, hidden[torch.tensor(r_idx, device=device), torch.tensor(at, device=device)],
                                   torch.tensor(targets, device=device))
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


# the largest difference of a summed log-prob (nats) between the packed and the whole-sequence scoring on the
# checked problem for which `score_fastest` uses the packed one. float32 rounding of a sum over at most 32 tokens
# reaches 1.1e-4 (SmolLM2-135M, the first of 100 problems: at 1e-4 that run fell back to whole scoring,
# 1.7x the time); a decoder that ignores the tree mask differs by tenths of a nat or more (tests/test_likelihood.py)
PACKED_TOLERANCE = 1e-3


def score_fastest(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
                  bar=None, warn=None) -> tuple[list[np.ndarray], dict]:
    """Per sequence, the log-probs of `score`: `score_packed` once `check_packed` finds it equal on one problem
    (the first, its arm rows included), `score` for every sequence where the family does not honour the tree mask
    (`warn` is called with the reason). Returns (log-probs, {"method": "packed" or "whole",
    "packed_check_max_abs_diff": ...})."""
    first = [s for s in seqs if s.index == seqs[0].index] if seqs else []
    check = check_packed(model, first, batch_tokens, pad, arm_hook) if first else None
    method = "packed" if check is not None and check < PACKED_TOLERANCE else "whole"
    if method == "whole" and check is not None and warn is not None:
        warn(f"scoring each sequence whole: the packed scoring differs by {check:.3g} nats on problem "
             f"{first[0].index} (model_type '{model.config.model_type}' does not honour a prepared attention mask)")
    info = {"method": method, "packed_check_max_abs_diff": check}
    if method == "whole":
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
