"""`mless repro [TARGET ...] [--cluster [ADDRESS]]`: the pipeline as `dvc repro` runs it, or (`--cluster`) its
stages as Ray tasks on every CPU and GPU of this machine or of a Ray cluster, then `dvc repro` restoring them all
(docs/gpu.md, "Every GPU of a node or a cluster")."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("repro", help="run the pipeline: as dvc repro, or its stages as Ray tasks (--cluster)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", help="stages, as `dvc repro` takes them (default: the whole pipeline)")
    p.add_argument("--cluster", nargs="?", const="", metavar="ADDRESS",
                   help="schedule the stages on Ray: a running cluster's address (`ray start --head` prints it), "
                        "or none for a Ray of this machine's CPUs and GPUs")
    p.add_argument("--shards", type=int, default=1, metavar="N",
                   help="run each stage that generates (evaluate@<model>; sweep@<model> with "
                        "sweep.accuracy_samples > 0) as N shard tasks (a GPU each) and a merge (default 1)")
    p.add_argument("--gpus", choices=["auto", "all", "none"], default="auto",
                   help="which stages ask for a GPU: auto, those that load a model when runtime.device is cuda "
                        "(or auto on a cluster with GPUs); all, every model stage; none")
    p.add_argument("--num-cpus", type=int, help="a local Ray's CPUs (default: the machine's)")
    p.add_argument("--num-gpus", type=int, help="a local Ray's GPUs (default: the machine's)")
    p.add_argument("--object-store-memory", type=int, metavar="BYTES", help="a local Ray's object store")
    p.add_argument("--scratch", type=Path, help="each node's folder for worktrees and caches "
                                                "(default $MLESS_CLUSTER_SCRATCH or $TMPDIR/mless-cluster)")
    p.add_argument("--timeline", type=Path, metavar="DIR", help="where timeline.json and timeline.png go "
                                                                "(default reports/runs/<UTC stamp>)")


def run(args) -> int:
    if args.cluster is None:
        return subprocess.run([sys.executable, "-m", "dvc", "repro", *args.targets]).returncode
    if args.shards < 1:
        from meaningless_tokens.errors import BadParam

        raise BadParam(f"--shards {args.shards}: at least 1")
    from meaningless_tokens.cluster.schedule import Options, run as schedule

    return schedule(Path.cwd(), Options(args.cluster or None, tuple(args.targets), args.shards, args.gpus,
                                        args.num_cpus, args.num_gpus, args.object_store_memory, args.scratch,
                                        args.timeline))
