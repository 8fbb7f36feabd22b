"""Accuracy on a benchmark under each prompt condition (stages/evaluate.py writes it; its docstring states the
design): `make_plan` opens the engine and lays out every generation in fixed batches, `evaluate` runs them through
a journal (resuming an interrupted run) and grades and summarizes them, `run_shard` runs one shard's part.

Reusable without DVC: `params` is the evaluate stage's params view (or the whole params), `setup` models.setup_for's;
close the plan's engine (`plan.engine.close()`) when done.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, models, sampling
from meaningless_tokens.config import Params, Shard
from meaningless_tokens.dataset import dataset_spec
from meaningless_tokens.engines import (Engine, Item, Journal, Record, journal_key, make_batches, merge_parts,
                                        open_engine, part_path, run_journaled)
from meaningless_tokens.grading import has_complete_box
from meaningless_tokens.intervals import paired
from meaningless_tokens.prompts import PromptBuilder, builder_for, check_context

# How `make verify` compares this measure's outputs (meaningless_tokens/verify/kinds.py assembles KINDS from every
# measure's): (artifact kind of store.PATHS, key glob, kind of quantity of verify's TOLERANCES), first match wins
QUANTITIES = (
    ("metrics/accuracy", "*", "exact"),
    ("eval", "*", "exact"),
    ("accuracy_table", "*", "exact"),
)


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


@dataclass
class Plan:
    """What a run generates: each (problem, condition) greedily, then `n_sampled` samples of each, in fixed batches."""
    setup: models.ModelSetup
    engine: Engine
    builder: PromptBuilder
    built: dict                # problem index -> condition -> PromptIds
    batches: list
    settings: dict             # what the outputs depend on beyond prompts and weights
    key: str                   # the journal's: weights, settings and every item
    arm_settings: object       # arm.ArmSettings, None without the arm condition
    n_sampled: int
    batch_size: int            # evaluate.batch_size, `auto` resolved
    items: list                # the greedy items (the journal's key)


@dataclass
class Evaluation:
    """A whole run's records per condition (in the chosen problems' order), and what they sum to."""
    by_cond: dict              # condition -> [Record] greedy, one per problem
    samples: dict | None       # condition -> [[Record] per sample] per problem; None without sampling
    metrics: dict              # metrics/accuracy/<model>.json
    seconds: float             # this run's generation (journaled batches excluded)
    done: int                  # generations the journal already held
    merged: dict               # shard part file -> generations merged from it


def evaluate(params: Params, plan: Plan, chosen: list, journal_path: Path) -> Evaluation:
    """Every batch of `plan` not yet in the journal at `journal_path` (shard parts beside it merged first), graded
    and summarized; the journal is left for the caller to delete once the outputs are written."""
    conditions = params.prompt.conditions
    gold = {p.index: p.answer for p in chosen}
    if params.evaluate.batch_size == "auto":
        say_resized(journal_path, plan)
    journal = Journal(journal_path, plan.key, settings=plan.settings)
    merged = merge_parts(journal, journal_path)
    started = time.perf_counter()
    name = plan.setup.name
    done = run_journaled(plan.engine, plan.batches, journal, gold, f"evaluate {name}", name, conditions)
    seconds = time.perf_counter() - started
    by_cond = {c: [journal.records[(p.index, c)] for p in chosen] for c in conditions}
    samples = {c: [[journal.records[(p.index, c, j)] for j in range(plan.n_sampled)] for p in chosen]
               for c in conditions} if plan.n_sampled else None
    return Evaluation(by_cond, samples, measure(params, by_cond, samples), seconds, done, merged)


def make_plan(params: Params, setup: models.ModelSetup, chosen: list) -> Plan:
    """The engine, the prompts and the batches; refuses a prompt plus its new tokens longer than the context."""
    cfg, conditions = params.evaluate, params.prompt.conditions
    # ARM's values are checked before the model is loaded (its variant needs only the model_type)
    arm_settings = arm.hook_settings(params.arm, params.dataset.benchmark, setup, conditions)
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
    run_journaled(plan.engine, mine, Journal(part, plan.key, foreign="refuse", settings=plan.settings), gold,
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
