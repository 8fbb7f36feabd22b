"""The prelude every stage opens with: `stage_context(params, stage, name, root, **outputs)` gives the params the
stage may read, where its outputs (and inputs) lie, and, for a model stage, its model.

The stage's body holds only the view (store.params_view: the keys dvc.yaml lists for it; any other raises), never
the full params: what needs them whole is a method here, `setup` (models.setup_for checks the model against every
key, charts and layers included, before any work), `prepare` (the layers these params' stages run) and `read_h5`
(an input artifact must record today's values of its own stage's keys).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from meaningless_tokens import store
from meaningless_tokens.config import Params

if TYPE_CHECKING:  # imported where a model is set up: stats, which runs none, never loads the model code
    from meaningless_tokens import models

# every artifact says once how its layers and heads are numbered
INDEXING = "layers and heads are 0-based; charts say 'Layer 1' for index 0"


@dataclass(frozen=True)
class StageContext:
    stage: str                 # the dvc.yaml stage
    name: str | None           # the model; None for figures, report, explorer
    params: Params             # the view: only the keys dvc.yaml lists for the stage
    where: dict[str, Path]     # role -> path (store.outputs)
    _full: Params = field(repr=False)
    started: float = field(default_factory=time.perf_counter)  # the run's clock starts with its prelude

    def seconds(self) -> float:
        """The run's seconds so far, as its timing sidecar records them (0.01 s)."""
        return round(time.perf_counter() - self.started, 2)

    def setup(self, layers=None) -> models.ModelSetup:
        """The model ready to run (models.setup_for), `layers` the ones the stage runs (None: the whole model)."""
        from meaningless_tokens import models

        return models.setup_for(self._full, self.name, layers=layers)

    def prepare(self) -> tuple[models.PreparedModel, list[int] | None]:
        """The prepare stage's work: the model's local folder, a GGUF source converted as far as these params' stages
        run it, and those layers (None: the whole model)."""
        from meaningless_tokens import models

        layers = models.prepare_layers(self._full, self.name)
        return models.prepare(self._full, self.name, layers=layers), layers

    def read_h5(self, role: str, kind: str, required: tuple[str, ...] = ()):
        """The input artifact at `where[role]`, refused (store.read_h5) when its recorded params are not today's."""
        return store.read_h5(self.where[role], kind, required, params=self._full)


def stage_context(params: Params, stage: str, name: str | None = None, root: Path | None = None,
                  **kinds: str) -> StageContext:
    """The prelude of `stage` for model `name`: its params view and the paths of `kinds` (role -> store.PATHS kind),
    under `root` where given (a test's folder), else under the project `params` belong to."""
    return StageContext(stage, name, store.params_view(params, stage, name), store.outputs(params, name, root, **kinds),
                        params)


def header(f, kind: str, name: str, **attrs) -> None:
    """An artifact's root attributes: its kind (what store.read_h5 checks) and model first, then `attrs` in the order
    given (the order is part of the file's bytes)."""
    f.attrs["kind"] = kind
    f.attrs["model"] = name
    for key, value in attrs.items():
        f.attrs[key] = value
