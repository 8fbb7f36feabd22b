"""Benchmark 4: first load of a shipped GGUF model vs a load from the converted cache.

    python benchmarks/bench_model_load.py [--model smollm2-135m] [--reps 3] [--threads 2]

Arms, each measurement in a fresh process; imports, including the model and tokenizer classes that
transformers imports lazily on first use (2-3 s, paid by any process either way), are done
before the clock starts:
  first use  meaningless_tokens.models.prepare + load with an empty model cache that holds only the assembled
             GGUF (linked from the warm cache, so no download is timed): GGUF load, dequantize,
             save as float32 safetensors, hash, then load (what the first `dvc repro` pays once)
  GGUF load  transformers from_pretrained(gguf_file=...) of model and tokenizer, as meaningless_tokens/models/conversion.py
             does it: what every stage would pay if there were no converted cache
  cached     meaningless_tokens.models.prepare + load with the warm cache (what every stage pays)
Arms are interleaved per repetition (order rotated). The GGUF and safetensors files are in the OS
page cache in every arm (just assembled or just used), so disk reads are not what is measured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ARMS = ("first use", "GGUF load", "cached")


def worker(args) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    from meaningless_tokens import models

    params = common.load_params()
    torch.set_num_threads(args.threads)
    # transformers imports model and tokenizer classes lazily, on the first from_pretrained: a fixed
    # cost of every fresh process (2-3 s), not of reading weights; every arm pays it off the clock
    started = time.perf_counter()
    module = model_type_to_module_name(args.model_type)
    importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    transformers.PreTrainedTokenizerFast  # noqa: B018 - the attribute access imports the class
    imports = time.perf_counter() - started
    started = time.perf_counter()
    if args.worker == "GGUF load":
        gguf = Path(args.gguf)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                             attn_implementation="eager")
        prepare = 0.0
    else:  # MLESS_CACHE (set by the parent) picks the empty or the warm cache
        setup = models.setup_for(params, args.model)
        prepare = time.perf_counter() - started
        models.load(setup)
    total = time.perf_counter() - started
    print(json.dumps({"prepare": prepare, "total": total, "imports": imports, "peak_rss_mib": common.peak_rss_mib()}))


def measure(arm: str, args, gguf: Path, warm: Path, model_type: str) -> dict:
    env = dict(os.environ, MLESS_CACHE=str(warm))
    with tempfile.TemporaryDirectory(prefix="bench-load-", dir=warm.parent) as cold:
        if arm == "first use":
            (Path(cold) / "gguf").mkdir()
            os.symlink(gguf, Path(cold) / "gguf" / gguf.name)
            env["MLESS_CACHE"] = cold
        cmd = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads),
               "--worker", arm, "--gguf", str(gguf), "--model-type", model_type]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{arm} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--model-type", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    from meaningless_tokens import models
    from meaningless_tokens.config import model_spec

    params = common.load_params()
    spec = model_spec(params, args.model)
    if spec.source.kind != "pypi_gguf":
        raise SystemExit(f"{args.model} is not a shipped GGUF model (source kind {spec.source.kind})")
    print(common.machine(args.threads))
    others = common.OtherLoad()
    started = time.perf_counter()
    warm = models.cache_root(params.runtime, params.file)
    model_type = models.prepare(params, args.model).facts["model_type"]  # untimed: makes sure the GGUF and its conversion are in the warm cache
    gguf = (warm / "gguf" / f"{spec.source.sha256}.gguf").resolve()
    runs = {a: [] for a in ARMS}
    for rep in range(args.reps):
        for arm in ARMS[rep % 3:] + ARMS[:rep % 3]:  # rotate the order per repetition
            runs[arm].append(measure(arm, args, gguf, warm, model_type))

    med = {a: statistics.median(r["total"] for r in runs[a]) for a in ARMS}
    print(f"model {args.model} (GGUF {gguf.stat().st_size / 2**20:.0f} MiB); {args.reps} repetitions, "
          f"interleaved; seconds are medians; peak RSS = ru_maxrss of the measuring process")
    common.table(
        ["arm", "what is timed", "seconds", "of which prepare", "all runs", "peak RSS, MiB"],
        [[a, {"first use": "prepare (convert GGUF -> safetensors) + load", "GGUF load": "from_pretrained(gguf_file=)",
              "cached": "prepare (cache hit) + load"}[a],
          f"{med[a]:.2f}", f"{statistics.median(r['prepare'] for r in runs[a]):.2f}",
          " ".join(f"{r['total']:.1f}" for r in runs[a]), f"{max(r['peak_rss_mib'] for r in runs[a]):.0f}"]
         for a in ARMS])
    imports = statistics.median(r["imports"] for a in ARMS for r in runs[a])
    print(f"class imports before the clock: {imports:.1f} s per process (median; a stage process pays them "
          f"with any source)")
    print(f"total {time.perf_counter() - started:.0f} s; {others}")
    print(f"ratio: {med['first use'] / med['cached']:.1f}x faster from the cache than the first load "
          f"(target >= 10x); {med['GGUF load'] / med['cached']:.1f}x faster than loading the GGUF; "
          f"{(med['first use'] + imports) / (med['cached'] + imports):.1f}x counting the class imports")


if __name__ == "__main__":
    main()
