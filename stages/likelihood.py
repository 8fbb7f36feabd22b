"""likelihood@<model>: teacher-forced log-probabilities of the reference solution and of the gold answer under each
condition, and their paired differences to `none` (DEFINITIONS: the sequences, the scoring and each output).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, cli, store
from meaningless_tokens.config import Params
from meaningless_tokens.dataset import Problem, dataset_spec, load_problems, put_problems, require_field, select_problems
from meaningless_tokens.errors import BadParam, names_the_file
from meaningless_tokens.stage import header, stage_context
from meaningless_tokens.store import put, put_json_attr, write_csv_atomic, write_h5, write_metrics, write_timing
from meaningless_tokens.measures.likelihood import (CONTINUATIONS, OUTCOMES, UNITS, Scored, measure, metrics_summary,
                                               summarize, table)

# what the artifact's `definitions` attribute says, and `--help`: a constant, not the docstring, so that an edit of the
# docstring leaves the attribute as it is (the file's code hash, in provenance, still changes: the stage reruns)
DEFINITIONS = """likelihood@<model>: teacher-forced log-probabilities of the reference solution and of the gold answer.

A paired, continuous outcome that needs one forward pass per (problem, condition) and no generation. For each
problem of the subset (likelihood.n_samples, likelihood.seed: seeded and stratified by level as extraction is,
so equal seeds give nested subsets) and each condition of likelihood.conditions, two continuations are appended
to that condition's prompt and scored token by token:

  solution   the reference solution (MATH-500 `solution`), its first likelihood.solution_tokens tokens
  answer     likelihood.answer_frame with <answer> replaced by the gold answer (`answer`): the text before
             <answer> is context, the answer and the rest of the frame are scored, i.e.
             log P(answer + "}$." | prompt + "The final answer is $\\boxed{")

Layout: prompt + context + scored. The context is likelihood.separator (raw template; the chat template's
assistant turn separates by itself) plus, for `answer`, the frame's head. Every part is tokenized as a
separate segment, as the prompt's parts are, so the scored token ids are the same in every condition
(asserted: `check_alignment`).

`arm` is the none prompt with the paper's ARM on layer 0's act_fn (meaningless_tokens/arm/redistribution.py's edit), in the same forward
pass. Teacher forcing is a prefill of prompt + continuation; ARM is applied as generation would have applied
it, had the model generated exactly these tokens: the prompt's positions are edited together as step 0 (one
pool, the draws seeded by (arm.seed, problem index, 0)), and with arm.apply: all each continuation position j
is edited alone as decode step j + 1 (its own channels, seeded by (arm.seed, problem index, j + 1)), which is
what the hook does at each decode step; with arm.apply: prefill only the prompt's positions are edited. The
statistics are each sequence's own (arm.pool: row); batch pooling has no counterpart in scoring one sequence.

The whole model runs (no early exit); the LM head runs only at the positions that predict a scored token, over
slices of the vocabulary (never a [T, vocab] tensor for the whole prompt). Each problem's sequences are packed
into one row (scoring.score_packed): a token tree in which every shared prefix appears once (the prompt for both
continuations, the instruction for every condition), each token attending to its ancestors only (within the
sliding window, counted in positions, on sliding layers) at its own position in its sequences; rows are batched
by length up to likelihood.batch_tokens padded tokens; a problem's `arm` sequences are a tree of their own (their
prompt's hidden states differ from none's from layer 0 on), its prompt edited as step 0 and each later node as the
decode step of its depth. The log-probs are those of each sequence scored whole within float rounding; the stage
checks that on one problem first, its arm rows included: the tree mask exactly, in any dtype (scoring.check_mask:
a branch that no scored token may see, its tokens replaced, moves no log-prob by a single bit), and in float32 the
sums against whole-sequence scoring within scoring.PACKED_TOLERANCE (scoring.check_packed: the positions too; in
bfloat16 the two differ by rounding alone, recorded as packed_check_max_abs_diff). Where a check fails, every
sequence is scored whole (scoring.score) and the provenance's scoring.why names the check.

Outputs:
  artifacts/likelihood/<model>.h5    per condition and continuation: sum, mean (nats/token) and tokens per
                                     problem; per contrast (c - none): the paired statistics below; per-token
                                     log-probs of the first likelihood.showcase problems
  metrics/likelihood/<model>.json    the summary `dvc metrics show` and `dvc exp show` read
  artifacts/plots/likelihood/<model>.csv   one row per contrast and outcome, for `dvc plots`
  metrics/timing/likelihood-<model>.json   the run's sidecar (seconds, tokens per second)

