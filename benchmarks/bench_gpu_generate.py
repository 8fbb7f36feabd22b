"""Benchmark: the evaluate engine vs plain `model.generate` with its default dynamic cache (what
lm-evaluation-harness's HF backend calls), at the same batch, on the same prompts, in one process.

    python benchmarks/bench_gpu_generate.py [--model qwen2_5-math-1_5b] [--model-dir DIR | --tiny] [--work DIR]
        [--batch-size 64] [--new-tokens 128] [--batches 2] [--device cuda] [--dtype bfloat16]
        [--compile auto|on|off] [--threads N] [--json FILE]

The model: a folder holding one of the paper's models (--model-dir), else a random-weight model with its real
config built once into the work folder as `make gpu-check` builds it (benchmarks/gpu_check.py; the same folder:
a gpu-check's model is reused), tiny widths with --tiny. The params: profiles/gpu.yaml as gpu_check writes them.
The prompts: MATH-500 problems through the project's prompt builder under none, mless and mful, as the evaluate
stage makes them (`arm` is left out: its edit needs the project's hook, which a plain `generate` has not), cut into
the stage's batches (engines.make_batches); `--batches` batches of `--batch-size` rows. Greedy rows, then the
evaluate stage's sampled rows (evaluate.sampling: the engine's per-row seeded draws; `generate` draws with
do_sample and the same temperature, top-p and top-k).

Arm `engine`: engines.open_engine(...) (with evaluate's ARM hook, idle: no row is an arm row), fitted to the rows
(`.fit`: the batch size and, compiled, the plan's one shape; `measure(like=...)`: the evaluate stage's shape, as
gpu_check passes it, so that its compiled step is evaluate's) and `.generate(batches)`: the evaluate stage's engine with `--batch-size`, `--new-tokens` (the stop at
\\boxed{} off) and evaluate.compile (auto: on for CUDA; `--compile`). Arm `generate`: a second copy of the model
(the same loader) and `model.generate` on the same left-padded batch. Both keep the model's end-of-text ids; random weights never
write them, so every row runs to its limit (the table counts the rows that did). Each arm's first call on a
mode's first batch is its warm-up (compilation, CUDA graphs, allocator growth): its excess over that batch's
steady run is reported apart; then every batch once per arm, the arms alternated (A B, B A, ...). Steady
tokens/s: generated tokens over the steady runs' seconds. The outputs of both arms are compared row by row
(text and token count); greedy rows agree in float32 on the CPU, sampled rows draw differently by design.

The targets (the project's GPU plan: one H100 or H200, random weights, batch 64) are printed beside the measured
values, "not measured" where this run cannot measure them (the CPU, another batch size, tiny widths).
`measure(...)` returns the numbers as a dict (benchmarks/gpu_check.py adds them to gpu-check.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):  # loaded by path from gpu_check too, where neither need be on the path
    if _p not in sys.path:
        sys.path.append(_p)

from meaningless_tokens.config import yaml12  # noqa: E402 - YAML as DVC reads it (1.2: `on` a string)

if TYPE_CHECKING:
    from meaningless_tokens.engines import Engine, Item

PLAN_BATCH = 64  # the GPU plan's targets are at this batch size
# steady greedy tokens/s of the engine at batch 64 on one H100 or H200: model -> (width, (hidden size, layers), target)
TOKENS_PER_S = {"qwen2_5-math-1_5b": ("1.5B", (1536, 28), 10_000), "qwen2_5-math-7b": ("7B", (3584, 28), 5_000)}
WARMUP_SHARE = 0.10    # the engine's one-off warm-up under this share of a full evaluate stage of the GPU profile
SAMPLED_SHARE = 0.80   # sampled tokens/s at least this share of greedy tokens/s
PROBLEMS = 500         # a full evaluate stage: every MATH-500 problem


# ---- the two arms -------------------------------------------------------------------------------

def _left_padded(batch, pad: int):
    """(ids, mask) as the engine builds them: left padding, every prompt ends where generation starts."""
    import torch

    width = max(len(it.input_ids) for it in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, it in enumerate(batch):
        ids[r, width - len(it.input_ids):] = torch.tensor(it.input_ids)
        mask[r, width - len(it.input_ids):] = 1
    return ids, mask


def plain_generate(model, tokenizer, batch, new_tokens: int, eos: list[int], sampling: dict | None,
                   seed: int) -> tuple[list[tuple[str, int]], str]:
    """model.generate as lm-evaluation-harness's HF backend calls it (left padding, use_cache, no cache passed: the
    model's default, a dynamic cache): [(text, n_tokens)] cut at the first end-of-text, and the cache's class."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    ids, mask = _left_padded(batch, pad)
    if sampling:
        torch.manual_seed(seed)
        how = dict(do_sample=True, temperature=sampling["temperature"], top_p=sampling["top_p"],
                   top_k=sampling["top_k"])
    else:
        how = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             max_new_tokens=new_tokens, num_beams=1, eos_token_id=eos, pad_token_id=pad,
                             use_cache=True, return_dict_in_generate=True, **how)
    ends, rows = set(eos) | {pad}, []
    for row in out.sequences[:, ids.shape[1]:].tolist():
        n = next((k for k, t in enumerate(row) if t in ends), len(row))
        rows.append((tokenizer.decode(row[:n], skip_special_tokens=True), n))
    # `cache` in the transformers releases that renamed `past_key_values` (they warn on the old name)
    cache = out["cache"] if "cache" in out else out.get("past_key_values")
    return rows, type(cache).__name__


