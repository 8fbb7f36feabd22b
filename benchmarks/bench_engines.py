"""Benchmark: the evaluate stage's two engines, transformers (static batches) vs vLLM, side by side.

    .venv-vllm/bin/python benchmarks/bench_engines.py [--models smollm2-135m ...] [--n N] [--max-new-tokens T]

Needs the vLLM environment (`make install-vllm`). The workload is the evaluate stage's for each model:
`evaluate.n_samples` problems (or --n) under every condition, prompts from the project's prompt builder,
the evaluate settings of params.yaml. Both arms are the stage's own engines (meaningless_tokens.engines.open_engine
with evaluate.engine transformers, then vllm) and run the same items through `engine.generate`, as
`meaningless_tokens.engines.run_journaled` does; the arms alternate per model (A B, B A, ...). Start: transformers
loads the model; vLLM starts its worker and engine (the model load included). Tokens are the generated
tokens each generation keeps (up to end-of-text or the closing of its first complete box). Graded
results and output texts are compared between the engines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None, help="default: every model of params.yaml")
    ap.add_argument("--n", type=int, default=None, help="problems (default: evaluate.n_samples)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: evaluate.max_new_tokens")
    args = ap.parse_args()

    from meaningless_tokens import models
    from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
    from meaningless_tokens.engines import vllm as vllm_backend
    from meaningless_tokens.engines import Item, make_batches, open_engine
    from meaningless_tokens.grading import grade
    from meaningless_tokens.prompts import builder_for

    if vllm_backend.installed() is None:
        sys.exit(f"error: vLLM is not installed in {sys.executable}; {vllm_backend.INSTALL_HINT}")
    base = common.load_params()
    updates = {"n_samples": args.n or base.evaluate.n_samples,
               "max_new_tokens": args.max_new_tokens or base.evaluate.max_new_tokens}
    with_engine = {e: base.model_copy(update={"evaluate": base.evaluate.model_copy(update={**updates, "engine": e})})
                   for e in ("transformers", "vllm")}
    cfg = with_engine["vllm"].evaluate
    names = args.models or list(base.models)
    print(f"{common.machine(os.cpu_count())}; {'=='.join(vllm_backend.installed())}")
    others = common.OtherLoad()
    problems, _ = load_math500(dataset_spec(base.dataset, base.file))
    chosen = select_problems(problems, cfg.n_samples, cfg.seed)
    gold = {p.index: p.answer for p in chosen}
    rows, ratios, compared = [], {}, []
    for k, name in enumerate(names):
        setup = models.setup_for(base, name)
        result = {}
        for engine_name in (("transformers", "vllm") if k % 2 == 0 else ("vllm", "transformers")):
            params = with_engine[engine_name]
            t0 = time.perf_counter()
            engine = open_engine(params.evaluate, params.prompt.conditions, setup)
            loaded = time.perf_counter() - t0
            builder = builder_for(params.prompt, setup, engine.tokenizer)
            items = [Item(p.index, c, builder.build(p)[c].input_ids) for p in chosen for c in params.prompt.conditions]
            out, t1 = {}, time.perf_counter()
            for outs in engine.generate(make_batches(items, cfg.batch_size), set()):
                for it, text, n, _, _ in outs:
                    out[(it.index, it.condition)] = (text, n, it)
            total = time.perf_counter() - t1
            start = loaded + engine.stats.get("engine_start_seconds", 0.0)
            generating = total - engine.stats.get("engine_start_seconds", 0.0)
            tokens = sum(n for _, n, _ in out.values())
            correct = {key: grade(text, gold[key[0]], engine.tokenizer.decode(list(it.input_ids), skip_special_tokens=True)).correct
                       for key, (text, _, it) in out.items()}
            result[engine_name] = (out, correct, tokens / generating)
            rows.append([name, engine_name, len(out), tokens, f"{start:.1f}", f"{generating:.1f}",
                         f"{tokens / generating:.1f}", sum(correct.values())])
            print(f"  {name} {engine_name}: start {start:.1f} s, {len(out)} generations in {generating:.1f} s",
                  file=sys.stderr)
        (hf, hf_ok, hf_rate), (vl, vl_ok, vl_rate) = result["transformers"], result["vllm"]
        ratios[name] = vl_rate / hf_rate
        compared.append(f"{name}: {sum(hf_ok[key] != vl_ok[key] for key in hf_ok)} of {len(hf_ok)} graded results "
                        f"differ, {sum(hf[key][0] != vl[key][0] for key in hf)} output texts differ; "
                        f"vLLM {ratios[name]:.2f}x the tokens/s of transformers")
    print(f"{len(chosen)} problems x {len(base.prompt.conditions)} conditions per model, max_new_tokens "
          f"{cfg.max_new_tokens}, stop_at_boxed {cfg.stop_at_boxed}, transformers batch {cfg.batch_size}, "
          f"runtime.dtype {base.runtime.dtype}; start: model load (transformers) or worker + engine start (vLLM), "
          f"not in the tokens/s")
    common.table(["model", "engine", "generations", "tokens", "start s", "generation s", "tokens/s", "correct"], rows)
    for line in compared:
        print(line)
    print(f"{others}")
    print("ratio: vLLM / transformers tokens/s " + ", ".join(f"{m} {r:.2f}x" for m, r in ratios.items()))


if __name__ == "__main__":
    main()
