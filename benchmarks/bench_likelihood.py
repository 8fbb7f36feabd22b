"""Benchmark: the likelihood stage's scoring vs lm-evaluation-harness and the naive way, on the same token
sequences, in one run.

    python benchmarks/bench_likelihood.py [--model gemma3-270m] [--n 40] [--solution-tokens 32] [--reps 2]
    python benchmarks/bench_likelihood.py --tiny-vocab 262144     # a generated 2-layer Gemma 3 with that vocabulary

    # the lm-eval arm needs lm_eval, which the project never installs; a benchmark-only environment:
    make install VENV=.venv-bench && .venv-bench/bin/pip install lm_eval==0.4.13
    .venv-bench/bin/python benchmarks/bench_likelihood.py --n 40

The workload: `--n` problems (seeded, stratified, as the stage picks them) x the none and mless prompts x the two
continuations (the reference solution's first `--solution-tokens` tokens; the gold answer in the frame), built
by stages/likelihood.py. Arms, on the same loaded model (SDPA, float32, the same threads):
- `stage`: scoring.score_packed, what the stage runs: each problem's sequences packed into one token tree (every
  shared prefix once: the prompt for both continuations, the instruction for both conditions) with the tree's
  attention mask, rows batched by length up to likelihood.batch_tokens, the LM head only at the positions that
  predict a scored token, over slices of the vocabulary;
- `whole`: scoring.score: every sequence whole, batched by length, the same LM head (the stage before packing);
- `lm-eval`: lm-evaluation-harness's HFLM(pretrained=<the model>, batch_size=--lmeval-batch)
  `_loglikelihood_tokens` on the identical (context ids, continuation ids) pairs (skipped, saying so, where
  lm_eval is not installed);
- `naive`: one sequence at a time, the model's own forward with its full logits [T, vocab], log_softmax over
  every position, then the scored tokens gathered.
Arms alternate (the order reversed every repetition); the best repetition of each counts. Peak memory: each arm
once more in a fresh process (the model loaded and warmed up by one short sequence of that arm, which pages in
the memory-mapped weights), then one pass: the growth of the RSS (sampled every 2 ms) over the warmed-up model's.

Prints: per arm the max abs difference of the summed log-probs from the stage's, tokens/s (all tokens of the
sequences), peak memory, and the stage's ratios to each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common


def tiny_gemma(vocab: int, out: Path) -> Path:
    """A 2-layer Gemma 3 text model with Gemma 3 270M's width (hidden 640) and a `vocab`-token vocabulary: the
    real tokenizer is not needed to measure the LM head; token ids come from the project's tokenizer of the
    tests, padded out to `vocab` ids."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    sys.path.insert(0, str(common.ROOT))
    from tests.tiny import train_tokenizer

    tok = train_tokenizer(out, add_bos=True)
    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=640, intermediate_size=2048, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                              query_pre_attn_scalar=256, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=32768, bos_token_id=tok.bos_token_id,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out, safe_serialization=True)
    return out


def setup(args):
    """(params, model, tokenizer, sequences, pad id, description)."""
    from meaningless_tokens import models, scoring
    from meaningless_tokens.measures import likelihood
    from meaningless_tokens.config import load_params
    from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
    from meaningless_tokens.prompts import builder_for

    params = common.load_params()
    raw = params.model_dump()
    raw["likelihood"].update(solution_tokens=args.solution_tokens, conditions=["none", "mless"])
    name = args.model
    if args.tiny_vocab:
        name = "bench-tiny"
        raw["models"] = {name: {"display_name": "bench", "family": "gemma3_text",
                                "source": {"kind": "local_dir", "path": str(args.tiny_dir)}, "layers": [0, 1]}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=common.ROOT, delete=False) as f:
        json.dump(raw, f)
    try:
        params = load_params(f.name)
    finally:
        os.unlink(f.name)
    model_setup = models.setup_for(params, name)
    model, tok, attn = scoring.load(model_setup)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, args.n, params.likelihood.seed)
    builder = builder_for(likelihood.scoring_prompt(params), model_setup, tok)
    seqs = likelihood.build_sequences(params, name, builder, chosen, None)
    vocab = model.get_output_embeddings().weight.shape[0]
    what = (f"{name} ({'generated, ' if args.tiny_vocab else ''}vocabulary {vocab}, {attn}), {len(chosen)} problems x "
            f"2 conditions x 2 continuations = {len(seqs)} sequences, {sum(len(s.input_ids) for s in seqs)} tokens, "
            f"{sum(len(s.scored) for s in seqs)} scored; batch_tokens {params.likelihood.batch_tokens}")
    return params, model, tok, seqs, scoring.pad_id(tok), what


def naive(model, tok, seqs, params, pad):
    import numpy as np
    import torch

    out = []
    with torch.no_grad():
        for s in seqs:
            logits = model(input_ids=torch.tensor([s.input_ids]), use_cache=False).logits[0]
            lp = torch.log_softmax(logits.float(), dim=-1)
            pos = torch.arange(s.start - 1, len(s.input_ids) - 1)
            out.append(lp[pos, torch.tensor(s.scored)].double().numpy())
    return [a.sum() for a in out]


def staged(model, tok, seqs, params, pad):
    from meaningless_tokens import scoring

    return [a.sum() for a in scoring.score_packed(model, seqs, params.likelihood.batch_tokens, pad)]


