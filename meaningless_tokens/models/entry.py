"""One model's part of the params: what the model functions read instead of the whole params."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens.config import ModelSpec, Params, Runtime, model_spec, resolve_path


@dataclass(frozen=True)
class ModelEntry:
    name: str
    spec: ModelSpec      # params' models.<name>
    runtime: Runtime     # params' runtime: device, dtype, cache folder, offline
    params_file: Path    # relative paths are relative to it; every error names it

    @classmethod
    def of(cls, params: Params, name: str) -> ModelEntry:
        """Model `name`'s entry (an unknown name is one line listing the configured models)."""
        return cls(name, model_spec(params, name), params.runtime, params.file)

    @property
    def where(self) -> str:
        """`<params file>: models.<name>`, the start of an error about this model's settings."""
        return f"{self.params_file}: models.{self.name}"

    def path(self, p: str) -> Path:
        """A path of the entry (a local folder or GGUF file) as the params file means it."""
        return resolve_path(self.params_file, p)
