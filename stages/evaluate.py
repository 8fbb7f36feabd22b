"""evaluate@<model>: accuracy on the benchmark (`dataset`, MATH-500 by default) under the none / mless / mful
prompts, and `arm`; with `evaluate.sampling.n` > 0 also n sampled outputs per problem and condition (pass@k, maj@n,
distinct-n: meaningless_tokens/sampling.py).

`arm` is the none prompt with the paper's activation redistribution on layer 0's MLP (meaningless_tokens/arm.py):
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
  metrics/accuracy/<model>.json          accuracy, paired differences, McNemar p, bootstrap intervals
  metrics/timing/evaluate-<model>.json   seconds and tokens per second (kept apart: never deterministic)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from meaningless_tokens import arm, cli, grading, models, sampling, store
from meaningless_tokens.config import Params, Shard
from meaningless_tokens.engines import (Item, Journal, Record, check_engine, journal_key, make_batches, merge_parts,
                                        open_engine, part_path, run_journaled)
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.grading import has_complete_box
from meaningless_tokens.intervals import paired
from meaningless_tokens.prompts import PromptBuilder, builder_for, check_context, dataset_spec, load_problems, put_problems, select_problems
from meaningless_tokens.stage import header, stage_context
from meaningless_tokens.store import put, put_json_attr, put_texts, write_h5, write_json_atomic, write_timing

# the stage's outputs (and its journal): role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "eval", "metrics": "metrics/accuracy", "timing": "timing/evaluate", "journal": "journal/eval"}


# ---- metrics --------------------------------------------------------------------------------------

def summarize(records: dict[str, list[Record]], seed: int) -> dict:
    conditions = list(records)
    correct = {c: np.array([r.correct for r in records[c]]) for c in conditions}
    paper = {c: np.array([r.paper_correct for r in records[c]]) for c in conditions}
    m = {
        "n_problems": len(records["none"]),
        "accuracy": {c: float(correct[c].mean()) for c in conditions},
        "correct": {c: int(correct[c].sum()) for c in conditions},
        "paper_accuracy": {c: float(paper[c].mean()) for c in conditions},
        "boxed_rate": {c: float(np.mean([has_complete_box(r.output) for r in records[c]])) for c in conditions},
        "mean_tokens": {c: float(np.mean([r.n_tokens for r in records[c]])) for c in conditions},
        "stopped_at_length": {c: int(sum(r.stop == "length" for r in records[c])) for c in conditions},
    }
    for c in conditions:
        if c != "none":
            m[f"{c}-none"] = paired(correct[c], correct["none"], seed)
            m[f"{c}-none_paper"] = paired(paper[c], paper["none"], seed)
    return m


# ---- the stage ------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What a run generates: each (problem, condition) greedily, then `n_sampled` samples of each, in fixed batches."""
    setup: models.ModelSetup
    engine: object
    builder: PromptBuilder
    built: dict                # problem index -> condition -> PromptIds
    batches: list
    settings: dict             # what the outputs depend on beyond prompts and weights
    key: str                   # the journal's: weights, settings and every item
    arm_settings: object       # arm.ArmSettings, None without the arm condition
    n_sampled: int
    batch_size: int            # evaluate.batch_size, `auto` resolved
    items: list                # the greedy items (the journal's key)


