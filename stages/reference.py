"""reference: reference/, what `make verify` compares a rerun with where the run's own outputs are out of reach.

The committed run's cached outputs live in the DVC cache and remote of the machine that made them; a fresh clone
has neither. This stage, the pipeline's last, describes every cached output of dvc.yaml (as DVC lists them) in a
folder that git keeps: each file's md5 (what dvc.lock records), text tables and JSON whole, HDF5 files reduced
to their integers, texts, small floats and per-block sums of their large float datasets, figures and pages by md5
(meaningless_tokens/verify/reference.py says how, docs/sharing.md#the-reference what it is sure to catch). Its
dependencies in dvc.yaml must cover every cached output, so that it reruns whenever one changes; it refuses to run
otherwise. Written beside its place and moved in whole.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from meaningless_tokens import cli, store
from meaningless_tokens.config import Params
from meaningless_tokens.errors import StageError, names_the_file
from meaningless_tokens.store.stages import DVC_YAML, dvc_stage
from meaningless_tokens.verify import reference

STAGE = "reference"


def cached_outputs(root: Path) -> list[str]:
    """Every output that DVC caches (the ones a fresh clone lacks), as dvc.yaml and params.yaml resolve them."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        outs = [o for o in repo.index.outs if o.use_cache and o.stage.addressing != STAGE]
    return sorted(Path(o.fs_path).relative_to(root.resolve()).as_posix() for o in outs)


def _covered(out: str, deps: list[str]) -> bool:
    return any(out == d or out.startswith(d.rstrip("/") + "/") for d in deps)


def files_of(root: Path, outputs: list[str]) -> list[str]:
    """Each output's files (a folder output's every file), relative to `root`; a missing output is an error. A page
    that is an output of its own is left out: dvc.lock holds its md5 and verify reads nothing else of a drawn file,
    while its bytes print run times, which would make the reference differ on every rerun."""
    files = []
    for out in outputs:
        path = root / out
        if path.is_dir():
            files += [p.relative_to(root).as_posix() for p in sorted(path.rglob("*")) if p.is_file()]
        elif path.is_file():
            if reference.held_as(out) != "md5":
                files.append(out)
        else:
            raise StageError(f"{path}: an output of dvc.yaml that is not in the workspace (run `dvc repro` first)")
    return files


@names_the_file
def run(params: Params, root: Path | None = None) -> Path:
    """The reference of the project's cached outputs, written to reference/ under `root` (default: the project)."""
    store.params_view(params, STAGE)  # reads no params; the view refuses any
    started = time.perf_counter()
    root = (root or params.project_path(".")).resolve()
    outputs = cached_outputs(root)
    deps = [str(d) for d in dvc_stage(STAGE).get("deps") or []]
    uncovered = [o for o in outputs if not _covered(o, deps)]
    if uncovered:
        raise StageError(f"{DVC_YAML}: stages.{STAGE}.deps: {uncovered[0]} (and {len(uncovered) - 1} more) is a "
                         f"cached output none of its deps covers: list its folder there, so that this stage reruns "
                         f"when it changes")
    out = root / reference.FOLDER
    manifest = reference.write(root, files_of(root, outputs), out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"reference: {len(manifest['files'])} files of {len(outputs)} outputs in "
          f"{time.perf_counter() - started:.1f} s -> {out} ({size / 2**20:.2f} MiB)")
    return out


def main(argv: list[str] | None = None) -> int:
    return cli.main(STAGE, __doc__, run, argv, per_model=False)


if __name__ == "__main__":
    sys.exit(main())
