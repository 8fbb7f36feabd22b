"""Artifacts on disk, one module per job; `from meaningless_tokens import store` reaches them all.

  files       atomic writes (temporary file, then rename) and filesystem faults as one line
  metrics     metrics files: the stage and model that wrote each, checked where it is read, and no NaN
  hdf5        HDF5 artifacts: deterministic writing, reading that checks kind, stage, model and params, texts that
              round-trip every character (`put_texts`, `read_texts`)
  stages      dvc.yaml as the stages' definition: their order, outputs, deps, the code hashes a stage records
  view        the params a stage reads: exactly dvc.yaml's list (`params_view`, `stage_params`)
  provenance  what an artifact records of the code and environment; the run's timing sidecar
  paths       where every artifact lives (`PATHS`, `path`, `outputs`)
"""

from meaningless_tokens.store.files import (atomic_path, fs_error, glob_escape, os_error_line, os_reason,
                                            write_csv_atomic, write_json_atomic)
from meaningless_tokens.store.hdf5 import (FORMAT_VERSION, KIND_STAGE, TEXT_ESCAPE, check_finite, put, put_json_attr,
                                            put_texts, read_h5, read_texts, write_h5)
from meaningless_tokens.store.metrics import read_metrics, write_metrics
from meaningless_tokens.store.paths import FIGURES_DIR, PATHS, STAGES, outputs, path
from meaningless_tokens.store.provenance import (ENV_RECORD, environment, machine, model_provenance, provenance,
                                                 MACHINE_FACTS, RUN_FACTS, run_info, write_prompt_timing, write_timing)
from meaningless_tokens.store.stages import CODE_DIRS, CODE_PATHS, DVC_YAML, ROOT, code_hashes, dvc_stage
from meaningless_tokens.store.view import UNTRACKED, params_keys, params_view, stage_params

__all__ = [
    "atomic_path", "fs_error", "glob_escape", "os_error_line", "os_reason", "write_csv_atomic", "write_json_atomic",
    "FORMAT_VERSION", "KIND_STAGE", "TEXT_ESCAPE", "check_finite", "put", "put_json_attr", "put_texts", "read_h5",
    "read_texts", "write_h5",
    "read_metrics", "write_metrics",
    "FIGURES_DIR", "PATHS", "STAGES", "outputs", "path",
    "ENV_RECORD", "environment", "machine", "model_provenance", "provenance", "run_info", "write_prompt_timing",
    "MACHINE_FACTS", "RUN_FACTS", "write_timing",
    "CODE_DIRS", "CODE_PATHS", "DVC_YAML", "ROOT", "code_hashes", "dvc_stage",
    "UNTRACKED", "params_keys", "params_view", "stage_params",
]