def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "evaluate", name, root, **OUTPUTS)
    params, where = ctx.params, ctx.where
    cfg, conditions = params.evaluate, params.prompt.conditions
    problems, data_sha = load_problems(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "evaluate.n_samples")
    check_engine(cfg, conditions, params.runtime, params.file)
    if cfg.shard is not None and os.environ.get("DVC_STAGE"):
        raise ConfigError(f"{params.file}: evaluate.shard: a shard writes a part, not the stage's outputs: run each "
                          f"with `python -m stages.evaluate --model {name} --shard I/N`, then `dvc repro` with "
                          f"evaluate.shard null merges the parts")
    if name not in params.evaluated:
        raise ConfigError(f"{params.file}: evaluate.models: model '{name}' is not among the models evaluated "
                          f"{params.evaluated}; add it there to evaluate it")
    plan = make_plan(params, ctx.setup(), chosen)
    try:
        gold = {p.index: p.answer for p in chosen}
        if cfg.shard is not None:
            return run_shard(plan, where["journal"], gold, cfg.shard, conditions)

        if cfg.batch_size == "auto":
            say_resized(where["journal"], plan)
        journal = Journal(where["journal"], plan.key)
        merged = merge_parts(journal, where["journal"])
        started = time.perf_counter()
        done = run_journaled(plan.engine, plan.batches, journal, gold, f"evaluate {name}", name, conditions)
        seconds = time.perf_counter() - started
        by_cond = {c: [journal.records[(p.index, c)] for p in chosen] for c in conditions}
        samples = {c: [[journal.records[(p.index, c, j)] for j in range(plan.n_sampled)] for p in chosen]
                   for c in conditions} if plan.n_sampled else None
        metrics = measure(params, by_cond, samples)

        write_artifact(where["out"], params, plan, chosen, by_cond, samples, metrics, data_sha)
        write_json_atomic(where["metrics"], metrics)
        write_run_timing(where["timing"], params, plan, by_cond, samples, seconds, done, merged)
        where["journal"].unlink(missing_ok=True)
        for p in merged:
            p.unlink(missing_ok=True)
        acc = ", ".join(f"{c} {metrics['accuracy'][c]:.3f}" for c in conditions)
        if samples:
            k = min(3, plan.n_sampled)
            acc += f"; pass@{k} " + ", ".join(f"{c} {metrics['sampling'][f'pass@{k}'][c]:.3f}" for c in conditions)
        print(f"{name}: {len(chosen)} problems x {len(conditions)} conditions in {seconds:.1f} s; accuracy {acc} "
              f"-> {where['out']}")
        return where["out"]
    finally:
        plan.engine.close()  # the ARM hook off the model, whatever ends the stage


def make_plan(params: Params, setup: models.ModelSetup, chosen: list) -> Plan:
    """The engine, the prompts and the batches; refuses a prompt plus its new tokens longer than the context."""
    cfg, conditions = params.evaluate, params.prompt.conditions
    # ARM's values are checked before the model is loaded (its variant needs only the model_type)
    arm_settings = arm.settings_for(params.arm, params.dataset.benchmark, setup) if "arm" in conditions else None
    engine = open_engine(cfg, conditions, setup, arm_settings)
    try:
        builder = builder_for(params.prompt, setup, engine.tokenizer)
        built = {p.index: builder.build(p) for p in chosen}
        items = [Item(p.index, c, built[p.index][c].input_ids) for p in chosen for c in conditions]
        n_sampled = cfg.sampling.n
        sampled = [Item(p.index, c, built[p.index][c].input_ids, j) for p in chosen for c in conditions
                   for j in range(n_sampled)]
        longest = max(len(it.input_ids) for it in items)
        for key_name, limit in (("evaluate.max_new_tokens", cfg.max_new_tokens),
                                ("evaluate.sampling.max_new_tokens", (cfg.sampling.max_new_tokens or 0) if n_sampled else 0)):
            check_context(setup, key_name, f"a prompt of {longest} tokens plus {limit} new tokens", longest + limit)
        # the batch size (auto resolved) and, compiled, the one shape of every batch: from the whole plan, before the key
        batch_size = engine.fit([(items, cfg.max_new_tokens)]
                                + ([(sampled, engine.sampling["max_new_tokens"])] if n_sampled else []))
        # `.sampling` (resolved values and their origin) is evaluate's alone: the sweep shares the engine, not its samples
        settings = {**engine.settings, **({"arm": arm_settings.describe()} if arm_settings else {}),
                    **({"sampling": engine.sampling} if n_sampled else {})}
        key = plan_key(setup, settings, items, n_sampled)
        # sampled rows in batches of their own (their own max_new_tokens), after the greedy ones
        batches = make_batches(items, batch_size) + make_batches(sampled, batch_size)
        return Plan(setup, engine, builder, built, batches, settings, key, arm_settings, n_sampled, batch_size, items)
    except BaseException:
        engine.close()
        raise


