"""Benchmark: the memory and disk a run of the pipeline took, from what it recorded.

    rm -rf /tmp/cold && MLESS_CACHE=/tmp/cold dvc repro -f     # a cold run: empty model cache, every stage
    MLESS_CACHE=/tmp/cold python benchmarks/bench_footprint.py  # then this

Reads every stage's timing sidecar `metrics/timing/<stage>-<model>.json` (its `seconds` and `peak_rss_mb`, the
stage process's peak resident memory, which `store.write_timing` records) and measures the model cache's size on
disk per entry (`converted/<gguf sha256>-v1-transformers<version>[-layers<k>]`, `gguf/`, ...). Prints a table per stage, the largest
peak and the cache's total, against the targets of a newcomer's machine (peak <= 4 GB, cache <= 8 GB). A sidecar
without `peak_rss_mb` (written before it was recorded) is listed as such. Stages without a sidecar (figures,
report, explorer) load no model.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import common

TARGET_PEAK_MB, TARGET_CACHE_GB = 4000, 8


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under `path` (links not followed: a linked GGUF counts where it lives)."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_blocks * 512
    return sum(disk_bytes(p) for p in path.iterdir()) if path.is_dir() else 0


def main() -> None:
    from meaningless_tokens import models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=common.ROOT, help="the project folder whose sidecars are read")
    args = ap.parse_args()
    params = common.load_params()
    rows, peaks = [], []
    for f in sorted((args.root / "metrics" / "timing").glob("*.json")):
        d = json.loads(f.read_text())
        peak = d.get("peak_rss_mb")
        if peak is not None:
            peaks.append((peak, f.stem))
        rows.append([f.stem, d.get("seconds", "-"), "not recorded" if peak is None else f"{peak:.0f}",
                     d.get("git_commit", "?")[:7]])
    common.table(["stage", "seconds", "peak RSS, MB", "commit"], rows)
    if peaks:
        top = max(peaks)
        print(f"largest peak: {top[0]:.0f} MB ({top[1]}); target <= {TARGET_PEAK_MB} MB: "
              f"{'met' if top[0] <= TARGET_PEAK_MB else 'not met'}")
    cache = models.cache_root(params.runtime, params.file)
    entries = []
    for sub in sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []:
        kids = sorted(sub.iterdir()) if sub.name == "converted" else [sub]
        entries += [(k.relative_to(cache).as_posix(), disk_bytes(k)) for k in kids]
    common.table(["model cache entry", "GiB on disk"], [[n, f"{b / 2**30:.2f}"] for n, b in entries])
    total = sum(b for _, b in entries) / 2**30
    print(f"model cache {cache}: {total:.2f} GiB; target <= {TARGET_CACHE_GB} GB: "
          f"{'met' if total * 2**30 <= TARGET_CACHE_GB * 1e9 else 'not met'}"
          f"{' (MLESS_CACHE)' if os.environ.get('MLESS_CACHE') else ''}")


if __name__ == "__main__":
    main()
