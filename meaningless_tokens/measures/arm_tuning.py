"""ARM's (c, percentage) chosen on problems it is not judged on, and what choosing on the judged ones adds
(stages/arm_tuning.py writes it; its docstring states the design).

`problem_sets(params)` draws the tuning and tested problems; `tune(params, setup, problems)` scores the solution
under `none` and under `arm` at every setting of the model's variant's grid and returns a `Tuning`: the paired gains,
the choice, its selection effect and the summary metrics/arm_tuning/<model>.json holds. Reusable without DVC:
`params` is the arm_tuning stage's params view (or the whole params), `setup` models.setup_for's.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass

import numpy as np

from meaningless_tokens import arm, hooks, progress, scoring
from meaningless_tokens.config import ArmTuning, Params
from meaningless_tokens.dataset import Problem, dataset_spec, load_problems, require_field, select_problems
from meaningless_tokens.engines import open_scorer
from meaningless_tokens.errors import BadParam
from meaningless_tokens.intervals import bootstrap_mean_ci
from meaningless_tokens.prompts import builder_for
from meaningless_tokens.scoring import Seq, TeacherForcedArm


@dataclass
class Tuning:
    """One model's tuning: gains are [setting, problem], the tuning problems' columns first."""
    tuning: list[Problem]
    tested: list[Problem]
    settings: list             # arm.ArmSettings per grid setting, in grid order
    own_index: int             # the model's own setting's index in the grid
    base: np.ndarray           # [problem] mean log-prob per token under none
    gains: np.ndarray          # [setting, problem] arm - none
    result: dict               # `selection`'s
    summary: dict              # metrics/arm_tuning/<model>.json
    scoring: dict              # how each pass was scored (the artifact's provenance)
    seconds: float             # scoring alone
    tokens: int                # scored, all passes together


# ---- problems and sequences -----------------------------------------------------------------------

def problem_sets(params: Params) -> tuple[list[Problem], list[Problem], str]:
    """(tuning problems, tested problems, dataset sha256): the tested ones are likelihood's subset, the tuning
    ones a seeded, level-stratified subset of the rest."""
    spec = dataset_spec(params.dataset, params.file)
    problems, data_sha = load_problems(spec)
    lk, cfg = params.likelihood, params.arm_tuning
    tested = select_problems(problems, lk.n_samples, lk.seed, "likelihood.n_samples")
    taken = {p.index for p in tested}
    rest = [p for p in problems if p.index not in taken]
    if len(rest) < cfg.n_samples:
        raise BadParam(f"arm_tuning.n_samples: {cfg.n_samples} tuning problems asked for, but only "
                       f"{len(rest)} lie outside likelihood's {len(tested)} (likelihood.n_samples); lower one of them")
    tuning = select_problems(rest, cfg.n_samples, cfg.seed, "arm_tuning.n_samples")
    require_field(spec, tuning + tested, "solution", "the ARM tuning stage (the solution's likelihood)")
    return tuning, tested, data_sha


def solution_sequences(params: Params, builder, problems: list[Problem]) -> tuple[list[Seq], list[Seq]]:
    """(none sequences, arm sequences): each problem's none prompt with likelihood's `solution` continuation."""
    conts = scoring.Continuations(params.likelihood, builder, dataset_spec(params.dataset, params.file).path)
    none, arms = [], []
    for p in problems:
        ids = builder.build(p)["none"].input_ids
        n, a = conts.sequences(p, {"none": ids, "arm": ids}, ("solution",))
        none.append(n)
        arms.append(a)
    return none, arms


def check_grid(cfg: ArmTuning, variant: str) -> list[tuple[float, float]]:
    """The variant's grid (`cfg`: params' arm_tuning) as (c, percentage) pairs, each within the variant's range, the
    fallback among them."""
    grid = [tuple(map(float, pair)) for pair in cfg.grid[variant]]
    for c, pct in grid:
        for key in ("c", "percentage"):
            why = arm.check_setting(variant, c, pct, key)
            if why:
                raise BadParam(f"arm_tuning.grid.{variant}: ({c:g}, {pct:g}): {key} {why}")
    if tuple(arm.FALLBACK[variant]) not in grid:
        raise BadParam(f"arm_tuning.grid.{variant}: {grid} lacks the variant's fallback "
                       f"{arm.FALLBACK[variant]}, the setting a model the paper did not run gets untuned")
    return grid


# ---- statistics -----------------------------------------------------------------------------------

def choose(gains: np.ndarray) -> int:
    """The setting with the largest mean gain (the first of equals): `gains` is [setting, problem]."""
    return int(np.argmax(gains.mean(axis=1)))


def selection(tuning: np.ndarray, tested: np.ndarray, seed: int, n_boot: int) -> dict:
    """The choice and its selection effect from the paired gains [setting, problem] on both sets.

    chosen: best on tuning; out_of_sample: its mean gain on tested; best_in_sample: best on tested (the paper's
    choice); in_sample: that one's mean gain on tested; selection_effect = in_sample - out_of_sample. Intervals:
    seeded bootstrap over the problems of both sets (independently), choosing again in every resample."""
    chosen, best = choose(tuning), choose(tested)
    rng = np.random.default_rng(seed)
    n_t, n_e = tuning.shape[1], tested.shape[1]
    boot = np.empty((n_boot, 3))
    for b in range(n_boot):
        it, ie = rng.integers(0, n_t, n_t), rng.integers(0, n_e, n_e)
        on_test = tested[:, ie].mean(axis=1)
        out = on_test[int(np.argmax(tuning[:, it].mean(axis=1)))]
        boot[b] = (out, on_test.max(), on_test.max() - out)
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    mean_e = tested.mean(axis=1)
    point = (mean_e[chosen], mean_e[best], mean_e[best] - mean_e[chosen])
    return {"chosen": chosen, "best_in_sample": best,
            **{k: {"mean": float(v), "ci": (float(lo[j]), float(hi[j]))}
               for j, (k, v) in enumerate(zip(("out_of_sample", "in_sample", "selection_effect"), point))}}


def metrics_summary(grid, gains, n_t: int, result: dict, own, own_k: int, cfg) -> dict:
    def r(x: float) -> float:
        return round(float(x), 6)

    def setting(k: int) -> dict:
        return {"index": k, "c": grid[k][0], "percentage": grid[k][1]}

    def stat(d: dict) -> dict:
        return {"mean": r(d["mean"]), "ci95": [r(x) for x in d["ci"]]}

    tested = gains[:, n_t:]
    lo, hi = bootstrap_mean_ci(tested, cfg.seed, n_boot=cfg.n_boot, axis=1)  # per setting, the same resamples
    return {
        "variant": own.variant, "n_tuning": n_t, "n_tested": int(gains.shape[1] - n_t), "seed": cfg.seed,
        "outcome": "solution: mean log-prob per token, arm - none (nats/token)",
        "grid": [{"c": c, "percentage": p, "gain_tuning": r(gains[k, :n_t].mean()), "gain_tested": r(tested[k].mean()),
                  "gain_tested_ci95": [r(lo[k]), r(hi[k])]} for k, (c, p) in enumerate(grid)],
        "chosen": setting(result["chosen"]),
        "own": {**setting(own_k), "origin": own.origin["c"]},
        "best_in_sample": setting(result["best_in_sample"]),
        "out_of_sample": stat(result["out_of_sample"]),
        "in_sample": stat(result["in_sample"]),
        "selection_effect": stat(result["selection_effect"]),
    }


# ---- the tuning -----------------------------------------------------------------------------------

def tune(params: Params, setup, problems: tuple[list[Problem], list[Problem]]) -> Tuning:
    """Scores `problems` (tuning, tested: `problem_sets`'s) under none and under arm at every grid setting of the
    model's variant, and chooses; refuses a grid without the model's own setting before the model loads."""
    cfg, name = params.arm_tuning, setup.name
    tuning, tested = problems
    own = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    grid = check_grid(cfg, own.variant)
    if (own.c, own.percentage) not in grid:
        raise BadParam(f"arm_tuning.grid.{own.variant}: {grid} lacks model '{name}''s own setting "
                       f"({own.c:g}, {own.percentage:g}) ({own.origin['c']}); add it, so the choice is compared with it")
    settings = [dataclasses.replace(own, c=c, percentage=pct, origin={**own.origin, "c": "arm_tuning.grid",
                                                                        "percentage": "arm_tuning.grid"})
                for c, pct in grid]

    engine = open_scorer(setup)
    prompt = params.prompt.model_copy(update={"conditions": ["none"]})
    builder = builder_for(prompt, setup, engine.tokenizer)
    none_seqs, arm_seqs = solution_sequences(params, builder, tuning + tested)
    context = setup.prepared.facts["max_position_embeddings"]
    longest = max(len(s.input_ids) for s in none_seqs)
    if context and longest > context:
        raise BadParam(f"likelihood.solution_tokens: a prompt plus its solution ({longest} tokens) "
                       f"exceeds the context of model '{name}' ({context} positions)")
    pad = engine.pad
    warn = lambda why: print(f"{name}: {why}", file=sys.stderr)  # noqa: E731
    bar = progress.bar(total=len(none_seqs) * (1 + len(settings)), desc=f"arm tuning {name}", unit="seq")
    t0 = time.perf_counter()
    none_lp, how, _ = engine.loglikelihood(none_seqs, params.likelihood.batch_tokens, bar=bar, warn=warn)
    arm_lp, checks = [], []
    try:
        with engine, hooks.Hooks() as h:
            hook = h.arm(TeacherForcedArm(arm.layer0_mlp(engine.model, setup, "arm_tuning.models"), settings[0]))
            for s in settings:
                hook.settings = s
                lps, info, _ = engine.loglikelihood(arm_seqs, params.likelihood.batch_tokens, hook, bar=bar,
                                                    warn=warn)
                arm_lp.append(lps)
                checks.append(info)
    finally:
        bar.close()
    seconds = time.perf_counter() - t0

    n_t = len(tuning)
    base = np.array([x.mean() for x in none_lp])
    gains = np.array([[x.mean() for x in lps] for lps in arm_lp]) - base[None, :]
    result = selection(gains[:, :n_t], gains[:, n_t:], cfg.seed, cfg.n_boot)
    own_k = grid.index((own.c, own.percentage))
    return Tuning(tuning, tested, settings, own_k, base, gains, result,
                  metrics_summary(grid, gains, n_t, result, own, own_k, cfg),
                  {"attn_implementation": engine.attn, "batch_tokens": params.likelihood.batch_tokens, "pad_token_id": pad,
                   "none": how, "arm": checks}, seconds,
                  sum(len(s.input_ids) for s in none_seqs) * (1 + len(settings)))