Paired statistics of each contrast c - none, for the OUTCOMES (solution: mean log-prob per token; answer: the
answer's summed log-prob): mean difference with a seeded bootstrap 95 % interval, two-sided Wilcoxon
signed-rank p, the share of problems that improved, and the same per MATH level and per subject.
Beside each p and share, how far float noise can move it (`p_noise`, `improved_noise`: every difference moved
within its tolerance, meaningless_tokens/noise.py): the bound `make verify` compares it with.

An interrupted run restarts from the beginning (the outputs are written only at the end, atomically).
"""

# the stage's outputs: role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "likelihood", "metrics": "metrics/likelihood", "table": "plots/likelihood", "timing": "timing/likelihood"}


def _put_stats(g, prefix: str, stats: list[dict]) -> None:
    put(g, f"{prefix}n", np.array([s["n"] for s in stats], dtype=np.int32))
    put(g, f"{prefix}mean", np.array([s["mean"] for s in stats]))
    put(g, f"{prefix}ci", np.array([s["ci"] for s in stats]), shape="[group, low/high]")
    put(g, f"{prefix}p", np.array([s["p"] for s in stats]), note="two-sided Wilcoxon signed-rank")
    put(g, f"{prefix}improved", np.array([s["improved"] for s in stats]), note="share of problems with diff > 0")
    put(g, f"{prefix}p_noise", np.array([s["p_noise"] for s in stats]),
        note="how far float noise can move p (meaningless_tokens/noise.py)")
    put(g, f"{prefix}improved_noise", np.array([s["improved_noise"] for s in stats]),
        note="how far float noise can move improved: the share of differences within their tolerance of zero")


@names_the_file
def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "likelihood", name, root, **OUTPUTS)
    params, where = ctx.params, ctx.where
    cfg = params.likelihood
    spec = dataset_spec(params.dataset, params.file)
    problems, data_sha = load_problems(spec)
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "likelihood.n_samples")
    require_field(spec, chosen, "solution", "the likelihood stage (its `solution` continuation)")
    if name not in params.scored:
        raise BadParam(f"likelihood.models: model '{name}' is not among the models scored "
                       f"{params.scored}; add it there to score it")
    m = measure(params, ctx.setup(), chosen)
    summary = summarize(m.per, list(cfg.conditions), chosen, cfg.seed, cfg.n_boot)

    write_artifact(where["out"], params, name, chosen, m, summary, data_sha)
    write_metrics(where["metrics"], metrics_summary(m.per, summary, list(cfg.conditions), len(chosen)))
    write_csv_atomic(where["table"], *table(summary))
    tokens = sum(len(s.input_ids) for s in m.seqs)
    write_timing(where["timing"], {"seconds": ctx.seconds(),
                                   "scoring_seconds": round(m.seconds, 2), "sequences": len(m.seqs), "tokens": tokens,
                                   "tokens_per_second": round(tokens / m.seconds, 1) if m.seconds else None})
    gains = ", ".join(f"{c}: {r['all']['mean']:+.4f}" for (c, k), r in summary.items() if k == "solution")
    print(f"{name}: likelihood of {len(chosen)} problems x {len(cfg.conditions)} conditions x 2 continuations in "
          f"{m.seconds:.1f} s; solution nats/token vs none {gains} -> {where['out']}")
    return where["out"]


def write_artifact(out: Path, params: Params, name: str, chosen: list[Problem], m: Scored, summary: dict,
                   data_sha: str) -> None:
    """artifacts/likelihood/<model>.h5: per condition and continuation, per contrast, the showcase, provenance."""
    import h5py

    cfg, conditions = params.likelihood, list(params.likelihood.conditions)
    prov = {
        **store.model_provenance("likelihood", params, name, m.manifest, unused=() if m.arm_settings else ("arm",)),
        **m.builder.describe(),
        "scoring": m.scoring,
        **({"arm": {**m.arm_settings.describe(), "teacher_forcing": "prompt = step 0 (one pool); continuation "
                    "position j = decode step j + 1 (its own channels) when apply is all; per-sequence statistics",
                    "differences_from_paper": arm.DIFFERENCES}} if m.arm_settings else {}),
        "dataset_sha256": data_sha,
    }
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, conditions=conditions, continuations=list(CONTINUATIONS), n_samples=len(chosen),
               definitions=DEFINITIONS)
        put_json_attr(f, "outcomes", {k: f"{OUTCOMES[k]} ({UNITS[k]})" for k in CONTINUATIONS})
        put_json_attr(f, "provenance", prov)
        put_problems(f, chosen)
        for c in conditions:
            for k in CONTINUATIONS:
                g = f.require_group(f"{c}/{k}")
                put(g, "sum", m.per[(c, k)]["sum"], note="summed log-prob of the scored tokens, nats")
                put(g, "mean", m.per[(c, k)]["mean"], note="mean log-prob per scored token, nats/token")
                put(g, "tokens", m.per[(c, k)]["tokens"])
                put(g, "prompt_tokens", m.per[(c, k)]["prompt_tokens"])
        for (contrast, k), r in summary.items():
            g = f.require_group(f"contrasts/{contrast}/{k}")
            g.attrs["outcome"] = f"{OUTCOMES[k]} ({UNITS[k]})"
            put(g, "diff", r["diff"], shape="[problem]")
            _put_stats(g, "", [r["all"]])
            for by in ("level", "subject"):
                keys, stats = r[by]
                dtype = np.int8 if by == "level" else (object if keys else h5py.string_dtype())  # none: no such field
                put(g, f"{by}s", np.array(keys, dtype=dtype), compress=False)
                _put_stats(g, f"{by}_", stats)
        sc = f.create_group("showcase")
        for p in chosen[:cfg.showcase]:
            for c in conditions:
                for k in CONTINUATIONS:
                    i = m.at(p, c, k)
                    g = sc.require_group(f"{p.index:03d}/{c}/{k}")
                    put(g, "token_ids", np.array(m.seqs[i].scored, dtype=np.int32))
                    put(g, "logprob", m.logprobs[i].astype(np.float32))


def main(argv: list[str] | None = None) -> int:
    return cli.main("likelihood", DEFINITIONS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
