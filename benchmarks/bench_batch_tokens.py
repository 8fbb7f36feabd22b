"""Benchmark: the likelihood stage's packed scoring at several `likelihood.batch_tokens` budgets.

    python benchmarks/bench_batch_tokens.py --model qwen2_5-coder-0_5b --every 6 --sizes 4096,1024,2048,8192

Builds the stage's sequences (likelihood.build_sequences) for every `--every`-th problem of the
`likelihood.n_samples` subset, then scores them with the scoring engine's `loglikelihood(method="packed")`
(scoring.score_packed) at each budget, the budgets alternated over `--reps` repetitions in one process (same model,
threads and trees). Prints seconds per budget (the median of the repetitions), the max abs difference of the
log-probs against the first budget (batch composition changes float rounding only), and as its last line the ratio
of the first budget's time to params.yaml's budget.
"""

from __future__ import annotations

import argparse
import statistics
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
    ap.add_argument("--every", type=int, default=6, help="score every k-th problem of the subset")
    ap.add_argument("--sizes", default="4096,1024,2048,8192", help="budgets; the first is the reference")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    full = common.load_params()
    params = store.params_view(full, "likelihood", args.model)
    sizes = [int(x) for x in args.sizes.split(",")]
    chosen = select_problems(load_problems(dataset_spec(params.dataset, params.file))[0], params.likelihood.n_samples,
                             params.likelihood.seed)[::args.every]
    setup = models.setup_for(full, args.model)
    engine = open_scorer(setup)
    model = engine.model
    builder = builder_for(likelihood.scoring_prompt(params), setup, engine.tokenizer)
    seqs = likelihood.build_sequences(params, args.model, builder, chosen, setup.prepared.facts["max_position_embeddings"])
    hook = None  # likelihood.conditions' arm rows are scored with the stage's hook, as the stage does
    if "arm" in params.likelihood.conditions:
        settings = arm.settings_for(params.arm, params.dataset.benchmark, setup)
        hook = hooks.Hooks().arm(scoring.TeacherForcedArm(arm.layer0_mlp(model, setup, "likelihood.conditions"),
                                                          settings))  # for the process's life
    print(common.machine(torch.get_num_threads()))
    seconds = {b: [] for b in sizes}
    ref, diff = None, {}
    for _ in range(args.reps):
        for b in sizes:
            t = time.perf_counter()
            out = engine.loglikelihood(seqs, b, hook, method="packed").logprobs
            seconds[b].append(time.perf_counter() - t)
            ref = ref or out
            diff[b] = max(float(np.abs(x - y).max()) for x, y in zip(out, ref))
    trees = sum(len(pk.ids) for pk in (scoring.pack([s for s in seqs if s.index == p.index]) for p in chosen))
    print(f"\n{args.model}, {len(chosen)} problems, {len(seqs)} sequences, {trees} tree tokens, {args.reps} repetitions\n")
    print("| batch_tokens | seconds (median) | tree tokens/s | max abs diff vs first (nats) |")
    print("|---|---|---|---|")
    med = {b: statistics.median(v) for b, v in seconds.items()}
    for b in sizes:
        print(f"| {b} | {med[b]:.1f} | {trees / med[b]:.0f} | {diff[b]:.1g} |")
    ours = params.likelihood.batch_tokens
    if ours in med:
        print(f"\nratio: params' batch_tokens {ours} is {med[sizes[0]] / med[ours]:.2f}x as fast as {sizes[0]}")


if __name__ == "__main__":
    main()