def whole(model, tok, seqs, params, pad):
    from meaningless_tokens import scoring

    return [a.sum() for a in scoring.score(model, seqs, params.likelihood.batch_tokens, pad)]


def lm_eval_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("lm_eval") is not None


_HFLM: dict = {}  # one HFLM per loaded model (its set-up is not what is measured)


def lm_eval(model, tok, seqs, params, pad, batch_size: int = 8):
    """lm-evaluation-harness's HFLM on the stage's token ids: `_loglikelihood_tokens` takes (request key, context
    ids, continuation ids) and returns (summed log-prob, is greedy) per request."""
    from lm_eval.models.huggingface import HFLM

    key = (id(model), batch_size)
    if key not in _HFLM:
        _HFLM.clear()
        _HFLM[key] = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device="cpu",
                          dtype="float32")
    lm = _HFLM[key]
    requests = [(("", ""), list(s.input_ids[:s.start]), list(s.scored)) for s in seqs]
    return [ll for ll, _ in lm._loglikelihood_tokens(requests, disable_tqdm=True)]


ARMS = {"stage": staged, "whole": whole, "lm-eval": lm_eval, "naive": naive}


def memory_child(args) -> None:
    """One arm once, in this fresh process: print the growth of peak RSS over the loaded model, in MiB."""
    import gc
    import threading

    params, model, tok, seqs, pad, _ = setup(args)
    fn = ARMS[args.memory]
    # a warm-up pass of this arm on the shortest sequence first: it pages in every weight (the safetensors are
    # memory-mapped), so the growth measured below is the arm's working memory, not the weights it touches
    short = [min(seqs, key=lambda s: len(s.input_ids))]
    fn(model, tok, short, params, pad)
    gc.collect()
    base = common.rss_mib()
    peak, done = [base], threading.Event()

    def sample():  # ru_maxrss would count the model load's own peak: sample the RSS during the pass instead
        while not done.is_set():
            peak[0] = max(peak[0], common.rss_mib())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    fn(model, tok, seqs, params, pad)
    done.set()
    t.join()
    print(json.dumps({"arm": args.memory, "peak_growth_mib": max(peak[0], common.rss_mib()) - base}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--tiny-vocab", type=int, default=None, help="a generated 2-layer Gemma 3 with this vocabulary")
    ap.add_argument("--tiny-dir", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=40, help="problems (the issue's workload: 40)")
    ap.add_argument("--solution-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--arms", default="stage,whole,lm-eval,naive", help="comma-separated, from " + ",".join(ARMS))
    ap.add_argument("--memory", choices=list(ARMS), help=argparse.SUPPRESS)
    args = ap.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    if args.memory:
        return memory_child(args)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ARMS]:
        sys.exit(f"error: --arms: unknown arm(s) {unknown}; choose from {list(ARMS)}")
    if "lm-eval" in arms and not lm_eval_available():
        print("arm lm-eval skipped: lm_eval is not installed here (a benchmark-only environment: see this script's text)")
        arms.remove("lm-eval")
    if "stage" not in arms:
        arms.insert(0, "stage")
    started = time.perf_counter()
    tmp = None
    if args.tiny_vocab and args.tiny_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-lik-")
        args.tiny_dir = tiny_gemma(args.tiny_vocab, Path(tmp.name) / "model")
    load = common.OtherLoad()
    print(common.machine(args.threads))
    params, model, tok, seqs, pad, what = setup(args)
    print(f"workload: {what}")
    tokens = sum(len(s.input_ids) for s in seqs)
    for arm in arms:  # warm-up
        ARMS[arm](model, tok, seqs[:2], params, pad)
    best = {arm: float("inf") for arm in arms}
    results = {}
    for rep in range(args.reps):
        for arm in (arms if rep % 2 == 0 else arms[::-1]):
            t0 = time.perf_counter()
            results[arm] = np.array(ARMS[arm](model, tok, seqs, params, pad), dtype=np.float64)
            best[arm] = min(best[arm], time.perf_counter() - t0)
    diff = {arm: float(np.max(np.abs(results[arm] - results["stage"]))) for arm in arms}
    del model
    _HFLM.clear()
    memory = {}
    for arm in arms:
        cmd = [sys.executable, __file__, "--memory", arm, "--model", args.model, "--n", str(args.n),
               "--solution-tokens", str(args.solution_tokens), "--threads", str(args.threads)]
        if args.tiny_vocab:
            cmd += ["--tiny-vocab", str(args.tiny_vocab), "--tiny-dir", str(args.tiny_dir)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=common.ROOT).stdout
        memory[arm] = json.loads(out.strip().splitlines()[-1])["peak_growth_mib"]
    common.table(["arm", "seconds (best)", "tokens/s", "peak memory growth, MiB", "max abs diff of sums, nats",
                  "stage's tokens/s ratio", "stage's memory ratio"],
                 [[arm, f"{best[arm]:.2f}", f"{tokens / best[arm]:.1f}", f"{memory[arm]:.0f}", f"{diff[arm]:.2g}",
                   f"{best[arm] / best['stage']:.2f}x", f"{memory[arm] / max(memory['stage'], 1e-9):.2f}x"]
                  for arm in arms])
    print(str(load))
    print(f"script time {time.perf_counter() - started:.0f} s")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
