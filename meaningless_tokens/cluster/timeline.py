"""Which stage ran on which node and GPU when: `timeline.json` (one row a task) and `timeline.png` (a bar a task,
a lane per node and GPU) in the run's folder, reports/runs/<stamp>/ by default. It records a run, not a result:
it is no DVC output (reports/figures/ is the figures stage's)."""

from __future__ import annotations

import json
from pathlib import Path

DATA, CHART = "timeline.json", "timeline.png"


def lane(record: dict) -> str:
    where = f"{record['ip']} {record['node'][:6]}"
    return f"{where} GPU {record['gpus']}" if record["gpus"] else f"{where} CPU"


def write(folder: Path, records: list[dict], about: dict) -> None:
    """Both files, the data first; times relative to the first task's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t0 = min((r["start"] for r in records), default=0.0)
    rows = [{**r, "start_s": round(r["start"] - t0, 3), "end_s": round(r["end"] - t0, 3), "lane": lane(r)}
            for r in sorted(records, key=lambda r: r["start"])]
    tmp = folder / f".{DATA}.tmp"
    tmp.write_text(json.dumps({**about, "tasks": rows}, indent=1) + "\n")
    tmp.replace(folder / DATA)
    lanes = sorted({r["lane"] for r in rows})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.45 * max(1, len(lanes))), dpi=100)
    colors = {"ran": "#4477aa", "restored": "#bbbbbb", "shard": "#66ccee", "merge": "#228833"}
    for r in rows:
        y = lanes.index(r["lane"])
        kind = r["kind"] if r["kind"] != "stage" else "ran" if r["step"] in r["ran"] else "restored"
        ax.barh(y, r["end_s"] - r["start_s"], left=r["start_s"], height=0.7, color=colors[kind], edgecolor="black",
                linewidth=0.4)
        label = r["step"] + (f" {r['shard']}" if r.get("shard") else "")
        ax.text(r["start_s"] + 0.01 * max(1e-9, r["end_s"] - r["start_s"]), y, label, va="center", fontsize=6,
                clip_on=True)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
    ax.set_xlabel("seconds since the first task started")
    ax.set_title(f"mless repro --cluster: {len(rows)} tasks on {about.get('nodes', '?')} node(s)"
                 + (" (stopped by a failure)" if about.get("failed") else ""), fontsize=9)
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, ["ran", "restored from the run-cache", "shard (a part of a generation)", "merge of the shards"],
              fontsize=6, loc="lower right")
    fig.tight_layout()
    tmp = folder / f".{CHART}.tmp"
    fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    tmp.replace(folder / CHART)
