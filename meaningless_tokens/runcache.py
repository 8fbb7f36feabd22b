"""Share the run-cache so that another clone restores stages instead of running them.

    python -m meaningless_tokens.runcache push [-r REMOTE]    # instead of `dvc push --run-cache`

`dvc push --run-cache` (DVC 3) uploads the run-cache's records (`.dvc/cache/runs`: for each stage
run, its deps, params and the hash of every output) but only those output files that a pushed commit
tracks in the DVC cache. Outputs kept in git (`cache: false`: metrics and the timing
sidecars) are never uploaded, though DVC saved them into the local cache with the run; another
clone's `dvc repro --pull` then finds the record, misses one of its files ("Some of the cache files do
not exist neither locally nor on remote") and runs the stage after all. This command pushes the
records as `dvc push --run-cache` does, then every file they name from the local cache, through DVC's
own remote (any remote type). Afterwards, in another clone with the same params:

    dvc repro --pull    # restores each stage from the run-cache (or pulls its committed outputs): no model is loaded
"""

from __future__ import annotations

import argparse
import sys


def push(remote: str | None = None, jobs: int | None = None) -> tuple[int, int]:
    """Push the run-cache records and the files they name; (records, files transferred)."""
    from dvc.repo import Repo

    with Repo() as repo:
        records = repo.stage_cache.push(remote)
        used = repo.stage_cache.get_used_objs(records)
        objs = set().union(*used.values()) if used else set()
        result = repo.cloud.push(objs, jobs=jobs, remote=remote)
        if result.failed:
            raise RuntimeError(f"{len(result.failed)} file(s) of the run-cache could not be uploaded")
        return len(records), len(result.transferred)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.runcache", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["push"])
    ap.add_argument("-r", "--remote", help="DVC remote name (default: core.remote)")
    ap.add_argument("-j", "--jobs", type=int)
    args = ap.parse_args(argv)
    try:
        records, files = push(args.remote, args.jobs)
    except Exception as e:  # noqa: BLE001 - DVC's message (config, connection, credentials), one line
        print(f"ERROR: failed to push the run-cache - {e}".splitlines()[0], file=sys.stderr)
        return 1
    print(f"{records} run-cache records and {files} files pushed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
