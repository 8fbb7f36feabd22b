"""ARM under teacher forcing: the edit applied to a scored sequence as generation would have applied it had the model
generated exactly these tokens (meaningless_tokens/scoring/ scores with it; stages/likelihood.py's text says how)."""

from __future__ import annotations

from meaningless_tokens import draws
from meaningless_tokens.arm.redistribution import edit, edit_rows
from meaningless_tokens.arm.settings import ArmSettings


class TeacherForcedArm:
    """ARM on layer 0's act_fn for the rows `begin` marks, mapped onto teacher forcing (see the module text);
    installed by hooks.Hooks.arm.

    begin(rows): rows[r] = (problem index, prompt length, steps) of an arm row, or None: positions
    [0, prompt length) are the prompt (step 0, one pool), and position prompt length + i is edited alone as decode
    step steps[i] (a whole sequence: 1, 2, ...; a packed tree: its node's depth past the prompt, so two branches'
    nodes at one depth get the same step, as each sequence scored whole would). The draws are the greedy
    evaluation's: key (problem index,), the step as above; one copy of the steps' states to the device per call."""

    def __init__(self, mlp, settings: ArmSettings):
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
            out[r, :p] = edit(a[r, :p], s, draws.absorb(base, 0))
            if s.apply == "all" and len(steps):
                later.append((r, p, len(steps)))
                states += [draws.absorb(base, step) for step in steps]
        if later:  # every row's step states in one copy to the device
            edited = edit_rows(torch.cat([a[r, p:p + k] for r, p, k in later]), s, draws.lanes(states).to(a.device))
            at = 0
            for r, p, k in later:
                out[r, p:p + k] = edited[at:at + k]
                at += k
        return out
