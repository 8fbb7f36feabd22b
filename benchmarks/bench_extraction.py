"""Benchmark 1: the project's attention extraction vs a naive full forward with output_attentions.

    python benchmarks/bench_extraction.py [--model qwen2_5-coder-0_5b] [--n 20] [--threads 2]

Arm `project`: stages.extract's path (the capture attention function, decoder only, stopped after
the last analysed layer; the LM head never runs). Arm `naive`: the same converted weights loaded
with eager attention and `model(ids, output_attentions=True)` over every layer and the LM head, as
a plain script does. Same prompts: every condition of the first --n problems of the extraction
subset, built by the project's prompt builder. Timed per prompt: the forward and copying the
analysed layers' [head, T, T] probabilities to numpy.

Each arm runs in its own worker process, so its peak RSS (getrusage ru_maxrss, model load
included) is its own; the parent hands out prompts alternately (A B, B A, A B, ...) so that load
from other processes falls on both arms alike. The analysed layers' probabilities of the two arms
are compared element-wise (max abs difference; expected 0). The ratio is the median over prompts of
the two arms' times for the same prompt (robust to a burst of other load hitting a few prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ARMS = ("naive", "project")
TAG = "@@"  # marks protocol lines on a worker's stdout (libraries may print there too)


def prompt_ids(params, setup, tokenizer, n):
    """Token ids of every condition of the first n problems of the extraction subset."""
    from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
    from meaningless_tokens.prompts import builder_for

    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, params.extract.n_samples, params.extract.seed)[:n]
    builder = builder_for(params.prompt, setup, tokenizer)
    return [pr[c].input_ids for pr in map(builder.build, chosen) for c in params.prompt.conditions]


def worker(args) -> None:
    import numpy as np
    import torch

    from meaningless_tokens import capture, models
    from meaningless_tokens.config import model_spec

    def send(**msg):
        print(TAG, json.dumps(msg), flush=True)

    params = common.load_params()
    layers = list(model_spec(params, args.model).layers)
    setup = models.setup_for(params, args.model)
    model, tokenizer = models.load(setup)  # eager attention
    torch.set_num_threads(args.threads)
    if args.worker == "project":
        capture.install_capture(model)  # what extract.run does

        def run(ids):
            captured = capture.attention(model, ids, layers)
            return np.stack([captured[layer].cpu().numpy() for layer in layers])
    else:
        def run(ids):
            with torch.no_grad():
                out = model(input_ids=torch.tensor([list(ids)]), output_attentions=True)
            if len(out.attentions) != model.config.num_hidden_layers:  # sdpa would return none, silently
                raise RuntimeError(f"got {len(out.attentions)} attention layers")
            return np.stack([out.attentions[layer][0].float().cpu().numpy() for layer in layers])

    prompts = prompt_ids(params, setup, tokenizer, args.n)
    run(prompts[0])  # warm-up: first-call allocations are not the steady cost
    send(ready=len(prompts), rss_mib=common.rss_mib(), layers=layers, n_layers=model.config.num_hidden_layers)
    for line in sys.stdin:
        k = int(line)
        started = time.perf_counter()
        probs = run(prompts[k])
        seconds = time.perf_counter() - started
        np.save(Path(args.dump) / f"{args.worker}-{k}.npy", probs)
        send(k=k, seconds=seconds)
    send(peak_rss_mib=common.peak_rss_mib())


def receive(proc) -> dict:
    for line in proc.stdout:
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    raise RuntimeError(f"worker exited with status {proc.wait()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2_5-coder-0_5b")
    ap.add_argument("--n", type=int, default=20, help="problems (x conditions = prompts)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import numpy as np

    print(common.machine(args.threads))
    others = common.OtherLoad()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as dump:
        cmd = [sys.executable, __file__, "--model", args.model, "--n", str(args.n),
               "--threads", str(args.threads), "--dump", dump]
        procs = {a: subprocess.Popen([*cmd, "--worker", a], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1) for a in ARMS}
        ready = {a: receive(p) for a, p in procs.items()}
        n_prompts = ready["project"]["ready"]
        seconds = {a: [] for a in ARMS}
        for k in range(n_prompts):
            for a in (ARMS if k % 2 == 0 else ARMS[::-1]):  # alternate which arm goes first
                procs[a].stdin.write(f"{k}\n")
                procs[a].stdin.flush()
                seconds[a].append(receive(procs[a])["seconds"])
        peak = {}
        for a, p in procs.items():
            p.stdin.close()
            peak[a] = receive(p)["peak_rss_mib"]
            p.wait()
        diff = max(float(np.abs(np.load(f"{dump}/naive-{k}.npy") - np.load(f"{dump}/project-{k}.npy")).max())
                   for k in range(n_prompts))

    layers, n_layers = ready["project"]["layers"], ready["project"]["n_layers"]
    what = {"naive": f"all {n_layers} layers + LM head, output_attentions=True",
            "project": f"layers {layers[0]}-{layers[-1]} captured, early exit, no LM head"}
    print(f"model {args.model}; {n_prompts} prompts ({args.n} problems x conditions), interleaved; "
          f"peak RSS = ru_maxrss of each arm's own process, model load included")
    common.table(
        ["arm", "what runs", "s/prompt (mean)", "median", "RSS after warm-up, MiB", "peak RSS, MiB"],
        [[a, what[a], f"{statistics.mean(seconds[a]):.4f}", f"{statistics.median(seconds[a]):.4f}",
          f"{ready[a]['rss_mib']:.0f}", f"{peak[a]:.0f}"] for a in ARMS])
    print(f"max abs difference of layers {layers[0]}-{layers[-1]} attention over {n_prompts} prompts: {diff:g}")
    print(f"total {time.perf_counter() - started:.0f} s; {others}")
    paired = statistics.median(a / b for a, b in zip(seconds["naive"], seconds["project"]))
    print(f"mean time ratio: {sum(seconds['naive']) / sum(seconds['project']):.1f}x")
    print(f"ratio: {paired:.1f}x faster (median over prompts of naive / project seconds; target >= 12x)")


if __name__ == "__main__":
    main()
