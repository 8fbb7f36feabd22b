"""evaluate@<model>: accuracy on the benchmark (`dataset`, MATH-500 by default) under the none / mless / mful
prompts, and `arm`; with `evaluate.sampling.n` > 0 also n sampled outputs per problem and condition (pass@k, maj@n,
distinct-n: meaningless_tokens/sampling.py).

`arm` is the none prompt with the paper's activation redistribution on layer 0's MLP (meaningless_tokens/arm/):
a forward hook edits only the arm rows of a batch (`arm.pool: row` keeps each row's statistics to its own
tokens), so arm rows share batches, static cache and journal with the other conditions.

Greedy generation (`do_sample=False`, set explicitly: instruct checkpoints would otherwise sample by
their generation_config), batched with left padding and a KV cache, prompts sorted by length;
SDPA attention and a static cache sized per batch (a dynamic cache re-concatenates every layer's
keys and values at each step: half of the CPU time at batch 12; outputs were identical), or with
`evaluate.compile` on (CUDA by default) one compiled shape per stage, warmed up before the first batch;
`evaluate.batch_size: auto` sizes the batches by free CUDA memory (docs/evaluation.md);
optionally stopping a row once it has written a complete \\boxed{...}. Outputs are graded by
math-verify and, beside it, by the paper's rule (meaningless_tokens/grading.py): on prompt + output for greedy outputs, on the
output alone for sampled ones, as the paper's code does.

Each finished batch is appended to a journal (`artifacts/eval/.journal/<model>.jsonl`); an
interrupted run resumes from it with the same batches, so the final artifact equals an
uninterrupted run's. Outputs:

  artifacts/eval/<model>.h5              per problem and condition: output, extracted answer, grades
  artifacts/generations/<model>.jsonl    the greedy rows the sweep may take (meaningless_tokens/generations.py):
                                         under the plan's one shape the none/mless rows, else none and why
  metrics/accuracy/<model>.json          accuracy, paired differences, McNemar p, bootstrap intervals
  metrics/timing/evaluate-<model>.json   seconds and tokens per second (kept apart: never deterministic)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from meaningless_tokens import arm, cli, generations, grading, store
from meaningless_tokens.measures import evaluate
from meaningless_tokens.config import Params, Shard
from meaningless_tokens.dataset import dataset_spec, load_problems, put_problems, select_problems
from meaningless_tokens.engines import Item, check_engine
from meaningless_tokens.errors import BadParam, names_the_file
from meaningless_tokens.measures.evaluate import Evaluation, Plan
from meaningless_tokens.stage import header, stage_context
from meaningless_tokens.store import put, put_json_attr, put_texts, write_h5, write_metrics, write_timing

# the stage's outputs (and its journal): role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "eval", "kept": "generations", "metrics": "metrics/accuracy", "timing": "timing/evaluate",
           "journal": "journal/eval"}


@names_the_file
def run(params: Params, name: str, root: Path | None = None, shard: Shard | None = None) -> Path:
    """`shard` (`--shard I/N`) overrides evaluate.shard."""
    if shard is not None:
        params = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"shard": shard})})
    ctx = stage_context(params, "evaluate", name, root, **OUTPUTS)
    params, where = ctx.params, ctx.where
    cfg, conditions = params.evaluate, params.prompt.conditions
    problems, data_sha = load_problems(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "evaluate.n_samples")
    check_engine(cfg, conditions, params.runtime, params.file)
    if cfg.shard is not None and os.environ.get("DVC_STAGE"):
        raise BadParam(f"evaluate.shard: a shard writes a part, not the stage's outputs: run each "
                       f"with `python -m stages.evaluate --model {name} --shard I/N`, then `dvc repro` with "
                       f"evaluate.shard null merges the parts")
    if name not in params.evaluated:
        raise BadParam(f"evaluate.models: model '{name}' is not among the models evaluated "
                       f"{params.evaluated}; add it there to evaluate it")
    plan = evaluate.make_plan(params, ctx.setup(), chosen)
    try:
        if cfg.shard is not None:
            return evaluate.run_shard(plan, where["journal"], {p.index: p.answer for p in chosen}, cfg.shard,
                                        conditions)
        e = evaluate.evaluate(params, plan, chosen, where["journal"])
        write_artifact(where["out"], params, plan, chosen, e, data_sha)
        generations.write(where["kept"], plan.engine.row_key(), getattr(plan.engine, "shape", None),
                          [(Item(p.index, c, plan.built[p.index][c].input_ids), r.output, r.n_tokens, r.stop)
                           for c in conditions for p, r in zip(chosen, e.by_cond[c])])
        write_metrics(where["metrics"], e.metrics)
        write_run_timing(where["timing"], params, plan, e)
        where["journal"].unlink(missing_ok=True)
        for p in e.merged:
            p.unlink(missing_ok=True)
        metrics, samples, seconds = e.metrics, e.samples, e.seconds
        acc = ", ".join(f"{c} {metrics['accuracy'][c]:.3f}" for c in conditions)
        if samples:
            k = min(3, plan.n_sampled)
            acc += f"; pass@{k} " + ", ".join(f"{c} {metrics['sampling'][f'pass@{k}'][c]:.3f}" for c in conditions)
        print(f"{name}: {len(chosen)} problems x {len(conditions)} conditions in {seconds:.1f} s; accuracy {acc} "
              f"-> {where['out']}")
        return where["out"]
    finally:
        plan.engine.close()  # the ARM hook off the model, whatever ends the stage


def write_artifact(out: Path, params: Params, plan: Plan, chosen: list, e: Evaluation, data_sha: str) -> None:
    """artifacts/eval/<model>.h5: per condition every problem's output, its grading (and the sampled outputs')."""
    by_cond, samples, metrics = e.by_cond, e.samples, e.metrics
    name, conditions, arm_settings, built = plan.setup.name, params.prompt.conditions, plan.arm_settings, plan.built
    prov = {
        **store.model_provenance("evaluate", params, name, plan.setup.prepared.manifest(),
                                 unused=() if arm_settings else ("arm",)),
        **plan.builder.describe(),
        "generation": plan.settings,
        **({"arm": {**arm_settings.describe(), "differences_from_paper": arm.DIFFERENCES}} if arm_settings else {}),
        "grader": {"library": "math-verify", "paper_rule": grading.PAPER_RULE + " Applied to prompt + output, "
                   "as the paper's greedy runs do."},
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params.dataset, params.file).describe(),
    }
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, conditions=list(conditions))
        put_json_attr(f, "provenance", prov)
        put_json_attr(f, "metrics", metrics)
        put_problems(f, chosen, with_answer=True)
        for c in conditions:
            g, recs = f.create_group(c), by_cond[c]
            put(g, "prompt_tokens", np.array([len(built[q.index][c].input_ids) for q in chosen], dtype=np.int32))
            # texts through put_texts: a model can write NUL or a lone surrogate, which HDF5 strings cannot hold
            put_texts(g, "output", [r.output for r in recs], compress=False)
            put(g, "n_tokens", np.array([r.n_tokens for r in recs], dtype=np.int32))
            put_texts(g, "stop", [r.stop for r in recs], compress=False)
            put_texts(g, "extracted", [r.extracted for r in recs], compress=False)
            put(g, "correct", np.array([r.correct for r in recs], dtype=bool))
            put_texts(g, "paper_extracted", [r.paper_extracted or "" for r in recs], compress=False,
                      note="'' where prompt + output hold no complete box")
            put(g, "paper_correct", np.array([r.paper_correct for r in recs], dtype=bool))
            if samples:  # [problems, samples]; graded on the output alone, as the paper's pass@3
                sg, rows = g.create_group("sampled"), samples[c]
                put_texts(sg, "output", [[r.output for r in row] for row in rows], compress=False)
                put(sg, "n_tokens", np.array([[r.n_tokens for r in row] for row in rows], dtype=np.int32))
                put_texts(sg, "stop", [[r.stop for r in row] for row in rows], compress=False)
                put_texts(sg, "extracted", [[r.extracted for r in row] for row in rows], compress=False)
                put(sg, "correct", np.array([[r.correct for r in row] for row in rows], dtype=bool))
                put(sg, "paper_correct", np.array([[r.paper_correct for r in row] for row in rows], dtype=bool),
                    note="the paper's rule on the output alone (its pass@3)")


def write_run_timing(path: Path, params: Params, plan: Plan, e: Evaluation) -> None:
    by_cond, samples, seconds, done, merged = e.by_cond, e.samples, e.seconds, e.done, e.merged
    cfg, conditions = params.evaluate, params.prompt.conditions
    tokens = {c: sum(r.n_tokens for r in by_cond[c]) for c in conditions}
    gen_seconds = {c: sum(r.seconds for r in by_cond[c]) for c in conditions}
    write_timing(path, {
        "seconds_this_run": round(seconds, 2),
        "generation_seconds": {c: round(s, 2) for c, s in gen_seconds.items()},
        "tokens_per_second": {c: round(tokens[c] / gen_seconds[c], 2) if gen_seconds[c] else None
                              for c in conditions},
        **({"sampled_generation_seconds": {c: round(sum(r.seconds for row in samples[c] for r in row), 2)
                                           for c in conditions}} if samples else {}),
        "resumed_generations": done, "merged_parts": {p.name: n for p, n in merged.items()},
        "engine": cfg.engine, **plan.engine.stats, "batch_size": plan.batch_size, "device": plan.settings["device"],
    })


def main(argv: list[str] | None = None) -> int:
    return cli.main("evaluate", __doc__, run, argv, shards="its batches j with j % N == I generated into a part "
                    "beside the journal, as evaluate.shard does; a run without one merges the parts")


if __name__ == "__main__":
    sys.exit(main())
