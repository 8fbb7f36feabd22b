"""The forward hooks and the capturing attention the project puts on a model, each installed inside one block and
removed on every way out of it: a normal end, an exception, KeyboardInterrupt, a StopForward early exit.

    with hooks.Hooks() as h:
        h.arm(arm.ArmHook(mlp, settings))      # layers.0.mlp.act_fn: ARM's edit of a (or arm's TeacherForcedArm)
        a, z = h.capture_mlp(mlps, layers)     # layers.<l>.mlp.act_fn / gate_proj: a and z of each pass, by layer
        h.stop_after(mlp.act_fn)               # StopForward after that module: the rest of the pass never runs
        h.attention(model)                     # capture.py's attention interface (attention probabilities)
        ...

Hooks on one module fire in the order they were added (ARM before a capture sees the edited a). `close` (the
block's end) undoes everything in reverse: the hooks' handles, the model's previous attention implementation and the
interfaces' capture entries. An object that lives longer than a block (the evaluate engine) holds a `Hooks` and
closes it itself.
"""

from __future__ import annotations

from meaningless_tokens import capture
from meaningless_tokens.errors import StopForward


class Hooks:
    """What one block installed, undone by `close` (or the `with` block's end)."""

    def __init__(self):
        self._undo: list = []

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Everything installed, removed in reverse; a second close does nothing."""
        while self._undo:
            self._undo.pop()()

    def add(self, module, fn):
        """A forward hook `fn(module, inputs, output)` on `module` (a tensor it returns replaces the output)."""
        handle = module.register_forward_hook(fn)
        self._undo.append(handle.remove)
        return handle

    def arm(self, edit):
        """ARM's edit (arm.ArmHook or arm.teacher_forced.TeacherForcedArm) on its layer-0 act_fn; returns the edit."""
        self.add(edit.mlp.act_fn, edit.fn)
        return edit

    def capture_mlp(self, mlps, layers) -> tuple[dict, dict]:
        """({layer: a}, {layer: z}) of the first row of each pass: a = act_fn's output, z = gate_proj's."""
        a, z = {}, {}
        for layer, mlp in zip(layers, mlps):
            self.add(mlp.gate_proj, lambda m, i, o, layer=layer: z.__setitem__(layer, o[0]))
            self.add(mlp.act_fn, lambda m, i, o, layer=layer: a.__setitem__(layer, o[0]))
        return a, z

    def stop_after(self, module) -> None:
        """End every pass with StopForward once `module` has run (the caller catches it)."""
        def stop(m, inputs, output):
            raise StopForward

        self.add(module, stop)

    def attention(self, model) -> None:
        """`model` on capture.py's capturing attention until the block ends."""
        self._undo.append(capture.install_capture(model))