def plan_key(setup: models.ModelSetup, settings: dict, items: list, n_sampled: int) -> str:
    return journal_key(setup.prepared.weights_sha256, settings, items, **({"sampled": n_sampled} if n_sampled else {}))


def say_resized(path: Path, plan: Plan) -> None:
    """One line when the journal left by an earlier run differs from this plan only in the batch size that
    evaluate.batch_size auto resolved (free memory differs): the journal then restarts, as for any other input."""
    try:
        with open(path, encoding="utf-8") as f:
            old = json.loads(f.readline()).get("key")
    except (OSError, ValueError, AttributeError):
        return
    rows = max(len(plan.items), len(plan.items) * plan.n_sampled)
    if old == plan.key:
        return
    for size in sorted({*range(1, min(rows, 7) + 1), *range(8, rows + 1, 8), rows} - {plan.batch_size}):
        if plan_key(plan.setup, {**plan.settings, "batch_size": size}, plan.items, plan.n_sampled) == old:
            print(f"{path}: made at batch size {size}; evaluate.batch_size auto resolves {plan.batch_size} now "
                  f"(free CUDA memory differs): its generations are redone at {plan.batch_size}", file=sys.stderr)
            return


def run_shard(plan: Plan, journal: Path, gold: dict, shard: Shard, conditions: list[str]) -> Path:
    """One job's part: its batches, journaled to the part file the merge reads."""
    name = plan.setup.name
    part = part_path(journal, shard.index, shard.count)
    mine = [b for j, b in enumerate(plan.batches) if j % shard.count == shard.index]
    run_journaled(plan.engine, mine, Journal(part, plan.key, foreign="refuse"), gold,
                  f"evaluate {name} shard {shard.index}/{shard.count}", name, conditions)
    print(f"{name}: shard {shard.index} of {shard.count} ({sum(map(len, mine))} generations) -> {part}; "
          f"with every part in {part.parent}, a run without evaluate.shard (dvc repro) merges them")
    return part


def measure(params: Params, by_cond: dict, samples: dict | None) -> dict:
    """metrics/accuracy/<model>.json: accuracy and paired differences per condition (and the sampled outputs')."""
    conditions, seed = params.prompt.conditions, params.evaluate.seed
    metrics = {"dataset": dataset_spec(params.dataset, params.file).label, **summarize(by_cond, seed)}
    if samples:
        metrics["sampling"] = sampling.summarize(
            {c: [[r.output for r in row] for row in samples[c]] for c in conditions},
            {c: [[r.extracted for r in row] for row in samples[c]] for c in conditions},
            {c: np.array([[r.correct for r in row] for row in samples[c]], dtype=bool) for c in conditions},
            {c: np.array([[r.paper_correct for r in row] for row in samples[c]], dtype=bool) for c in conditions},
            seed)
    return metrics


def write_artifact(out: Path, params: Params, plan: Plan, chosen: list, by_cond: dict, samples: dict | None,
                   metrics: dict, data_sha: str) -> None:
    """artifacts/eval/<model>.h5: per condition every problem's output, its grading (and the sampled outputs')."""
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


def write_run_timing(path: Path, params: Params, plan: Plan, by_cond: dict, samples: dict | None, seconds: float,
                     done: int, merged: dict) -> None:
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


def with_shard(params: Params, shard: str) -> Params:
    """params with evaluate.shard from the command line's `I/N` (0-based I)."""
    try:
        index, count = (int(x) for x in shard.split("/"))
        chosen = Shard(index=index, count=count)
    except (ValueError, ValidationError) as e:
        reason = e.errors()[0]["msg"].removeprefix("Value error, ") if isinstance(e, ValidationError) else "expected I/N"
        raise ConfigError(f"--shard {shard}: {reason} (evaluate.shard: index I of count N, 0 <= I < N)") from None
    return params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"shard": chosen})})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--shard", help="I/N: run shard I (0-based) of N, as evaluate.shard does")
    known, rest = ap.parse_known_args(argv)
    stage = (lambda params, name: run(with_shard(params, known.shard), name)) if known.shard else run
    return cli.main("evaluate", __doc__, stage, rest)


if __name__ == "__main__":
    sys.exit(main())
