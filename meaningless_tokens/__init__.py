"""The library the pipeline's stages share (the stages themselves: stages/, one module per dvc.yaml stage).

LAYERS lists its modules lowest first; a module imports only from its own layer or below, never from stages/
(tests/test_store.py checks it, and that the imports form no cycle).
"""

from pathlib import Path

LAYERS = (
    ("errors", "config", "progress", "tolerances", "noise", "intervals", "grading", "paired", "draws"),  # exceptions, params schema, float noise per kind and its bounds, plain helpers, counter-based draws
    ("store", "cli", "envlock", "runcache", "forkserver"),  # artifacts on disk, command line, environment, warm start
    ("capture", "hooks", "dataset", "prompts", "sampling", "models", "arm", "stage", "generations"),  # attention capture, hooks, the dataset, prompts, model sources, ARM, stage prelude, kept generations
    ("engines", "scoring"),  # generation and scoring
    ("measures",),  # what each model stage measures, one module per stage
    ("results",),  # what charts and report both read: loaded artifacts, traced numbers, phrases
    ("charts",),  # chart kinds: draw and explain
    ("report", "add_model", "cluster"),  # the verdict, the report's pages and the explorer's data; `mless add-model`,
                                         # `mless repro --cluster`
    ("verify",),  # `make verify`: each output against the reference, by the kinds of quantity the measures declare
)

TEMPLATES = Path(__file__).parent / "templates"  # the report's and the explorer's Jinja templates