def engine_generate(engine: Engine, batch: list[Item]) -> list[tuple[str, int]]:
    """The engine's rows of one batch: [(text, n_tokens)]."""
    return [(text, n) for outs in engine.generate([batch], set()) for _, text, n, _, _ in outs]


# ---- the measurement ----------------------------------------------------------------------------

def bench_config(ev, batch_size: int, new_tokens: int, compile: str | None):
    """params' evaluate as the benchmark runs it, validated by the schema: the transformers engine, `batch_size`,
    `new_tokens` for greedy and sampled rows, no stop at \\boxed{}, at least one sample, `compile` where offered."""
    from meaningless_tokens.errors import ConfigError

    update = {"engine": "transformers", "batch_size": batch_size, "max_new_tokens": new_tokens, "stop_at_boxed": False,
              "sampling": {**ev.sampling.model_dump(), "n": max(ev.sampling.n, 1), "max_new_tokens": new_tokens}}
    if compile is not None:
        if "compile" not in type(ev).model_fields:
            raise ConfigError("--compile: this engine has no compile setting (evaluate.compile)")
        update["compile"] = compile
    return type(ev).model_validate({**ev.model_dump(), **update})


def gpu_profile_evaluate_tokens() -> tuple[int, int]:
    """(greedy, sampled) tokens a full evaluate stage of profiles/gpu.yaml generates when no row stops early."""
    gpu = yaml12.load((ROOT / "profiles" / "gpu.yaml").read_text())
    ev, rows = gpu["evaluate"], PROBLEMS * len(gpu["prompt"]["conditions"])
    s = ev["sampling"]
    return rows * ev["max_new_tokens"], rows * s["n"] * (s["max_new_tokens"] or ev["max_new_tokens"])


