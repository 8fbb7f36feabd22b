"""Where artifacts live, relative to the project root: every file a stage writes or reads, named once."""

from __future__ import annotations

from pathlib import Path

from meaningless_tokens.store.stages import declared_outputs, stage_names

STAGES = stage_names()  # dvc.yaml's stages, in its order
TIMING = "metrics/timing/{stage}-{{name}}.json"  # a run's sidecar

# kind -> path template: every file a stage writes or reads, named once (`{name}`: the model). dvc.yaml spells
# the same paths with ${key}/${item} (tests/test_store.py checks that each of its outs and metrics is here).
PATHS = {
    "manifest": "artifacts/models/{name}.json",
    "attention": "artifacts/attention/{name}.h5",
    "eval": "artifacts/eval/{name}.h5",
    "generations": "artifacts/generations/{name}.jsonl",
    # a model stage's own artifact and metrics, where dvc.yaml declares them under its name (stats, activations,
    # sweep, likelihood, arm_tuning): artifacts/<stage>/{name}.h5, metrics/<stage>/{name}.json
    **{s: f"artifacts/{s}/{{name}}.h5" for s in STAGES if f"artifacts/{s}/{{name}}.h5" in declared_outputs(s)},
    # one folder per table kind, so dvc.yaml's top-level `plots` name each folder once
    **{f"plots/{k}": f"artifacts/plots/{k}/{{name}}.csv" for k in ("original", "full", "sweep", "likelihood")},
    "metrics/accuracy": "metrics/accuracy/{name}.json",
    **{f"metrics/{s}": f"metrics/{s}/{{name}}.json" for s in STAGES if f"metrics/{s}/{{name}}.json" in declared_outputs(s)},
    # a run's sidecar (never deterministic: timings, the commit that ran), for each stage whose dvc.yaml metrics
    # declare one (figures, report, explorer and reference write none)
    **{f"timing/{s}": TIMING.format(stage=s) for s in STAGES if TIMING.format(stage=s) in declared_outputs(s)},
    # resumable generations (not DVC outputs: kept across runs so an interrupted stage resumes)
    "journal/eval": "artifacts/eval/.journal/{name}.jsonl",
    "journal/sweep": "artifacts/sweep/.journal/{name}.jsonl",
    "figures": "reports/figures",
    "accuracy_table": "reports/accuracy.csv",
    "likelihood_links": "reports/likelihood.json",
    "report.html": "reports/report.html",
    "report.md": "reports/report.md",
    "explorer": "reports/explorer.html",
    "verdict": "metrics/verdict.json",
    "results.md": "docs/results.md",
    "results": "docs/results",
}


def path(kind: str, name: str | None = None) -> Path:
    """Where the artifact `kind` (a PATHS key) of model `name` lives, relative to the project root."""
    try:
        template = PATHS[kind]
    except KeyError:
        raise KeyError(f"no artifact kind {kind!r} (store.PATHS: {', '.join(PATHS)})") from None
    if ("{name}" in template) != (name is not None):
        raise TypeError(f"artifact kind {kind!r}: {'a model name is needed' if name is None else 'takes no model name'}")
    return Path(template.format(name=name) if name is not None else template)


def outputs(params, name: str, root: Path | None = None, **kinds: str) -> dict[str, Path]:
    """A stage's outputs, role -> absolute path of the artifact kind (a PATHS key) for model `name`: under `root`
    where given (a test's folder), else under the project that `params` belong to."""
    return {role: (root / path(kind, name) if root else params.project_path(str(path(kind, name))))
            for role, kind in kinds.items()}


FIGURES_DIR = path("figures")
