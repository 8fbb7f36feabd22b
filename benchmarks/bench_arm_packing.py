"""Benchmark: the likelihood stage's `arm` sequences packed into one token tree per problem vs scored whole.

    python benchmarks/bench_arm_packing.py --model qwen2_5-coder-0_5b --n 20 --reps 2

Builds the stage's `arm` sequences (the none prompt with the solution and with the answer continuation:
likelihood.build_sequences) for the first `--n` problems of the `likelihood.n_samples` subset and scores
them with the stage's ARM hook (scoring.TeacherForcedArm, the model's own setting) through the scoring engine's
`loglikelihood` two ways, alternated over `--reps` repetitions in one process: `packed` (scoring.score_packed: the
prompt once per problem, edited as step 0, each later node as the decode step of its depth: what the stage runs) and
`whole` (scoring.score: each sequence whole). Prints seconds (the best repetition), tokens computed, the max abs difference of the summed log-probs
(the packed tolerance bounds it) and, last, the ratio of the whole time to the packed time.
"""

from __future__ import annotations

import argparse
import time

import common


def main() -> None:
    import numpy as np
    import torch

    from meaningless_tokens import arm, hooks, models, scoring, store
    from meaningless_tokens.dataset import dataset_spec, load_problems, select_problems
    from meaningless_tokens.measures import likelihood
    from meaningless_tokens.engines import open_scorer
    from meaningless_tokens.prompts import builder_for

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2_5-coder-0_5b")
    ap.add_argument("--n", type=int, default=20, help="problems (the first of the likelihood subset)")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    full = common.load_params()
    params = store.params_view(full, "likelihood", args.model)
    params = params.model_copy(update={"likelihood": params.likelihood.model_copy(update={"conditions": ["none", "arm"]})})
    chosen = select_problems(load_problems(dataset_spec(params.dataset, params.file))[0], params.likelihood.n_samples,
                             params.likelihood.seed)[:args.n]
    setup = models.setup_for(full, args.model)
    engine = open_scorer(setup)
    model = engine.model
    builder = builder_for(likelihood.scoring_prompt(params), setup, engine.tokenizer)
    seqs = [s for s in likelihood.build_sequences(params, args.model, builder, chosen, None) if s.condition == "arm"]
    hook = hooks.Hooks().arm(scoring.TeacherForcedArm(arm.layer0_mlp(model, setup, "likelihood.conditions"),
                                                      arm.settings_for(params.arm, params.dataset.benchmark, setup)))
    print(common.machine(torch.get_num_threads()))
    load = common.OtherLoad()
    arms = ("packed", "whole")
    best, sums = {k: float("inf") for k in arms}, {}
    for rep in range(args.reps):
        for k in (list(arms) if rep % 2 == 0 else list(arms)[::-1]):
            t = time.perf_counter()
            out = engine.loglikelihood(seqs, params.likelihood.batch_tokens, hook, method=k).logprobs
            best[k] = min(best[k], time.perf_counter() - t)
            sums[k] = np.array([x.sum() for x in out])
    tokens = {"packed": sum(len(scoring.pack([s for s in seqs if s.index == p.index]).ids) for p in chosen),
              "whole": sum(len(s.input_ids) for s in seqs)}
    print(f"\n{args.model}, {len(chosen)} problems, {len(seqs)} arm sequences, {args.reps} repetitions; {load}\n")
    print("| arm | seconds (best) | tokens computed | max abs diff of sums vs packed (nats) |")
    print("|---|---|---|---|")
    for k in arms:
        print(f"| {k} | {best[k]:.1f} | {tokens[k]} | {float(np.abs(sums[k] - sums['packed']).max()):.1g} |")
    print(f"\nratio: packed arm scoring is {best['whole'] / best['packed']:.2f}x as fast as whole")


if __name__ == "__main__":
    main()