def measure(params, name: str, batch_size: int = PLAN_BATCH, new_tokens: int = 128, batches: int = 2,
            compile: str | None = None, log=None, like=None) -> dict:
    """Both arms on `batches` batches of `batch_size` rows, greedy then sampled (module docstring): a dict of
    what was measured, with the targets (`targets`). `like`: the evaluate stage's shape (generations.Shape), which the
    engine adopts, its prompts those that fit its width (both arms the same), so that in the process that ran
    evaluate its compiled step is evaluate's (engines.transformers: the shared model)."""
    import torch

    from meaningless_tokens import arm, engines, models, progress, sampling
    from meaningless_tokens.dataset import dataset_spec, load_problems, select_problems
    from meaningless_tokens.prompts import builder_for, check_context

    say = log or (lambda msg: print(msg, file=sys.stderr))
    if batch_size < 1 or new_tokens < 1 or batches < 1:
        raise ValueError(f"--batch-size {batch_size}, --new-tokens {new_tokens}, --batches {batches}: each must be >= 1")
    cfg = bench_config(params.evaluate, batch_size, new_tokens, compile)
    conditions = [c for c in params.prompt.conditions if c != "arm"]
    rows = batch_size * batches
    problems, _ = load_problems(dataset_spec(params.dataset, params.file))  # bad input before any model loads
    wanted = -(-rows // len(conditions))
    # with `like`, more problems than the rows need: those with a prompt longer than its width are left out
    chosen = select_problems(problems, wanted if like is None else min(4 * wanted, len(problems)), cfg.seed,
                             "--batch-size x --batches")
    setup = models.setup_for(params, name)
    cuda = setup.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    # opened as evaluate's is (its ARM hook where prompt.conditions holds arm: idle here, as no row is an arm row), so
    # that the process's shared compiled model is evaluate's (the hook is part of its key)
    arm_settings = arm.settings_for(params.arm, params.dataset.benchmark, setup) \
        if "arm" in params.prompt.conditions else None
    engine = engines.open_engine(cfg, conditions, setup, arm_settings=arm_settings, sampled=True)
    load_engine = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, tokenizer, _ = engines.load_for_generation(setup)
    load_plain = time.perf_counter() - t0
    draw = sampling.settings_for(cfg, model.generation_config)

    builder = builder_for(params.prompt, setup, engine.tokenizer)
    built = {p.index: builder.build(p) for p in chosen}
    fits = (lambda ids: True) if like is None else (lambda ids: len(ids) <= like.width)
    greedy = [engines.Item(p.index, c, built[p.index][c].input_ids) for p in chosen for c in conditions
              if fits(built[p.index][c].input_ids)][:rows]
    sampled = [engines.Item(p.index, c, built[p.index][c].input_ids, j) for p in chosen for c in conditions
               for j in range(cfg.sampling.n) if fits(built[p.index][c].input_ids)][:rows]
    longest = max(len(it.input_ids) for it in greedy)
    check_context(setup, "--new-tokens", f"a prompt of {longest} tokens plus {new_tokens} new tokens",
                  longest + new_tokens)
    # the plan's batch size and, compiled, its one shape, from every row as the evaluate stage fits them
    batch_size = engine.fit([(greedy, new_tokens), (sampled, new_tokens)], like=like)
    work = {"greedy": engines.make_batches(greedy, batch_size), "sampled": engines.make_batches(sampled, batch_size)}

    with torch.no_grad():  # process start-up (kernels, handles) before any arm is timed
        model(input_ids=torch.tensor([greedy[0].input_ids[:4]], device=model.device))
    sync()
    cache_class = None

    def timed(arm: str, mode: str, batch, k: int):
        nonlocal cache_class
        progress.check()  # a harness's deadline (gpu_check's part limit), between two batches
        gc.collect()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        sync()
        t0 = time.perf_counter()
        if arm == "engine":
            out = engine_generate(engine, batch)
        else:
            out, cache_class = plain_generate(model, tokenizer, batch, new_tokens, engine.eos,
                                              draw if mode == "sampled" else None, cfg.sampling.seed + k)
        sync()
        seconds = time.perf_counter() - t0
        extra = (torch.cuda.max_memory_allocated() - before) / 2**30 if cuda else None
        return seconds, out, extra

    arms = ("engine", "generate")
    result = {"model": name, "device": setup.device, "dtype": setup.dtype,
              "hidden_size": int(model.config.get_text_config().hidden_size),
              "layers": int(model.config.get_text_config().num_hidden_layers),
              "batch_size": batch_size, "new_tokens": new_tokens, "batches": batches, "conditions": conditions,
              "shape": engine.stats.get("shape"), "like": None if like is None else vars(like),
              "compile": getattr(cfg, "compile", None), "engine_settings": engine.settings,
              "sampling": {k: draw[k] for k in ("n", "temperature", "top_p", "top_k")},
              "load_s": {"engine": round(load_engine, 2), "generate": round(load_plain, 2)}, "modes": {}}
    for mode, mode_batches in work.items():
        first, steady, outs, extra = {}, {a: [] for a in arms}, {a: [] for a in arms}, {a: [] for a in arms}
        for a in arms:  # the warm-up: each arm's first call on this mode's first batch
            first[a], _, mem = timed(a, mode, mode_batches[0], 0)
            extra[a].append(mem)
            say(f"  {name} {mode} {a}: warm-up batch {first[a]:.2f} s")
        for k, batch in enumerate(mode_batches):
            for a in (arms if k % 2 == 0 else arms[::-1]):
                secs, out, mem = timed(a, mode, batch, k)
                steady[a].append(secs)
                outs[a].extend(out)
                extra[a].append(mem)
            say(f"  {name} {mode} batch {k + 1}/{len(mode_batches)}: "
                + ", ".join(f"{a} {steady[a][-1]:.2f} s" for a in arms))
        m = {}
        for a in arms:
            tokens, seconds = sum(n for _, n in outs[a]), sum(steady[a])
            m[a] = {"rows": len(outs[a]), "rows_at_limit": sum(n == new_tokens for _, n in outs[a]), "tokens": tokens,
                    "steady_s": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
                    "first_batch_s": round(first[a], 3), "warmup_s": round(first[a] - steady[a][0], 3),
                    "extra_cuda_gib": round(max(extra[a]), 3) if cuda else None}
        m["ratio"] = (round(m["engine"]["tokens_per_s"] / m["generate"]["tokens_per_s"], 3)
                      if m["engine"]["tokens_per_s"] and m["generate"]["tokens_per_s"] else None)
        m["rows_differ"] = sum(x != y for x, y in zip(outs["engine"], outs["generate"]))
        m["rows_compared"] = len(outs["engine"])
        result["modes"][mode] = m
    result["generate_cache"] = cache_class
    result["engine_warmup_s"] = engine.stats.get("warmup_seconds")  # the engine's own warm-up call, where it makes one
    g, s = result["modes"]["greedy"]["engine"], result["modes"]["sampled"]["engine"]
    result["sampled_over_greedy"] = (round(s["tokens_per_s"] / g["tokens_per_s"], 3)
                                     if s["tokens_per_s"] and g["tokens_per_s"] else None)
    greedy_tokens, sampled_tokens = gpu_profile_evaluate_tokens()
    if g["tokens_per_s"] and s["tokens_per_s"]:
        stage = greedy_tokens / g["tokens_per_s"] + sampled_tokens / s["tokens_per_s"]
        warmup = max(g["warmup_s"], 0) + max(s["warmup_s"], 0)
        result["full_evaluate_s"] = round(stage, 1)  # the GPU profile's stage at these steady rates
        result["warmup_share"] = float(f"{warmup / stage:.3g}")
    else:
        result["full_evaluate_s"] = result["warmup_share"] = None
    result["targets"] = targets(result)
    del engine, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


# ---- targets and output ---------------------------------------------------------------------------

def _unmeasurable(result: dict) -> str | None:
    """Why this run cannot judge the GPU plan's targets, or None when it can."""
    if not result["device"].startswith("cuda"):
        return "not measured (CPU run: the targets are a GPU's)"
    if result["batch_size"] != PLAN_BATCH:
        return f"not measured (batch {result['batch_size']}; the targets are at batch {PLAN_BATCH})"
    return None


def verdict(value: float | None, ok, why: str | None) -> str:
    if why:
        return why
    if value is None or not math.isfinite(value):
        return "not measured (no value)"
    return "met" if ok(value) else "not met"


def targets(result: dict) -> list[dict]:
    """The GPU plan's targets for this model's run: [{target, measured, status}]."""
    why = _unmeasurable(result)
    g = result["modes"]["greedy"]["engine"]["tokens_per_s"]
    rows = []
    if result["model"] in TOKENS_PER_S:
        label, (hidden, layers), want = TOKENS_PER_S[result["model"]]
        real = (result["hidden_size"], result["layers"]) == (hidden, layers)
        rows.append({"target": f"steady greedy tokens/s at the {label} width, batch {PLAN_BATCH}: >= {want:,}",
                     "measured": g, "status": verdict(g, lambda v: v >= want, why or (
                         None if real else f"not measured (hidden size {result['hidden_size']}, {result['layers']} "
                                           f"layers: not the {label} width)"))})
    else:
        rows.append({"target": f"steady greedy tokens/s, batch {PLAN_BATCH}", "measured": g,
                     "status": "no target for this model (the plan sets them at the 1.5B and 7B widths)"})
    share = result["warmup_share"]
    rows.append({"target": f"engine warm-up < {WARMUP_SHARE:.0%} of a full evaluate stage of the GPU profile "
                           f"(projected at these steady rates: {_fmt(result['full_evaluate_s'])} s)",
                 "measured": share, "status": verdict(share, lambda v: v < WARMUP_SHARE, why)})
    ratio = result["sampled_over_greedy"]
    rows.append({"target": f"sampled tokens/s >= {SAMPLED_SHARE:.0%} of greedy (engine)", "measured": ratio,
                 "status": verdict(ratio, lambda v: v >= SAMPLED_SHARE, why)})
    return rows


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _compiled(result: dict) -> str:
    how = result["engine_settings"].get("compile")
    if not isinstance(how, dict):
        return "n/a (the engine has no setting)"
    if not how.get("on"):
        return f"{how.get('setting')} (off)"
    return f"{how.get('setting')} (on; the engine's own warm-up call {_fmt(result.get('engine_warmup_s'), 2)} s)"


def report(result: dict) -> list[str]:
    """The run as Markdown lines: a table per mode and arm, the comparison, the targets, the `ratio:` line."""
    r = result
    lines = [f"model {r['model']} (hidden size {r['hidden_size']}, {r['layers']} layers) on {r['device']}, "
             f"{r['dtype']}; batch {r['batch_size']}, {r['batches']} batches per mode, {r['new_tokens']} new tokens; "
             f"conditions {', '.join(r['conditions'])}; compile {_compiled(r)}; "
             f"sampling {r['sampling']}; `generate`'s cache: {r['generate_cache']}; loads: engine "
             f"{r['load_s']['engine']} s, generate {r['load_s']['generate']} s", "",
             "| mode | arm | rows | at limit | tokens | steady s | tokens/s | first batch s | warm-up s | extra CUDA GiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, m in r["modes"].items():
        for a in ("engine", "generate"):
            x = m[a]
            lines.append(f"| {mode} | {a} | {x['rows']} | {x['rows_at_limit']} | {x['tokens']:,} | {x['steady_s']:.2f} | "
                         f"{_fmt(x['tokens_per_s'])} | {x['first_batch_s']:.2f} | {x['warmup_s']:.2f} | "
                         f"{_fmt(x['extra_cuda_gib'], 2)} |")
    lines.append("")
    for mode, m in r["modes"].items():
        note = "" if mode == "greedy" else " (each arm draws its own samples)"
        lines.append(f"{mode}: engine has {_fmt(m['ratio'], 3)}x the steady tokens/s of generate; "
                     f"{m['rows_differ']} of {m['rows_compared']} rows differ{note}")
    lines += ["", "| target | measured | status |", "|---|---:|---|"]
    small = lambda v: f"{v:.3g}" if isinstance(v, float) and abs(v) < 10 else _fmt(v)  # noqa: E731
    lines += [f"| {t['target']} | {small(t['measured'])} | {t['status']} |" for t in r["targets"]]
    lines += ["", f"ratio: {_fmt(r['modes']['greedy']['ratio'], 2)}x the steady greedy tokens/s of model.generate "
                  f"({r['generate_cache']}) at batch {r['batch_size']} (sampled: {_fmt(r['modes']['sampled']['ratio'], 2)}x)"]
    return lines


# ---- the command --------------------------------------------------------------------------------

def bench_params(name: str, model_dir: Path, work: Path, tiny: bool, device: str | None, dtype: str | None,
                 threads: int | None):
    """gpu_check's params (profiles/gpu.yaml, model `name` from `model_dir`), runtime.device, dtype and threads
    from the options, written to work/bench-project/params.yaml and validated."""
    import gpu_check

    from meaningless_tokens.config import load_params

    raw = gpu_check.check_params({name: model_dir}, tiny, [])
    raw["profile"] = "bench-gpu-generate"
    raw["evaluate"]["compile"] = "auto"  # the GPU profile's (the tiny check's `on` needs its eager backend): --compile
    raw["runtime"].update({k: v for k, v in (("device", device), ("dtype", dtype), ("threads", threads)) if v})
    project = work / "bench-project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "params.yaml").write_text(yaml12.dump(raw))
    return load_params(project / "params.yaml")


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    import gpu_check

    known = gpu_check.DEFAULT_MODELS + gpu_check.MORE_MODELS
    ap = argparse.ArgumentParser(prog="benchmarks/bench_gpu_generate.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=known[0], choices=known, help="which of the paper's models (its config)")
    ap.add_argument("--model-dir", type=Path, help="a folder holding that model (default: built into --work)")
    ap.add_argument("--tiny", action="store_true", help="build tiny widths of the model's family (the CPU's test)")
    ap.add_argument("--work", type=Path, help="where models are built and the params written (default: gpu_check's "
                    "<tmp>/meaningless-tokens-gpu-check[-tiny])")
    ap.add_argument("--batch-size", type=positive, default=PLAN_BATCH)
    ap.add_argument("--new-tokens", type=positive, default=128, help="tokens each row generates (greedy and sampled)")
    ap.add_argument("--batches", type=positive, default=2, help="batches per mode (greedy, sampled)")
    ap.add_argument("--device", help="runtime.device (default: cuda, with --tiny cpu)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="runtime.dtype (default: bfloat16)")
    ap.add_argument("--compile", choices=("auto", "on", "off"), help="evaluate.compile, where the engine offers it")
    ap.add_argument("--threads", type=positive, help="torch threads (runtime.threads)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)

    import common

    from meaningless_tokens.errors import StageError

    started, others = time.perf_counter(), common.OtherLoad()
    work = args.work or Path(tempfile.gettempdir()) / f"meaningless-tokens-gpu-check{'-tiny' if args.tiny else ''}"
    device = args.device or ("cpu" if args.tiny else "cuda")
    before = os.environ.get("MLESS_CACHE")
    os.environ["MLESS_CACHE"] = str(work / "cache")  # gpu_check's model cache
    try:
        if args.model_dir is None:
            gpu_check.build_models([args.model], work, args.tiny, "cuda" if device.startswith("cuda") else "cpu")
        params = bench_params(args.model, args.model_dir or work / "models" / args.model, work, args.tiny, device,
                              args.dtype, args.threads)
        result = measure(params, args.model, args.batch_size, args.new_tokens, args.batches, args.compile)
    except (StageError, ValueError) as e:
        print(f"bench_gpu_generate: {e}", file=sys.stderr)
        return 2
    finally:
        if before is None:
            os.environ.pop("MLESS_CACHE", None)
        else:
            os.environ["MLESS_CACHE"] = before
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(common.machine(__import__("torch").get_num_threads()).replace("float32", result["dtype"]))
    print("\n".join(report(result)[:-1]))
    print(f"total {time.perf_counter() - started:.0f} s; {others}")
    print(report(result)[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
