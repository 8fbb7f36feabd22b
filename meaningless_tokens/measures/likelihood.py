"""Teacher-forced log-probabilities of the reference solution and of the gold answer appended to each condition's
prompt (stages/likelihood.py's DEFINITIONS: the sequences, the scoring, the outcomes), and the paired contrasts of each
condition to none.

    m = teacher_forced.measure(params, models.setup_for(params, name), problems)
    summary = teacher_forced.summarize(m.per, list(params.likelihood.conditions), problems, seed, n_boot)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from meaningless_tokens import arm, hooks, models, scoring
from meaningless_tokens.config import Params, Prompt
from meaningless_tokens.dataset import Problem, dataset_spec
from meaningless_tokens.engines import open_scorer
from meaningless_tokens.errors import BadParam
from meaningless_tokens.paired import groups, paired_stats
from meaningless_tokens.prompts import builder_for
from meaningless_tokens.scoring import Seq, TeacherForcedArm, check_head

# How `make verify` compares this measure's outputs (meaningless_tokens/verify/kinds.py assembles KINDS from every
# measure's): (artifact kind of store.PATHS, key glob, kind of quantity of verify's TOLERANCES), first match wins
QUANTITIES = (
    ("likelihood", "contrasts/*p", "rank-p"),  # p, level_p, subject_p: Wilcoxon signed-rank
    ("likelihood", "contrasts/*improved", "count"),  # shares of problems with a difference above zero
    ("metrics/likelihood", "*.wilcoxon_p", "rank-p"),
    ("metrics/likelihood", "*.improved", "count"),
    ("plots/likelihood", "improved", "count"),
    ("likelihood", "arm/*", "loglik-arm"),
    ("likelihood", "showcase/*/arm/*", "loglik-arm"),  # a showcase problem's per-token log-probs under ARM
    ("likelihood", "contrasts/arm-*", "loglik-arm"),
    ("likelihood", "*", "loglik"),
    ("plots/likelihood", "*", "loglik"),
    ("metrics/likelihood", "*", "loglik"),
    ("likelihood_links", "*", "loglik"),  # correlations and intervals of likelihood gains
)

# the kind QUANTITIES gives a contrast's paired differences (contrasts/<c>-none/*/diff): how far float noise moves
# them, from which their Wilcoxon p's and improved shares' noise follows
DIFF_KINDS = {"arm": "loglik-arm", "other": "loglik"}

CONTINUATIONS = ("solution", "answer")
# what each continuation's contrasts compare: the solution's mean log-prob per token (nats/token), the
# answer's summed log-prob (nats: log P(the whole answer))
OUTCOMES = {"solution": "mean", "answer": "sum"}
UNITS = {"solution": "nats/token", "answer": "nats"}


def scoring_prompt(params: Params) -> Prompt:
    """params' prompt with likelihood.conditions as its conditions (the prompt builder builds those)."""
    return params.prompt.model_copy(update={"conditions": list(params.likelihood.conditions)})


def build_sequences(params: Params, name: str, builder, chosen: list[Problem], context: int | None) -> list[Seq]:
    """Every (problem, condition, continuation) sequence, alignment asserted, refusing one longer than the context."""
    conts = scoring.Continuations(params.likelihood, builder, dataset_spec(params.dataset, params.file).path)
    seqs = []
    for p in chosen:
        prompts = builder.build(p)
        seqs += conts.sequences(p, {c: prompts[c].input_ids for c in params.likelihood.conditions}, CONTINUATIONS)
    scoring.check_alignment(seqs)
    if context:
        for s in seqs:
            if len(s.input_ids) > context:
                key = "likelihood.solution_tokens" if s.continuation == "solution" else "likelihood.answer_frame"
                raise BadParam(
                    f"{key}: problem {s.index} ({s.condition}): the prompt ({s.prompt_len} tokens) plus "
                    f"the {s.continuation} ({len(s.input_ids) - s.prompt_len} tokens) exceed the context of model "
                    f"'{name}' ({context} positions)")
    return seqs


def summarize(per: dict, conditions: list[str], chosen: list[Problem], seed: int, n_boot: int) -> dict:
    """{(contrast, continuation): {"diff", "all", "level": (keys, stats), "subject": (keys, stats)}}."""
    out = {}
    levels, subjects = [p.level for p in chosen], [p.subject for p in chosen]
    for c in conditions:
        if c == "none":
            continue
        for k in CONTINUATIONS:
            m = OUTCOMES[k]
            diff = per[(c, k)][m] - per[("none", k)][m]
            kind = DIFF_KINDS["arm" if c == "arm" else "other"]
            out[(f"{c}-none", k)] = {"diff": diff, "all": paired_stats(diff, seed, n_boot, kind),
                                     "level": groups(levels, diff, seed, n_boot, kind),
                                     "subject": groups(subjects, diff, seed, n_boot, kind)}
    return out


