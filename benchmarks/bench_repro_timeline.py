"""Benchmark: where a cold `dvc repro` spends its time, stage by stage: the work each stage's sidecar counts
against the rest (the interpreter and its imports, the model's load where the sidecar does not count it, DVC's own
bookkeeping between stages).

    python benchmarks/bench_repro_timeline.py            # runs `dvc repro -f` here (minutes: the whole pipeline)
    python benchmarks/bench_repro_timeline.py --log FILE # reads a log of an earlier run, each line "<epoch> <text>"

Every line DVC prints is stamped with the time it arrived; a stage's wall time runs from its "Running stage" line
to the next one (the last to the end of the run), and its own time is the `seconds` (or `seconds_this_run`) of
its sidecar in metrics/timing/ (figures, report and explorer write none: all their time is counted as the
rest). Prints one row per stage, the totals and, last, the share of the run that is not a stage's counted work.
The stamped log is kept beside the output (`--keep`) to be read again with `--log`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stamped_run(keep: Path | None) -> list[tuple[float, str]]:
    start = time.time()
    lines = [(start, "START")]
    proc = subprocess.Popen(["dvc", "repro", "-f"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    for line in proc.stdout:
        lines.append((time.time(), line.rstrip("\n")))
        print(line, end="", flush=True)
    if proc.wait() != 0:
        sys.exit(f"dvc repro -f failed (exit {proc.returncode})")
    lines.append((time.time(), "END"))
    if keep:
        keep.write_text("".join(f"{t:.6f} {text}\n" for t, text in lines))
    return lines


def read_log(path: Path) -> list[tuple[float, str]]:
    out = []
    with path.open(newline="") as f:  # no newline translation: a progress bar's carriage returns stay in its line
        text_all = f.read()
    for raw in text_all.split("\n"):
        if not raw:
            continue
        t, _, text = raw.partition(" ")
        out.append((float(t), text))
    return out


def sidecar_seconds(stage: str) -> float | None:
    kind, _, name = stage.partition("@")
    f = ROOT / "metrics" / "timing" / (f"{kind}-{name}.json" if name else f"{kind}.json")
    if not f.is_file():
        return None
    t = json.loads(f.read_text())
    return t.get("seconds") or t.get("seconds_this_run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, help="a stamped log of an earlier run instead of running one")
    ap.add_argument("--keep", type=Path, help="where to write the stamped log of this run")
    args = ap.parse_args()
    lines = read_log(args.log) if args.log else stamped_run(args.keep)
    start, end = lines[0][0], lines[-1][0]
    marks = [(t, re.search(r"'([^']+)'", text)[1]) for t, text in lines if text.startswith("Running stage")]
    if not marks:
        sys.exit("no 'Running stage' line: nothing ran")
    bounds = marks + [(end, "")]
    rows, before = [], marks[0][0] - start
    print(f"\n{'stage':36s} {'wall s':>8s} {'counted s':>10s} {'rest s':>8s}")
    for (t, stage), (t_next, _) in zip(bounds, bounds[1:]):
        wall, own = t_next - t, sidecar_seconds(stage)
        rows.append((stage, wall, own or 0.0))
        print(f"{stage:36s} {wall:8.1f} {own if own is not None else '-':>10} {wall - (own or 0.0):8.1f}")
    total = end - start
    counted = sum(own for _, _, own in rows)
    rest = total - counted
    model_rest = sum(w - o for s, w, o in rows if o and "@" in s and not s.startswith(("stats@", "prepare@")))
    print(f"\nwhole run {total:.1f} s ({total / 60:.2f} min); counted by the sidecars {counted:.1f} s; "
          f"the rest {rest:.1f} s (before the first stage {before:.1f} s; outside the model stages' counted work "
          f"{model_rest:.1f} s over {sum(1 for s, _, o in rows if o and '@' in s and not s.startswith(('stats@', 'prepare@')))} "
          f"model stages)")
    print(f"ratio: {rest / total:.3f} of the run is not a stage's counted work")


if __name__ == "__main__":
    main()
