"""sweep@<model>: the effect against the span's length and character (the paper's dose-response): attention, and
optionally accuracy and likelihood, at every (token, count) (DEFINITIONS: each dataset).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from meaningless_tokens import cli, store
from meaningless_tokens.config import Params, Shard
from meaningless_tokens.dataset import dataset_spec, load_problems, put_problems
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.measures.sweep import (AccuracySweep, AttentionSweep, LikelihoodSweep, measure, measure_shard,
                                               metrics_summary, table)
from meaningless_tokens.stage import INDEXING, header, stage_context
from meaningless_tokens.store import (put, put_json_attr, write_csv_atomic, write_h5, write_metrics,
                                      write_timing)

# what the artifact's `definitions` attribute says, and `--help`: a constant, not the docstring, so that an edit of the
# docstring leaves the attribute as it is (the file's code hash, in provenance, still changes: the stage reruns)
DEFINITIONS = """sweep@<model>: the effect against the span's length and character (the paper's dose-response).

For every span token of `sweep.tokens` and count of `sweep.counts` (the paper's 0, 10, 25, 40, 55, 70)
the `mless` prompt is rebuilt with that span (meaningless_tokens/prompts.py; count 0 is the `none` prompt) and,
on `sweep.attention_samples` problems, layer `sweep.layer`'s attention is captured and reduced exactly
as extraction does (meaningless_tokens/capture.py: `attention`; attention.py: `reduce`) and summarized exactly as
the statistics do (meaningless_tokens/measures/extract.py: `sample_stats`), so the value at count 55 is the main pipeline's number:

  drop[k, h]           mean over samples of orig_mean[none] - orig_mean[count k], head h (attention
                       an original token receives, mean over original tokens; stats.query_set and
                       stats.exclude_first apply), with bootstrap 95 % intervals; drop_pct in percent
                       of the none mean
  drop_heads[k]        the same for the mean over heads; drop_top[k] for the mean over the `sweep.top_heads`
                       heads with the largest drop at `sweep.reference_count` (55, the paper's): one
                       fixed head set for every count
  span_mass[k, h]      attention original queries after the span give to it (0 at count 0); lambda =
                       1 - span_mass, the mass they keep on original keys
  span_tokens[k]       the span's length in this model's tokens (what a count of characters becomes)

With `sweep.accuracy_samples` > 0, MATH-500 accuracy too: greedy generation as evaluation does
(meaningless_tokens/engines/: `generate`, `grade`, the resumable journal; under the plan's one shape the rows the
evaluate stage generated for the same prompts, count 0 = none and count 55 = mless, are taken from its
artifacts/generations/<model>.jsonl where its key is this run's, as this run would generate them), count 0 once (= none), each other
(token, count) against it with the paired difference, its bootstrap interval and McNemar p.

With `sweep.likelihood_samples` > 0, the likelihood of the reference solution too (meaningless_tokens/scoring/: the
same continuation, likelihood.solution_tokens and likelihood.separator, scored the same way on the whole model):
per (token, count) the mean log-prob per token of each problem, and its paired difference to count 0 with a
bootstrap interval and the Wilcoxon p: the dose-response with a continuous, paired outcome.

Outputs: artifacts/sweep/<model>.h5, metrics/sweep/<model>.json (the summary `dvc metrics` and
`dvc exp show` read), artifacts/plots/sweep/<model>.csv (for `dvc plots`), and the run's sidecar
metrics/timing/sweep-<model>.json.
"""

# the stage's outputs (and its journal): role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "sweep", "metrics": "metrics/sweep", "table": "plots/sweep", "timing": "timing/sweep",
           "journal": "journal/sweep"}
INPUTS = {"kept": "generations"}  # evaluate's kept generations of this model, where it wrote them (a memo: see below)


@names_the_file
def run(params: Params, name: str, root: Path | None = None, shard: Shard | None = None) -> Path:
    """The stage; with `shard` (`--shard I/N`) only that part of the accuracy sweep's generation, written beside the
    journal for the stage's run to merge."""
    ctx = stage_context(params, "sweep", name, root, **OUTPUTS, **INPUTS)
    params, where = ctx.params, ctx.where
    cfg = params.sweep
    problems, data_sha = load_problems(dataset_spec(params.dataset, params.file))
    if shard is not None:
        return measure_shard(params, ctx.setup, problems, where["journal"], shard, where["kept"])
    s = measure(params, ctx.setup, problems, where["journal"], where["kept"])
    att, acc, lik = s.attention, s.accuracy, s.likelihood

    write_artifact(where["out"], params, name, att, acc, lik, data_sha)
    write_metrics(where["metrics"], metrics_summary(cfg, att.summary, att.tokenization, acc.rows,
                                                        len(att.problems), len(acc.problems), lik.rows, len(lik.problems)))
    write_csv_atomic(where["table"], *table(cfg, att.summary, att.tokenization, acc.rows, lik.rows))
    write_timing(where["timing"], {"seconds": ctx.seconds(),
                                   "attention_seconds": round(att.seconds, 2), "attention_prompts": att.prompts,
                                   **({"accuracy": acc.stats} if acc.problems else {})})
    print(f"{name}: span sweep of {len(cfg.tokens)} token(s) x {len(cfg.counts)} counts on {len(att.problems)} problems"
          + (f", accuracy on {len(acc.problems)}" if acc.problems else "")
          + (f", likelihood on {len(lik.problems)}" if lik.problems else "") + f" -> {where['out']}")
    return where["out"]


def write_artifact(out: Path, params: Params, name: str, att: AttentionSweep, acc: AccuracySweep,
                   lik: LikelihoodSweep, data_sha: str) -> None:
    """artifacts/sweep/<model>.h5: the layout DEFINITIONS describes, its provenance at the root."""
    cfg, bs, per, summary, tokenization = params.sweep, att.builders, att.per, att.summary, att.tokenization
    prov = {
        **store.model_provenance("sweep", params, name, att.manifest),
        "layers_probe": att.probe,
        **bs[(cfg.tokens[0], cfg.counts[-1])].describe(),
        # evaluate and likelihood are read only when those sweeps run: otherwise not part of what made this file
        "params": {**store.stage_params(params, "sweep", name),
                   **({"evaluate": None, "arm": None} if not cfg.accuracy_samples else {}),
                   **({"likelihood": None} if not cfg.likelihood_samples else {})},
        "generation": acc.settings,
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params.dataset, params.file).describe(),
    }
    ref = cfg.reference_count
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, layer=cfg.layer, heads=np.array(att.heads, dtype=np.int32),
               counts=np.array(cfg.counts, dtype=np.int32), tokens=list(cfg.tokens), reference_count=ref,
               n_samples=len(att.problems), accuracy_samples=len(acc.problems), likelihood_samples=len(lik.problems),
               indexing=INDEXING, definitions=DEFINITIONS)
        put_json_attr(f, "provenance", prov)
        put_problems(f, att.problems)
        if acc.problems:
            put(f, "accuracy_problem_index", np.array([p.index for p in acc.problems], dtype=np.int32))
        if lik.problems:
            put(f, "likelihood_problem_index", np.array([p.index for p in lik.problems], dtype=np.int32))
            put(f, "likelihood_none", lik.mean["none"], note="count 0: mean log-prob per token of the solution, per problem")
        put(f, "orig_mean_none", per["none"][0], shape="[sample, head]")
        for k, token in enumerate(cfg.tokens):
            g = f.create_group(f"token_{k}")
            g.attrs["token"] = token
            g.attrs["span_text"] = [bs[(token, c)].mless_text for c in cfg.counts]
            put(g, "top_heads", summary[token]["top_heads"], note=f"largest drop at count {ref}")
            put(g, "span_tokens", np.array([tokenization[token][c]["span_tokens"] for c in cfg.counts], dtype=np.int32))
            put(g, "pieces_per_repetition", np.int32(tokenization[token][cfg.counts[-1]]["pieces_per_repetition"]))
            rows = summary[token]["rows"]
            for fld in rows[cfg.counts[0]]:
                put(g, fld, np.stack([rows[c][fld] for c in cfg.counts]).astype(np.float64),
                    shape="[count, ...]; intervals [count, low/high, ...]")
            put(g, "orig_mean", np.stack([per[(token, c)][0] for c in cfg.counts]), shape="[count, sample, head]")
            put(g, "span_mass_per_sample", np.stack([per[(token, c)][1] for c in cfg.counts]),
                shape="[count, sample, head]")
            if acc.correct:
                put(g, "correct", np.stack([acc.correct[(token, c)] for c in cfg.counts]), shape="[count, problem]")
                a = [acc.rows[(token, c)] for c in cfg.counts]
                put(g, "accuracy", np.array([r["accuracy"] for r in a]))
                put(g, "accuracy_delta", np.array([r.get("delta", 0.0) for r in a]), note="vs count 0 (none)")
                put(g, "accuracy_delta_ci", np.array([[r.get("ci95_low", 0.0), r.get("ci95_high", 0.0)] for r in a]),
                    shape="[count, low/high]", note="paired bootstrap 95 % interval over problems")
                put(g, "mcnemar_p", np.array([r.get("mcnemar_p", 1.0) for r in a]), note="exact McNemar vs count 0")
            if lik.mean:
                put(g, "likelihood", np.stack([lik.mean[(token, c)] for c in cfg.counts]), shape="[count, problem]",
                    note="mean log-prob per token of the reference solution, nats/token")
                rows_l = [lik.rows[(token, c)] for c in cfg.counts]
                put(g, "likelihood_delta", np.array([r["delta"] for r in rows_l]), note="vs count 0 (none), nats/token")
                put(g, "likelihood_delta_ci", np.array([r["ci"] for r in rows_l]), shape="[count, low/high]")
                put(g, "likelihood_p", np.array([r["p"] for r in rows_l]), note="Wilcoxon signed-rank vs count 0")
                put(g, "likelihood_p_noise", np.array([r["p_noise"] for r in rows_l]),
                    note="how far float noise can move likelihood_p (meaningless_tokens/noise.py)")
        if acc.correct:
            put(f, "correct_none", acc.correct["none"], note="count 0: the none prompt, per accuracy problem")


def main(argv: list[str] | None = None) -> int:
    return cli.main("sweep", DEFINITIONS, run, argv, shards="the accuracy sweep's batches j with j % N == I "
                    "generated into a part beside its journal (sweep.accuracy_samples > 0); the stage's run merges "
                    "the parts")


if __name__ == "__main__":
    sys.exit(main())
