"""Benchmark 6: the extract stage's load + forward with only the layers it runs vs the whole model.

    python benchmarks/bench_partial_load.py [--model qwen2_5-coder-0_5b] [--reps 2] [--prompts 5]
                                            [--threads 2] [--dtypes float32,bfloat16] [--skip-generated]

Arms, each measurement in a fresh process (imports, including the model class, done before the
clock starts):
  partial  meaningless_tokens.models.load(..., layers=[0, 1, 2]) as the extract stage does it: a config truncated
           to 3 layers, a view of the checkpoint with only the shards that hold the needed tensors
  full     the same loader without `layers`: every layer (what extraction loaded before issue 14)
then, in both, the capture of layers 0-2 with early exit (meaningless_tokens.capture) on `--prompts` prompts of
140 tokens (the mean length of a `mless` prompt). Peak RSS is getrusage ru_maxrss of the process;
"added" is the peak minus the RSS after the imports. The captured probabilities of the two arms
are compared (max abs difference). The tokenizer is not loaded in either arm (same cost in both).

Two checkpoints, each loaded as float32 (the CPU profile's runtime.dtype) and as bfloat16 (the GPU
profile's). When the runtime dtype is the checkpoint's own, transformers memory-maps the safetensors
files and keeps the tensors on those pages: a full load then costs no memory for layers the
forward never touches (the early exit touches layers 0-2 only), so both arms peak alike. When the
dtype differs, every loaded tensor is converted into new memory: that is where the full load pays
for all its layers (and on a GPU, where every layer is copied to the device).
  - `--model` from params.yaml (default Qwen2.5-Coder-0.5B-Instruct, 24 layers, float32 on disk,
    as converted from its GGUF; prepared first);
  - a generated Llama-style checkpoint of 32 layers (hidden 2048, MLP 8192, 16 query / 4 kv heads,
    vocabulary 32000, tied embeddings: 2.0 B parameters, 4.0 GB in bfloat16), random weights, sharded
    into 8 safetensors files with an index like a hub checkpoint. It is written once into
    `<model cache>/bench/llama32-h2048/` (outside the repository) and reused.
Arms are interleaved per repetition (order alternated). The checkpoint files are in the OS page
cache in every arm after the first, so disk reads are not what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ARMS = ("partial", "full")
LAYERS = [0, 1, 2]
GENERATED = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=16,
                 num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=True)
SHARDS = 8


def write_generated(folder: Path) -> Path:
    """The 32-layer random checkpoint (bf16, sharded, with an index), written once."""
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**GENERATED, dtype="bfloat16")
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    shapes.pop("lm_head.weight", None)  # tied to the embedding
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        gen = torch.Generator().manual_seed(0)
        per_layer = GENERATED["num_hidden_layers"] // SHARDS
        layer_of = lambda k: int(k.split(".")[2]) if k.startswith("model.layers.") else -1  # noqa: E731
        weight_map, total = {}, 0
        for s in range(SHARDS):
            lo, hi = s * per_layer, (s + 1) * per_layer
            keys = [k for k in shapes if lo <= layer_of(k) < hi or (layer_of(k) < 0 and s == 0 and "embed" in k)
                    or (layer_of(k) < 0 and s == SHARDS - 1 and "embed" not in k)]
            name = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
            tensors = {}
            for k in keys:
                if k.endswith("norm.weight"):
                    tensors[k] = torch.ones(shapes[k], dtype=torch.bfloat16)
                else:
                    tensors[k] = (torch.randn(shapes[k], generator=gen) * 0.02).to(torch.bfloat16)
                weight_map[k] = name
                total += tensors[k].numel() * 2
            save_file(tensors, tmp / name, metadata={"format": "pt"})
            del tensors
        assert set(weight_map) == set(shapes)
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        config.save_pretrained(tmp)
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def worker(args) -> None:
    import numpy as np
    import torch

    from meaningless_tokens import capture, models
    from meaningless_tokens.config import load_params

    torch.set_num_threads(args.threads)
    # imports outside the clock, including the model class transformers imports on first use (seconds,
    # paid by any process either way)
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM._model_mapping[type(AutoConfig.from_pretrained(args.path))]

    params = load_params(common.ROOT / "params.yaml")
    base = common.rss_mib()
    started = time.perf_counter()
    n_layers = max(LAYERS) + 1 if args.worker == "partial" else None
    dtype = models.torch_dtype(args.dtype or params.runtime.dtype)
    model = models.partial.from_pretrained("bench", Path(args.path), dtype, "eager", False, n_layers)
    model.eval().requires_grad_(False)
    load = time.perf_counter() - started
    capture.install_capture(model)
    vocab = model.config.get_text_config().vocab_size
    probs = []
    for k in range(args.prompts):
        ids = [(v + 7 * k) % vocab for v in capture.probe_ids(vocab, 140)]
        got = capture.attention(model, ids, LAYERS)
        probs.append(np.stack([got[i].numpy() for i in LAYERS]))
    total = time.perf_counter() - started
    np.save(args.dump, np.stack(probs))
    print(json.dumps({"load": load, "total": total, "peak_rss_mib": common.peak_rss_mib(), "base_rss_mib": base,
                      "layers_built": len(model.get_decoder().layers)}))


def measure(arm: str, path: Path, args, dump: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", arm, "--path", str(path), "--threads", str(args.threads),
           "--prompts", str(args.prompts), "--dump", str(dump), "--dtype", args.dtype]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{arm} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(label: str, path: Path, args) -> dict:
    import numpy as np

    print(f"\n{label}:")
    runs = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-partial-") as tmp:
        dumps = {a: Path(tmp) / f"{a}.npy" for a in ARMS}
        for rep in range(args.reps):
            for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
                runs[arm].append(measure(arm, path, args, dumps[arm]))
        diff = float(np.abs(np.load(dumps["partial"]) - np.load(dumps["full"])).max())
    med = {a: {k: statistics.median(r[k] for r in runs[a]) for k in ("load", "total", "peak_rss_mib", "base_rss_mib")}
           for a in ARMS}
    common.table(
        ["arm", "layers built", "load, s", "load + forward, s", "all runs, s", "peak RSS, MiB", "added by load, MiB"],
        [[a, runs[a][0]["layers_built"], f"{med[a]['load']:.2f}", f"{med[a]['total']:.2f}",
          " ".join(f"{r['total']:.1f}" for r in runs[a]), f"{max(r['peak_rss_mib'] for r in runs[a]):.0f}",
          f"{med[a]['peak_rss_mib'] - med[a]['base_rss_mib']:.0f}"] for a in ARMS])
    rss = {a: max(r["peak_rss_mib"] for r in runs[a]) for a in ARMS}
    out = {"label": label, "rss_fraction": rss["partial"] / rss["full"], "rss_ratio": rss["full"] / rss["partial"],
           "time_ratio": med["full"]["total"] / med["partial"]["total"], "max_abs_diff": diff}
    print(f"{label}: peak RSS {rss['partial']:.0f} vs {rss['full']:.0f} MiB ({100 * out['rss_fraction']:.0f} % of the "
          f"full load, {out['rss_ratio']:.1f}x less); load + forward {out['time_ratio']:.1f}x faster; "
          f"captured probabilities: max abs difference {diff:g}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2_5-coder-0_5b")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-generated", action="store_true", help="only the params model")
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="runtime dtypes to measure each checkpoint in (float32: the CPU profile; bfloat16: the GPU one)")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    from meaningless_tokens import models

    params = common.load_params()
    print(common.machine(args.threads))
    others = common.OtherLoad()
    started = time.perf_counter()
    prepared = models.prepare(params, args.model)  # untimed: makes sure it is converted and probed
    results = []
    size = sum(p.stat().st_size for p in prepared.path.glob("*.safetensors"))
    print(f"\n{args.model}: {prepared.facts['num_layers']} layers, {size / 2**30:.2f} GiB float32 safetensors; "
          f"layers {LAYERS}, {args.prompts} prompts of 140 tokens, {args.reps} repetitions interleaved; seconds "
          f"are medians")
    checkpoints = [(args.model, prepared.path)]
    if not args.skip_generated:
        t0 = time.perf_counter()
        folder = write_generated(models.cache_root(params.runtime, params.file) / "bench" / "llama32-h2048")
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        print(f"generated 32-layer checkpoint: {folder} ({size / 2**30:.2f} GiB bfloat16 in "
              f"{len(list(folder.glob('*.safetensors')))} shards; ready in {time.perf_counter() - t0:.0f} s)")
        checkpoints.append(("llama32-h2048", folder))
    for label, path in checkpoints:
        for dtype in args.dtypes.split(","):
            args.dtype = dtype
            results.append(bench(f"{label} as {dtype}", path, args))
    print(f"\ntotal {time.perf_counter() - started:.0f} s; {others}")
    print("ratio: " + "; ".join(
        f"{r['label']} peak RSS {100 * r['rss_fraction']:.0f} % of the full load ({r['rss_ratio']:.1f}x less), "
        f"{r['time_ratio']:.1f}x faster" for r in results)
        + " (targets: <= 40 % on Qwen, >= 6x less on the 32-layer checkpoint, time not worse)")


if __name__ == "__main__":
    main()
