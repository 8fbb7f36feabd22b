"""arm_tuning@<model>: ARM's setting chosen on problems it is not judged on, and what choosing on the judged ones adds.

Beyond the paper. The paper picked ARM's (c, percentage) per model and benchmark on the test problems themselves
(its `choose_parameters`), so its ARM gains hold a selection effect. This stage, for one model of
arm_tuning.models, scores the teacher-forced log-prob of the reference solution (likelihood's `solution`
continuation: mean log-prob per token, the verdict's (f2) measure) under `none` and under `arm` at every
(c, percentage) of arm_tuning.grid[<the model's variant>] on two disjoint sets of problems:

  tuning   arm_tuning.n_samples problems, seeded (arm_tuning.seed) and stratified by level among the problems
           outside likelihood's subset
  tested   likelihood's subset (likelihood.n_samples, likelihood.seed): the problems the verdict judges ARM on

and reports, per setting g, the paired gain arm_g - none on each set. The setting chosen is the one with the
largest mean gain on the tuning problems (ties: the first in the grid); its gain on the tested problems is the
out-of-sample gain the verdict's (f2) cell then states. The gain of the setting that is best on the tested problems
themselves is the in-sample gain (the paper's way of choosing); in-sample minus out-of-sample is the selection
effect. Its 95 % interval resamples both sets of problems (seeded bootstrap, arm_tuning.n_boot), choosing again on
every resample, so it carries the uncertainty of both choices.

The grid must hold the model's own setting (models.<name>.arm, else the paper's value for the model, else the
variant's fallback: arm.settings_for), so the chosen setting is always compared with the one the likelihood stage
runs. ARM is applied as in likelihood@<model> (TeacherForcedArm, packed scoring checked on the first problem: the
tree mask exactly, and in float32 against whole-sequence scoring; at every grid setting).

Outputs:
  artifacts/arm_tuning/<model>.h5       the grid, both problem sets, per setting and problem the paired gain, the
                                        statistics below, provenance (grid, problems, the settings' origins)
  metrics/arm_tuning/<model>.json       the summary the report and the verdict read
  metrics/timing/arm_tuning-<model>.json  the run's sidecar

An interrupted run restarts from the beginning (the outputs are written only at the end, atomically).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, cli, store
from meaningless_tokens.measures import arm_tuning
from meaningless_tokens.measures.arm_tuning import Tuning
from meaningless_tokens.config import Params
from meaningless_tokens.dataset import put_problems
from meaningless_tokens.errors import BadParam, names_the_file
from meaningless_tokens.stage import header, stage_context
from meaningless_tokens.store import put, put_json_attr, write_h5, write_metrics, write_timing

OUTPUTS = {"out": "arm_tuning", "metrics": "metrics/arm_tuning", "timing": "timing/arm_tuning"}


@names_the_file
def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "arm_tuning", name, root, **OUTPUTS)
    params, where = ctx.params, ctx.where
    cfg = params.arm_tuning
    if name not in cfg.models:
        raise BadParam(f"arm_tuning.models: model '{name}' is not among the models tuned "
                       f"{list(cfg.models)}; add it there to tune it")
    tuning, tested, data_sha = arm_tuning.problem_sets(params)  # refused before the model is resolved
    setup = ctx.setup()
    t = arm_tuning.tune(params, setup, (tuning, tested))
    write_artifact(where["out"], params, name, setup, t, data_sha)
    write_metrics(where["metrics"], t.summary)
    write_timing(where["timing"], {"seconds": ctx.seconds(),
                                   "scoring_seconds": round(t.seconds, 2), "settings": len(t.settings),
                                   "problems": len(tuning) + len(tested), "tokens": t.tokens,
                                   "tokens_per_second": round(t.tokens / t.seconds, 1) if t.seconds else None})
    c, result = t.summary["chosen"], t.result
    print(f"{name}: ARM tuned over {len(t.settings)} settings on {len(tuning)} problems in {t.seconds:.1f} s: chosen "
          f"c {c['c']:g}, percentage {c['percentage']:g}; out of sample {result['out_of_sample']['mean']:+.4f}, in "
          f"sample {result['in_sample']['mean']:+.4f}, selection effect {result['selection_effect']['mean']:+.4f} "
          f"nats/token -> {where['out']}")
    return where["out"]


def write_artifact(out: Path, params: Params, name: str, setup, t: Tuning, data_sha: str) -> None:
    tuning, tested, settings, gains, base, result = t.tuning, t.tested, t.settings, t.gains, t.base, t.result
    n_t = len(tuning)
    prov = {
        **store.model_provenance("arm_tuning", params, name, setup.prepared.manifest()),
        "arm": {"grid": [s.describe() for s in settings], "chosen": settings[result["chosen"]].describe(),
                "chosen_by": "largest mean gain on the tuning problems (the first of equals)",
                "differences_from_paper": arm.DIFFERENCES},
        "scoring": t.scoring,
        "dataset_sha256": data_sha,
    }
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, variant=settings[0].variant, n_tuning=n_t, n_tested=len(tested))
        put_json_attr(f, "provenance", prov)
        put_json_attr(f, "summary", t.summary)
        put(f, "grid", np.array([(s.c, s.percentage) for s in settings]), shape="[setting, c/percentage]")
        put(f, "chosen", np.array(result["chosen"], dtype=np.int32), compress=False)
        put(f, "best_in_sample", np.array(result["best_in_sample"], dtype=np.int32), compress=False)
        for key, problems, cols in (("tuning", tuning, slice(0, n_t)), ("tested", tested, slice(n_t, None))):
            g = f.create_group(key)
            put_problems(g, problems)
            put(g, "none_mean", base[cols], note="solution: mean log-prob per token under none, nats/token")
            put(g, "gain", gains[:, cols], shape="[setting, problem]",
                note="solution: mean log-prob per token, arm - none, nats/token")
        for key in ("out_of_sample", "in_sample", "selection_effect"):
            put(f, f"{key}/mean", np.array(result[key]["mean"]), compress=False)
            put(f, f"{key}/ci", np.array(result[key]["ci"]), compress=False)


def main(argv: list[str] | None = None) -> int:
    return cli.main("arm_tuning", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
