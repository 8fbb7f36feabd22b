"""Benchmark 2: batched greedy generation vs one prompt at a time (what the paper's code does).

    python benchmarks/bench_generation.py [--model smollm2-135m] [--n N] [--max-new-tokens T]
                                          [--compare-batch 12] [--reps 1] [--threads 2]

The workload is the evaluate stage's for one model: the evaluation subset (`evaluate.n_samples`
problems, or --n) under every condition, prompts built by the project's prompt builder. Both arms
call meaningless_tokens.engines.generate with the evaluate settings of params.yaml (greedy, SDPA, static KV
cache, stop at eos or a complete \\boxed{}): arm `one at a time` with batches of one prompt, arm
`batched` with meaningless_tokens.engines.make_batches at `evaluate.batch_size` (the default batch size).
--compare-batch adds an arm at another batch size. Tokens are the generated tokens each row keeps
(up to its end-of-text token).

One process, one model load, a short warm-up. With --reps > 1 the arms alternate (A B, B A, ...) and
the best repetition counts. Graded results (meaningless_tokens.grading.grade(...).correct) and output texts are
compared between arms.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=None, help="problems (default: evaluate.n_samples)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: evaluate.max_new_tokens")
    ap.add_argument("--compare-batch", type=int, default=None, help="an extra batched arm at this batch size")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of each arm (the best counts)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    import torch

    from meaningless_tokens import models
    from meaningless_tokens.dataset import dataset_spec, load_problems, select_problems
    from meaningless_tokens.engines import ATTENTION, Item, generate, make_batches, stop_ids
    from meaningless_tokens.grading import grade
    from meaningless_tokens.prompts import builder_for

    params = common.load_params()
    cfg = params.evaluate
    n = args.n or cfg.n_samples
    max_new = args.max_new_tokens or cfg.max_new_tokens
    print(common.machine(args.threads))
    others = common.OtherLoad()
    started = time.perf_counter()
    setup = models.setup_for(params, args.model)
    model, tokenizer = models.load(setup, attn_implementation=ATTENTION)
    torch.set_num_threads(args.threads)
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_problems(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, n, cfg.seed)
    gold = {p.index: p.answer for p in chosen}
    built = {p.index: builder.build(p) for p in chosen}
    items = [Item(p.index, c, built[p.index][c].input_ids) for p in chosen for c in params.prompt.conditions]
    eos = stop_ids(model.generation_config, tokenizer)
    generate(model, tokenizer, items[:2], 4, cfg.stop_at_boxed, eos)  # warm-up

    outputs, runs = {}, {}  # arm -> {(index, condition): (text, n_tokens)}; arm -> seconds per repetition
    unstable = 0  # outputs that changed between repetitions (greedy decoding should repeat exactly)

    def timed(arm, batches):
        nonlocal unstable
        out, started = {}, time.perf_counter()
        for batch in batches:
            for it, (text, n_tokens, _) in zip(batch, generate(model, tokenizer, batch, max_new, cfg.stop_at_boxed, eos)):
                out[(it.index, it.condition)] = (text, n_tokens)
        runs.setdefault(arm, []).append(time.perf_counter() - started)
        unstable += sum(outputs[arm][k] != v for k, v in out.items()) if arm in outputs else 0
        outputs.setdefault(arm, out)
        print(f"  {arm}: {len(out)} prompts in {runs[arm][-1]:.1f} s", file=sys.stderr)

    one, batched = "one at a time", f"batched ({cfg.batch_size})"
    arms = [(one, [[it] for it in items]), (batched, make_batches(items, cfg.batch_size))]
    if args.compare_batch and args.compare_batch != cfg.batch_size:
        arms.append((f"batched ({args.compare_batch})", make_batches(items, args.compare_batch)))
    for rep in range(args.reps):
        for arm, batches in (arms if rep % 2 == 0 else arms[::-1]):  # A B, then B A
            timed(arm, batches)

    def graded(arm):
        prompt = lambda key: tokenizer.decode(list(built[key[0]][key[1]].input_ids), skip_special_tokens=True)  # noqa: E731
        return {key: grade(text, gold[key[0]], prompt(key)).correct for key, (text, _) in outputs[arm].items()}

    rate, rows = {}, []
    for arm, batches in arms:
        tokens = sum(n_tokens for _, n_tokens in outputs[arm].values())
        rate[arm] = tokens / min(runs[arm])
        rows.append([arm, len(outputs[arm]), max(map(len, batches)), tokens, f"{min(runs[arm]):.1f}",
                     " ".join(f"{s:.0f}" for s in runs[arm]), f"{rate[arm]:.1f}", sum(graded(arm).values())])
    print(f"model {args.model}, {len(chosen)} problems x {len(params.prompt.conditions)} conditions = {len(items)} prompts, "
          f"max_new_tokens {max_new}, stop_at_boxed {cfg.stop_at_boxed}; seconds: best of {args.reps} "
          f"repetition(s), arms alternated (A B, B A, ...)")
    common.table(["arm", "prompts", "batch", "tokens", "seconds", "all runs", "tokens/s", "correct"], rows)

    def differ(a, b):
        ga, gb = graded(a), graded(b)
        texts = sum(outputs[a][k][0] != outputs[b][k][0] for k in ga)
        return f"{a} vs {b}: {sum(ga[k] != gb[k] for k in ga)} of {len(ga)} graded results differ ({texts} output texts differ)"

    print(differ(batched, one) + (f"; {unstable} outputs changed between repetitions" if args.reps > 1 else ""))
    for arm, _ in arms[2:]:
        print(differ(batched, arm) + f"; batch {cfg.batch_size} has {rate[batched] / rate[arm]:.2f}x the tokens/s of {arm}")
    print(f"total {time.perf_counter() - started:.0f} s; {others}")
    print(f"ratio: {rate[batched] / rate[one]:.1f}x the tokens/s of one at a time at batch {cfg.batch_size} (target >= 3x)")


if __name__ == "__main__":
    main()
