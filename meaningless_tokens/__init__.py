"""The library the pipeline's stages share (the stages themselves: stages/, one module per dvc.yaml stage).

LAYERS lists its modules lowest first; a module imports only from its own layer or below, never from stages/
(tests/test_store.py checks it, and that the imports form no cycle).
"""

from pathlib import Path

LAYERS = (
    ("errors", "config", "progress", "intervals", "grading", "attention", "attention_drops", "paired"),  # exceptions, params schema, plain helpers
    ("store", "cli", "envlock", "runcache", "verify", "forkserver"),  # artifacts on disk, command line, environment, warm start
    ("capture", "hooks", "prompts", "sampling", "models", "arm", "stage", "mlp_activations", "generations"),  # attention capture, hooks, prompts, model sources, stage prelude, kept generations
    ("engines", "vllm_engine", "scoring", "teacher_forced", "span_sweep", "evaluation", "arm_selection"),  # generation, scoring, accuracy, ARM tuning
    ("charts", "report", "showcase", "add_model"),  # chart kinds; what the report says; the explorer's data; `mless add-model`
)

TEMPLATES = Path(__file__).parent / "templates"  # the report's and the explorer's Jinja templates
