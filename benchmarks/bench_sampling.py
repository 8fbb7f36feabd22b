"""Benchmark: sampled decoding's draw, the batched device sampler vs a NumPy draw per row, in one run.

    python benchmarks/bench_sampling.py [--batch 16] [--vocab 151936] [--steps 8] [--model qwen2_5-coder-0_5b]
                                        [--n 8] [--max-new-tokens 32] [--reps 2] [--threads 2]
                                        [--temperature T --top-p P --top-k K]

Part 1, the draw alone, on the same logits: random [batch, vocab] float32 rows (normal, times 4: a few tokens
hold most of the mass, as a model's do) at Qwen2.5's vocabulary size, `--steps` decode steps. Arm `numpy`: a
logits processor that copies the logits to the host and draws row by row with NumPy (a PCG64 generator per row,
`sampling.sample_token`); arm `device`: `sampling.RowSampler` (the hashed uniforms and `sampling.draw` batched on
the logits' device). Each setting of (temperature, top-p, top-k) is timed in both arms, alternated.

Part 2, generation: the same prompts through `engines.generate` (evaluate's batched generation), greedy rows vs
sampled rows with each of the two samplers; fixed length (no early stops), so every arm runs the same decode steps
and tokens/s compares the cost of a step. The sampling settings are the model's as the evaluate stage resolves
them (`sampling.settings_for`) unless given. The ratio line: sampled (device) tokens/s over greedy tokens/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import common

# (temperature, top_p, top_k): transformers' defaults; Qwen2.5-Instruct's generation_config; Llama-3.1-Instruct's
# (top_k: transformers' default); top-p without top-k (the draw then sorts the whole vocabulary)
SETTINGS = ((1.0, 1.0, 50), (0.7, 0.8, 20), (0.6, 0.9, 50), (1.0, 0.95, 0))


class NumpyRowSampler:
    """The naive way: the whole [batch, vocab] logits copied to the host at every step, one NumPy draw per row."""

    def __init__(self, seeds, temperature, top_p, top_k):
        import numpy as np

        self.rngs = [None if s is None else np.random.Generator(np.random.PCG64(np.random.SeedSequence(s)))
                     for s in seeds]
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def __call__(self, input_ids, scores):
        import torch

        from meaningless_tokens.sampling import sample_token

        rows = scores.detach().to("cpu", torch.float32).numpy()
        out = scores.clone()
        for r, rng in enumerate(self.rngs):
            if rng is None:
                continue
            tok = sample_token(rows[r], float(rng.random()), self.temperature, self.top_p, self.top_k)
            out[r] = float("-inf")
            out[r, tok] = 0.0
        return out


def time_draws(make, logits: list, reps: int) -> float:
    """Best-of-`reps` seconds per step of a fresh sampler over the steps' logits."""
    best = float("inf")
    for _ in range(reps):
        sampler = make()
        t0 = time.perf_counter()
        for scores in logits:
            sampler(None, scores)
        best = min(best, (time.perf_counter() - t0) / len(logits))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16, help="rows of part 1 (the GPU profile's evaluate.batch_size)")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default="qwen2_5-coder-0_5b", help="part 2's model (a vocabulary of 151,936)")
    ap.add_argument("--n", type=int, default=8, help="part 2's prompts (one batch)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each arm (the best counts)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--skip-generation", action="store_true", help="part 1 only")
    args = ap.parse_args()

    import torch

    from meaningless_tokens import models, sampling
    from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
    from meaningless_tokens.engines import ATTENTION, Item, generate, stop_ids
    from meaningless_tokens.prompts import builder_for

    params = common.load_params()
    torch.set_num_threads(args.threads)
    print(common.machine(args.threads))
    others = common.OtherLoad()
    started = time.perf_counter()

    # ---- part 1: the draw alone
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(args.batch, args.vocab, generator=gen) * 4 for _ in range(args.steps)]
    seeds = [sampling.sample_seed(0, r, "none", 0) for r in range(args.batch)]
    sampling.ON_HOST = ()  # arm `device`: the batched draw a GPU runs (the CPU's own path draws per row with NumPy)
    arms = {"numpy": NumpyRowSampler, "device": sampling.RowSampler}
    rows = []
    for temperature, top_p, top_k in SETTINGS:
        secs = {}
        for rep in range(args.reps):
            for name in (("numpy", "device") if rep % 2 == 0 else ("device", "numpy")):
                s = time_draws(lambda: arms[name](seeds, temperature, top_p, top_k), logits, 1)
                secs[name] = min(secs.get(name, s), s)
        rows.append([f"T {temperature}, top-p {top_p}, top-k {top_k}", f"{secs['numpy'] * 1e3:.1f}",
                     f"{secs['device'] * 1e3:.1f}", f"{secs['numpy'] / secs['device']:.2f}"])
    print(f"part 1: the draw, {args.batch} rows x {args.vocab} tokens (random float32 logits x 4), {args.steps} steps; "
          f"ms per step, best of {args.reps}, arms alternated")
    common.table(["setting", "numpy ms/step", "device ms/step", "numpy / device"], rows)
    draw_ratio = rows[0][3]

    if args.skip_generation:
        print(f"total {time.perf_counter() - started:.0f} s; {others}")
        print(f"ratio: the device draw is {draw_ratio}x as fast as the NumPy draw per step ({SETTINGS[0]})")
        return

    # ---- part 2: generation, greedy vs sampled
    cfg = params.evaluate
    setup = models.setup_for(params, args.model)
    model, tokenizer = models.load(setup, attn_implementation=ATTENTION)
    torch.set_num_threads(args.threads)
    s = sampling.settings_for(cfg, model.generation_config)
    temperature = args.temperature if args.temperature is not None else s["temperature"]
    top_p = args.top_p if args.top_p is not None else s["top_p"]
    top_k = args.top_k if args.top_k is not None else s["top_k"]
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, args.n, cfg.seed)
    ids = [builder.build(p)["none"].input_ids for p in chosen]
    eos = stop_ids(model.generation_config, tokenizer)
    never = [len(tokenizer) + model.config.get_text_config().vocab_size]  # no row ends early
    greedy = [Item(p.index, "none", t) for p, t in zip(chosen, ids)]
    sampled = [Item(p.index, "none", t, 0) for p, t in zip(chosen, ids)]
    keys = [sampling.sample_seed(s["seed"], it.index, it.condition, it.sample) for it in sampled]

    def run(arm: str):
        if arm == "greedy":
            return generate(model, tokenizer, greedy, args.max_new_tokens, False, never)
        maker = NumpyRowSampler if arm == "sampled numpy" else sampling.RowSampler
        return generate(model, tokenizer, sampled, args.max_new_tokens, False, never,
                        sampler=maker(keys, temperature, top_p, top_k))

    generate(model, tokenizer, greedy[:2], 4, False, eos)  # warm-up
    order = ("greedy", "sampled device", "sampled numpy")
    runs: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for arm in (order if rep % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            run(arm)
            runs.setdefault(arm, []).append(time.perf_counter() - t0)
            print(f"  {arm}: {runs[arm][-1]:.1f} s", file=sys.stderr)
    tokens = len(ids) * args.max_new_tokens
    rate = {a: tokens / min(runs[a]) for a in order}
    print(f"part 2: generation, model {args.model} (vocabulary {model.config.get_text_config().vocab_size}), "
          f"{len(ids)} none prompts in one batch, {args.max_new_tokens} new tokens each (no early stops); sampling "
          f"T {temperature}, top-p {top_p}, top-k {top_k}; seconds: best of {args.reps}, arms alternated")
    common.table(["arm", "tokens", "seconds", "all runs", "tokens/s"],
                 [[a, tokens, f"{min(runs[a]):.1f}", " ".join(f"{x:.1f}" for x in runs[a]), f"{rate[a]:.1f}"]
                  for a in order])
    print(f"total {time.perf_counter() - started:.0f} s; {others}")
    print(f"ratio: sampled generation (device draw) has {rate['sampled device'] / rate['greedy']:.3f}x the tokens/s "
          f"of greedy (NumPy draw: {rate['sampled numpy'] / rate['greedy']:.3f}x); the draw alone is {draw_ratio}x "
          f"as fast as the NumPy draw per step (part 1's first setting)")


if __name__ == "__main__":
    main()
