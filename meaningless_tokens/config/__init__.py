"""The params: validated once, before any work starts; the only reader of params.yaml. One module per job:

  base     the project's paths, the conditions, the strict base class and the list checks every section uses
  model    a model's entry (`models.<name>`): source, layers, heads, ARM settings
  schema   every other section of params.yaml, and `Params`
  charts   chart selection: the models, layers and heads each chart shows (checked when the params load)
  yaml12   YAML as DVC reads and writes it (1.2, ruamel.yaml): every reader of params, profiles, dvc.yaml, dvc.lock
  loading  `load_params`: unique-key YAML, the schema, one error line per problem naming file, key and value
  checks   a model's facts once prepared; every key a stage lists spelled out; the files the params name
  cli      `python -m meaningless_tokens.config check [FILE] | use <profile>`

Every error names the file, the dotted key, the bad value and what is allowed.
"""

from meaningless_tokens.config.base import (ROOT, PARAMS_FILE, PROFILES_DIR, CONDITIONS, Condition, FAMILIES, Sha256,
                                            ModelName, duplicated, unique, conditions_with_none, sorted_unique, Strict,
                                            resolve_path)
from meaningless_tokens.config.model import (PypiGgufSource, GgufFileSource, LocalDirSource, HubSource, Source,
                                             ModelArm, ModelSpec)
from meaningless_tokens.config.schema import (MlessSpan, MfulSpan, Prompt, FIELDS, DatasetFields, RowFilter, Dataset,
                                              Extract, Vllm, Shard, Sampling, Evaluate, Stats, Activations, Sweep,
                                              ANSWER_MARK, Likelihood, CHART_KINDS, ONE_LAYER_KINDS, ChartSelection,
                                              Arm, ArmTuning, SESOI_CLAIMS, Verdict, Figures, Runtime, Params)
from meaningless_tokens.config.charts import figure_models, chart_selection, check_charts, check_chart_facts
from meaningless_tokens.config.loading import load_params, model_spec
from meaningless_tokens.config.checks import (check_model_facts, DVC_MODEL_KEYS, dvc_model_defaults,
                                              check_spelled_out, check_files)
from meaningless_tokens.config.cli import use_profile, main
