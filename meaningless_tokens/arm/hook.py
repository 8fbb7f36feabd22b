"""ARM as a forward hook on layer 0's act_fn: which rows it edits, their draws' keys, and the step it is at."""

from __future__ import annotations

import numpy as np

from meaningless_tokens.arm.redistribution import edit, edit_pooled, edit_rows
from meaningless_tokens.arm.settings import ArmSettings
from meaningless_tokens.draws import key_state, lanes, row_key, step_states, stream

class ArmHook:
    """Forward hook on layer 0's act_fn applying ARM to the rows `begin` marks; installed by hooks.Hooks.arm.

    Steps are counted by the hook's own calls since `begin` (step 0: the prompt). `begin(rows, valid)`:
    rows[r] is the problem index of an arm row or None (that row is left alone); valid[r, t] (bool, the
    prompt's attention mask) marks the real tokens of the prompt; decode steps are all real tokens.

    No host-device synchronisation at a decode step: at the prompt the hook reads the mask on the host (where the
    engines hand it over) and copies to the device, once, what the later steps need (`table`: per row its arm flag,
    its key state and the arm rows' batch indices; the pooled key state), and sets `clock`, a 0-d int64 device tensor
    holding the step, which every edited step advances in place.

    A decode step that torch.compile traces (transformers compiles the decode step alone; the prompt runs uncompiled)
    reads only those tensors: the step from `clock`, the rows from `table`, every row edited and the arm rows' result
    kept by torch.where, so one graph without a break serves every step and every batch of one shape."""

    def __init__(self, mlp, settings: ArmSettings, identity: bool = False):
        self.mlp, self.settings, self.identity = mlp, settings, identity
        self.clock = None
        self.begin([])
        self.fn = self  # what hooks.Hooks.arm registers on mlp.act_fn, for one block

    def begin(self, rows: list, valid=None) -> None:
        """Arm the hook for one batch: per row its problem index (or (index, sample)) when it is an arm row, else None."""
        self.rows, self.valid, self.step = list(rows), valid, 0
        self.arm_rows = [r for r, p in enumerate(self.rows) if p is not None]
        self.armed = bool(self.rows)  # what the traced step reads: a guard on the rows' values would recompile
        self.prepared = None  # (the arm rows: a slice or indices on the device, the keys' states), made at step 0
        self.table = None

    def prepare(self, device, step: int):
        """The batch's `table` on the device (one copy) and `clock` set to `step`; returns, without arm rows None,
        else the arm rows (a slice when they are one run, else their indices on the device) and their draws' key
        states (lanes on the device: under `pool: row` [arm rows, 2], under `pool: batch` the pooled key's [1, 2])."""
        import torch

        rows, s, n = self.arm_rows, self.settings, len(self.rows)
        # rows 0..n-1: (arm flag, key state hi, lo, the k-th arm row's batch index); row n: (0, pooled state hi, lo, 0)
        host = torch.zeros(n + 1, 4, dtype=torch.int64)
        if rows:
            host[rows, 0] = 1
            host[:len(rows), 3] = torch.tensor(rows, dtype=torch.int64)
            if s.pool == "batch":
                host[n, 1:3] = lanes([key_state(s.seed, [row_key(self.rows[r]) for r in rows])])[0]
            else:
                host[rows, 1:3] = lanes([key_state(s.seed, [row_key(self.rows[r])]) for r in rows])
        self.table = host.to(device)
        if self.clock is None or self.clock.device != self.table.device:
            import torch._dynamo

            self.clock = torch.zeros((), dtype=torch.int64, device=device)
            # one tensor for the hook's life, advanced inside the compiled step: a static address lets CUDA graphs
            # replay that in-place update
            torch._dynamo.mark_static_address(self.clock)
        self.clock.fill_(step)
        if not rows:
            return None
        if rows == list(range(rows[0], rows[-1] + 1)):
            where = slice(rows[0], rows[-1] + 1)
            states = self.table[where, 1:3]
        else:
            where = self.table[:len(rows), 3]
            states = self.table[where, 1:3]
        return where, (self.table[n:, 1:3] if s.pool == "batch" else states)

    def __call__(self, module, inputs, a):
        import torch

        if torch.compiler.is_compiling():
            return self.traced(a)
        # (no torch.set_num_threads(1) around the edit: switching the thread count at every forward call
        # made generation of a batch 20x slower, arm rows or not, measured on 2 cores)
        step, self.step = self.step, self.step + 1
        s = self.settings
        if not self.rows or (s.apply == "prefill" and step > 0):
            return None
        if len(self.rows) != a.shape[0]:
            raise RuntimeError(f"ARM hook: {len(self.rows)} rows marked, the batch has {a.shape[0]}")
        valid = self.valid if step == 0 else None
        if valid is not None and tuple(valid.shape) != tuple(a.shape[:2]):
            raise RuntimeError(f"ARM hook: prompt mask {tuple(valid.shape)} does not fit activations "
                               f"{tuple(a.shape)} at step 0 (a prompt split over several forward calls?)")
        if step == 0 or self.table is None:  # a batch without arm rows too: its compiled steps read the table
            self.prepared = self.prepare(a.device, step)
        if self.prepared is None:
            return None
        where, states = self.prepared
        out = a.clone()
        if s.pool == "batch":  # one edit over every position (pads included) of the arm rows, in batch order
            out[where] = edit(a[where], s, step_states(states, self.clock)[0], self.identity)
        elif valid is None:  # a decode step (or a prompt without padding): the rows in one batched edit
            out[where] = edit_rows(a[where], s, step_states(states, self.clock), self.identity)
        else:
            self.prompt(a, out, valid)
        self.clock.add_(1)
        return out

    def traced(self, a):
        """A decode step under torch.compile: every row edited with its table entry's draws at `clock`, the arm rows'
        values kept (shapes and settings are the graph's only constants)."""
        import torch

        s = self.settings
        if not self.armed or s.apply == "prefill":
            return None
        if self.table is None:
            raise RuntimeError("ARM hook: a compiled forward pass before the prompt's: the prompt (step 0) must run "
                               "uncompiled, where the hook reads its rows and mask on the host")
        n = self.table.shape[0] - 1
        if n != a.shape[0] or a.shape[1] != 1:
            raise RuntimeError(f"ARM hook: a compiled forward pass of {tuple(a.shape[:2])} (rows, tokens) for "
                               f"{n} marked rows: only a decode step (one token per row) may be compiled")
        keep = self.table[:n, 0] == 1
        if s.pool == "batch":
            out = edit_pooled(a, keep, s, step_states(self.table[n:, 1:3], self.clock)[0], self.identity)
        else:
            edited = edit_rows(a, s, step_states(self.table[:n, 1:3], self.clock), self.identity)
            out = torch.where(keep.view(-1, *[1] * (a.dim() - 1)), edited, a)
        self.clock.add_(1)
        return out

    def prompt(self, a, out, valid) -> None:
        """A padded prompt under `pool: row`: each arm row over its own real tokens, the element index running over
        those tokens' activations alone (a left-padded prompt draws what it draws unpadded)."""
        import torch

        s = self.settings
        mask = valid.cpu().numpy().astype(bool)  # the engines build it on the host: no copy there
        other = []
        for r in self.arm_rows:
            state = stream(s.seed, [row_key(self.rows[r])], 0)
            first = int(mask[r].argmax())
            if mask[r, first:].all():  # left padding: the real tokens are one run at the end
                out[r, first:] = edit(a[r, first:], s, state, self.identity)
            else:
                other.append((r, state, np.flatnonzero(mask[r])))
        if other:  # any other mask: the real positions of all such rows in one copy
            at = torch.from_numpy(np.concatenate([p for _, _, p in other])).to(a.device)
            k = 0
            for r, state, p in other:
                pos = at[k:k + len(p)]
                k += len(p)
                out[r, pos] = edit(a[r, pos], s, state, self.identity)