@dataclass
class Scored:
    """What the stage measured on one model: every sequence's per-token log-probs and how they were computed."""
    seqs: list[Seq]
    logprobs: list[np.ndarray]
    per: dict                # (condition, continuation) -> sum, mean, tokens, prompt_tokens per problem
    scoring: dict            # the scoring's settings and checks, for the provenance
    arm_settings: object     # arm.Settings, or None when `arm` is not among the conditions
    builder: object          # the PromptBuilder (its description goes into the provenance)
    manifest: dict           # the prepared model's
    seconds: float           # the scoring alone

    def at(self, problem: Problem, condition: str, continuation: str) -> int:
        """The index in `seqs` and `logprobs` of one (problem, condition, continuation)."""
        return self.index[(problem.index, condition, continuation)]

    @cached_property
    def index(self) -> dict:
        return {(s.index, s.condition, s.continuation): k for k, s in enumerate(self.seqs)}


def measure(params: Params, setup: models.ModelSetup, chosen: list[Problem]) -> Scored:
    """Every (problem, condition, continuation) sequence built, checked against the context and scored."""
    cfg, name = params.likelihood, setup.name
    arm_settings = arm.hook_settings(params.arm, params.dataset.benchmark, setup, cfg.conditions)
    engine = open_scorer(setup)
    builder = builder_for(scoring_prompt(params), setup, engine.tokenizer)
    seqs = build_sequences(params, name, builder, chosen, setup.prepared.facts["max_position_embeddings"])
    pad = engine.pad
    head_check = check_head(engine.model, min(seqs, key=lambda s: len(s.input_ids)), pad)
    with engine, hooks.Hooks() as h:
        hook = (h.arm(TeacherForcedArm(arm.layer0_mlp(engine.model, setup, "likelihood.conditions"), arm_settings))
                if arm_settings else None)
        logprobs, how, seconds = engine.loglikelihood(seqs, cfg.batch_tokens, hook, shown=True,
                                                      desc=f"likelihood {name}", name=name)
    conts = scoring.Continuations(params.likelihood, builder, dataset_spec(params.dataset, params.file).path)
    how = {"attn_implementation": engine.attn, "batch_tokens": cfg.batch_tokens, "pad_token_id": pad, **how,
           "head_check_max_abs_diff": head_check, "separator_ids": conts.sep, "frame_head_ids": conts.head,
           "frame_tail": conts.tail}
    m = Scored(seqs, logprobs, {}, how, arm_settings, builder, setup.prepared.manifest(), seconds)
    for c in cfg.conditions:
        for k in CONTINUATIONS:
            lps = [logprobs[m.at(p, c, k)] for p in chosen]
            m.per[(c, k)] = {"sum": np.array([x.sum() for x in lps]), "mean": np.array([x.mean() for x in lps]),
                             "tokens": np.array([len(x) for x in lps], dtype=np.int32),
                             "prompt_tokens": np.array([seqs[m.at(p, c, k)].prompt_len for p in chosen],
                                                       dtype=np.int32)}
    return m


def metrics_summary(per: dict, summary: dict, conditions: list[str], n: int) -> dict:
    """The summary `dvc metrics show` and `dvc exp show` read: mean log-probs per condition, each contrast's paired
    statistics."""
    def r(x: float) -> float:
        return round(float(x), 6)

    out = {"n_problems": n, "outcomes": {k: f"{OUTCOMES[k]} log-prob ({UNITS[k]})" for k in CONTINUATIONS},
           "logprob": {c: {k: r(per[(c, k)][OUTCOMES[k]].mean()) for k in CONTINUATIONS} for c in conditions},
           "scored_tokens_mean": {k: r(per[("none", k)]["tokens"].mean()) for k in CONTINUATIONS},
           "contrasts": {}}
    for (contrast, k), res in summary.items():
        a = res["all"]
        out["contrasts"].setdefault(contrast, {})[k] = {
            "delta": r(a["mean"]), "ci95": [r(x) for x in a["ci"]], "ci95_width": r(a["ci"][1] - a["ci"][0]),
            "wilcoxon_p": r(a["p"]), "wilcoxon_p_noise": r(a["p_noise"]), "improved": r(a["improved"]),
            "improved_noise": r(a["improved_noise"])}
    return out


def table(summary: dict) -> tuple[list[str], list[list]]:
    """The columns and one row per contrast and outcome, fixed columns, for dvc.yaml's `plots`."""
    rows = []
    for (contrast, k), res in summary.items():
        a = res["all"]
        rows.append([contrast, k, f"{contrast} / {k} ({UNITS[k]})", f"{a['mean']:.6g}", f"{a['ci'][0]:.6g}",
                     f"{a['ci'][1]:.6g}", f"{a['improved']:.6g}", a["n"], f"{a['improved_noise']:.6g}"])
    return ["contrast", "continuation", "label", "delta", "low", "high", "improved", "n", "improved_noise"], rows
