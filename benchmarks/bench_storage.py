"""Benchmark 5: bytes of artifacts/ per model and condition, and the compression ratio.

    python benchmarks/bench_storage.py [--artifacts artifacts]

Reads the HDF5 artifacts the pipeline wrote (artifacts/{attention,eval,stats}/<model>.h5; run
`dvc repro` first). Per model and top-level group (the conditions, the showcase matrices, the rest):
stored bytes (h5py `id.get_storage_size()` summed over datasets; variable-length strings, which
live in the file's heap, count their UTF-8 bytes plus the 16-byte references) and logical bytes
(uncompressed: elements x item size). "rest" is the file size minus its groups' datasets: /problems,
attributes (provenance), heaps and HDF5 metadata. Also what full [layer, head, T, T] float32
matrices of every extracted prompt would take, which the stored per-position vectors replace.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import common

KINDS = ("attention", "eval", "stats")
GROUPS = ("none", "mless", "mful", "showcase")


def dataset_bytes(ds) -> tuple[int, int]:
    """(stored, logical) bytes of one dataset."""
    if ds.dtype.kind == "O":  # vlen strings: references in the dataset, text in the global heap
        text = sum(len(s) for s in ds.asstr()[()].ravel().tolist())
        return ds.id.get_storage_size() + text, text
    return ds.id.get_storage_size(), ds.size * ds.dtype.itemsize


def file_bytes(path: Path) -> dict[str, list[int]]:
    """{group: [stored, logical]} of one file; 'rest' holds everything outside the GROUPS."""
    import h5py

    sizes = defaultdict(lambda: [0, 0])
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                top = name.split("/")[0]
                stored, logical = dataset_bytes(obj)
                sizes[top if top in GROUPS else "rest"][0] += stored
                sizes[top if top in GROUPS else "rest"][1] += logical
        f.visititems(visit)
    in_groups = sum(s for g, (s, _) in sizes.items() if g != "rest")
    sizes["rest"][0] = path.stat().st_size - in_groups  # metadata, attributes and heaps included
    return dict(sizes)


def full_matrix_bytes(path: Path) -> int:
    """Bytes of float32 [layer, head, T, T] for every prompt of an attention file."""
    import h5py

    with h5py.File(path, "r") as f:
        lh = len(f.attrs["layers"]) * len(f.attrs["heads"])
        return sum(4 * lh * int(((f[c]["offsets"][1:] - f[c]["offsets"][:-1]) ** 2).sum()) for c in f.attrs["conditions"])


def kib(n: int) -> str:
    return f"{n / 1024:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", default=str(common.ROOT / "artifacts"))
    args = ap.parse_args()
    started = time.perf_counter()
    root = Path(args.artifacts)
    params = common.load_params()
    rows, stored_all, logical_all, full_all, attention_all = [], 0, 0, 0, 0
    for model in params.models:
        per = {kind: file_bytes(root / kind / f"{model}.h5") for kind in KINDS}
        model_stored = model_logical = 0
        for group in (*GROUPS, "rest"):
            cells = [per[kind].get(group, [0, 0]) for kind in KINDS]
            stored, logical = sum(c[0] for c in cells), sum(c[1] for c in cells)
            model_stored, model_logical = model_stored + stored, model_logical + logical
            rows.append([model, group, *(f"{kib(c[0])} / {kib(c[1])}" for c in cells), kib(stored),
                         f"{logical / stored:.2f}x" if stored else "-"])
        rows.append([model, "**total**", *(kib((root / k / f"{model}.h5").stat().st_size) for k in KINDS),
                     f"**{kib(model_stored)}**", f"{model_logical / model_stored:.2f}x"])
        stored_all += model_stored
        logical_all += model_logical
        attention_all += (root / "attention" / f"{model}.h5").stat().st_size
        full_all += full_matrix_bytes(root / "attention" / f"{model}.h5")
    print(f"artifacts of profile '{params.profile}' in {root}; KiB stored / logical (uncompressed); "
          f"'rest' = /problems, attributes, heaps and metadata (stored = file size minus the groups)")
    common.table(["model", "group", "attention", "eval", "stats", "stored KiB", "compression"], rows)
    du = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".journal" not in p.parts)
    print(f"all files under {root}: {du / 2**20:.1f} MiB; HDF5 files: {stored_all / 2**20:.1f} MiB stored, "
          f"{logical_all / 2**20:.1f} MiB logical")
    print(f"full float32 attention matrices of the same prompts and layers would take {full_all / 2**20:.0f} MiB "
          f"uncompressed: {full_all / attention_all:.0f}x the attention files")
    print(f"total {time.perf_counter() - started:.1f} s")
    print(f"ratio: {logical_all / stored_all:.2f}x compression (uncompressed dataset bytes / HDF5 file bytes; no target)")


if __name__ == "__main__":
    main()
