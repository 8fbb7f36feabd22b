"""The library the pipeline's stages share (the stages themselves: stages/, one module per dvc.yaml stage).

Layers, lowest first; a module imports only from its own layer or below, never from stages/:
  config, progress, intervals, grading, attention          params schema and plain helpers
  store, cli, envlock, runcache                            artifacts on disk, the command line, the environment
  capture, prompts, sampling, models, arm                  attention capture, prompts, model sources and loading
  engines, vllm_engine, scoring                            generation and teacher-forced scoring
  charts/                                                  one module per chart kind (draw + explain)
"""

from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"  # the report's and the explorer's Jinja templates
