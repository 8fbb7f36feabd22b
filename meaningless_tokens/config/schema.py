"""The params.yaml schema: one pydantic class per section, validated once before any work starts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (Field, NonNegativeInt, PositiveFloat, PositiveInt, PrivateAttr, TypeAdapter, ValidationError,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from meaningless_tokens.config.base import PARAMS_FILE, Condition, Pair, ModelName, Sha256, Strict, conditions_with_none, duplicated, resolve_path, sorted_unique, unique
from meaningless_tokens.config.model import ModelSpec


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
    conditions: list[Condition] = Field(min_length=1)
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
    """evaluate.engine: vllm (meaningless_tokens/engines/vllm.py); passed to vllm.LLM."""

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
    batch_size: PositiveInt | Literal["auto"] = Field(
        description="rows per batch; auto (transformers on CUDA): as many as free memory holds, a multiple of 8")
    stop_at_boxed: bool = Field(description="end a row once it has written a complete \\boxed{...}")
    engine: Literal["transformers", "vllm"] = Field(
        description="transformers.generate (static batches) or vLLM (`make install-vllm`)")
    compile: Literal["auto", "on", "off"] = Field(
        description="torch.compile of the transformers engine's decode step; auto: on for CUDA, off on the CPU")
    vllm: Vllm
    shard: Shard | None = Field(description="{index, count}: this job's part of the problems; null: all")
    sampling: Sampling
    models: list[ModelName] | None = Field(
        description="the models evaluated (dvc.yaml's evaluate stages, one per name)")

    @field_validator("batch_size", mode="wrap")
    @classmethod
    def _batch_size(cls, v, handler):
        if v == "auto":
            return v
        try:  # an int's own error alone, not one per member of the union
            return TypeAdapter(PositiveInt).validate_python(v, strict=True)
        except ValidationError as e:
            err = e.errors()[0]
            raise PydanticCustomError(err["type"], err["msg"] + " (or 'auto')") from None


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
    range: Pair = Field(description="histogram range; values outside are counted apart")
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
        return unique(v)


ANSWER_MARK = "<answer>"


class Likelihood(Strict):
    """likelihood@<model>: teacher-forced log-probabilities of the reference solution and the gold answer."""

    n_samples: PositiveInt | None = Field(
        description="problems (seeded, stratified by level as extract: equal seeds give nested subsets); "
                    "null = all 500")
    seed: int = Field(description="subset and bootstrap seed (equal to extract.seed: the subsets overlap)")
    conditions: list[Condition] = Field(
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
        description="the models scored (dvc.yaml's likelihood stages, one per name)")
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
        if v is not None and (not v or duplicated(v)):
            raise ValueError(f"must be a non-empty list without duplicates (got {v})")
        return v


class Arm(Strict):
    """The `arm` condition (meaningless_tokens/arm/); per-model values are models.<name>.arm."""

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
    grid: dict[Literal["llama", "gemma"], list[Pair]] = Field(
        description="per variant the (c, percentage) pairs tried; each holds the variant's fallback")
    n_boot: PositiveInt = Field(description="bootstrap resamples for the intervals")

    @field_validator("grid")
    @classmethod
    def _grid(cls, v):
        # the pairs' ranges and the fallback are checked by the stage (stages/arm_tuning.py: meaningless_tokens/arm/
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
    """The verdict table's declared inputs (meaningless_tokens/report/verdict.py; docs/report.md, "The verdict")."""

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
            # null is refused here, not by the field's type, so the message says why: dvc.yaml's foreach needs a list
            if chosen is None:
                raise ValueError(f"{key}: null; dvc.yaml runs one {key.split('.')[0]} stage per model listed there: "
                                 f"list them (e.g. {list(self.models)})")
            unknown = [m for m in chosen if m not in self.models]
            if unknown:
                raise ValueError(f"{key}: {unknown} not configured; models: {sorted(self.models)}")
            if duplicated(chosen):
                raise ValueError(f"{key}: {chosen} names a model twice")
        for key, chosen in (("evaluate.models", self.evaluate.models), ("likelihood.models", self.likelihood.models),
                            ("figures.models", self.figures.models)):
            if chosen == []:
                raise ValueError(f"{key}: empty; the stages that read it need at least one model "
                                 f"(e.g. {list(self.models)[:1]})")
        tuned = self.arm_tuning.models
        if duplicated(tuned):
            raise ValueError(f"arm_tuning.models: {tuned} names a model twice")
        unscored = [m for m in tuned if m not in self.scored]
        if unscored:
            raise ValueError(f"arm_tuning.models: {unscored} not in likelihood.models {self.scored}: a setting is tuned "
                             "for the likelihood stage's problems and judged there")
        return self

    @property
    def evaluated(self) -> list[str]:
        """The models evaluation runs on (evaluate.models), in params order."""
        return [m for m in self.models if m in self.evaluate.models]

    @property
    def scored(self) -> list[str]:
        """The models the likelihood stage runs on (likelihood.models), in params order."""
        return [m for m in self.models if m in self.likelihood.models]

    @property
    def file(self) -> Path:
        """The params file these values came from (named in every error)."""
        return self._file

    def project_path(self, p: str) -> Path:
        """Paths in params are relative to the params file's folder (the project root)."""
        return resolve_path(self._file, p)
