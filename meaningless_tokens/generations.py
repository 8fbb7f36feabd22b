"""Greedy generations evaluate owns and the sweep reads: the evaluate stage's `none` and `mless` rows are the sweep's
count-0 and count-55 rows (the same prompt ids), generated once.

A row is kept only where its tokens are a function of the row alone: under the plan's one shape (the compiled path:
every batch `rows` rows, prompts left-padded to one width, one cache length; engines.TransformersEngine.fit), each
operation of a decoder step works row by row (a matmul's rows, attention per row, norms per row) at sizes the shape
fixes, so neither the other rows of a batch nor which batch a row ran in changes its tokens
(tests/test_generations.py generates rows in different company and compares). With per-batch shapes (the CPU's
default) a row's arithmetic depends on its batch's width: nothing is kept, and the file says why.

evaluate@<model> writes `artifacts/generations/<model>.jsonl` (a DVC output; `store.path("generations", name)`): a
header line with the shape and the key, then one line per kept row (its prompt ids' digest, text, token count and stop
reason; no timing, so that the file is a function of its inputs). The key holds everything a row's tokens depend on
beyond its prompt ids: the weights' digest, the engine's settings (dtype, device, attention, compile, the shape and its
rows, max_new_tokens, the stop rule, the end-of-text ids), the ARM hook the compiled step carries (its settings, or
none), the generating code's digest, the torch and transformers versions and the machine (the GPU's name, or the CPU's
instruction set). The sweep of the same model adopts the file's shape where its own prompts fit in it, and takes a row
only where its engine's key equals the file's: a taken row is then the row it would generate, so its outputs are the
same bytes with the file or without it (tests/test_sweep_reuse.py). The file is therefore a memo, as DVC's run-cache
is, not a declared dependency of the sweep: a declared one would rerun every model's sweep (the GPU profile's largest
cost) whenever any evaluate reran or a model was added, for outputs that cannot change; dvc.yaml's order runs evaluate
first. A model evaluate does not run has no file, and its sweep generates its own rows. MLESS_REUSE=0 makes the sweep
take none.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.store import atomic_path

VERSION = 2
NOT_KEPT = "per-batch shapes (evaluate.compile off): a row's tokens depend on its batch's width, so none is kept"


def enabled() -> bool:
    return os.environ.get("MLESS_REUSE", "1") != "0"


def reusable(item) -> bool:
    """A greedy row of an unedited prompt (not `arm`, not sampled, not a filler)."""
    return item.sample < 0 and item.condition not in ("arm", "filler") and item.index >= 0


def ids_digest(input_ids) -> str:
    return hashlib.sha256(json.dumps(list(input_ids)).encode()).hexdigest()


def code_digest(*modules) -> str:
    """The source files of `modules` (the generation loop, the stop rule): a change there makes new rows."""
    h = hashlib.sha256()
    for m in modules:
        h.update(Path(sys.modules[m].__file__).read_bytes())
    return h.hexdigest()


def machine(device: str) -> dict:
    """What a row's bits depend on beyond the code: the libraries and the hardware's kernels."""
    import torch
    import transformers

    facts = {"torch": torch.__version__, "transformers": transformers.__version__}
    if device.startswith("cuda"):
        facts |= {"gpu": torch.cuda.get_device_name(torch.device(device)), "cuda": torch.version.cuda}
    else:
        facts["cpu"] = torch.backends.cpu.get_cpu_capability()
    return facts


@dataclass(frozen=True)
class Shape:
    """A compiled stage's one shape: every batch has `rows` rows (short ones filled), prompts left-padded to `width`,
    a static cache of `cache_len` tokens (engines.TransformersEngine.fit)."""
    rows: int
    width: int
    cache_len: int


@dataclass
class Kept:
    """One evaluate run's kept rows: prompt ids digest -> (text, n_tokens, stop); `shape` (rows, width, cache_len) and
    `key` None where nothing was kept (`why`)."""
    key: dict | None
    shape: Shape | None
    rows: dict = field(default_factory=dict)
    why: str | None = None


def write(path: Path, key: dict | None, shape, rows: list[tuple]) -> None:
    """rows: (item, text, n_tokens, stop) of the run's greedy rows; the reusable ones written in the order given."""
    if key is None:
        header = {"version": VERSION, "kept": False, "why": NOT_KEPT}
        lines = []
    else:
        header = {"version": VERSION, "kept": True, "key": key,
                  "shape": {"rows": shape.rows, "width": shape.width, "cache_len": shape.cache_len}}
        lines = [{"ids": ids_digest(it.input_ids), "text": text, "n_tokens": int(n), "stop": stop}
                 for it, text, n, stop in rows if reusable(it)]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(x, sort_keys=True, ensure_ascii=True) + "\n" for x in [header, *lines]))


def read(path: Path) -> Kept | None:
    """The rows `path` holds; None where there is no file (the model is not evaluated); an ArtifactError naming the
    file and line where it is not what `write` writes."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: unreadable ({e}); rerun evaluate (dvc repro) to write it again") from None
    lines = text.splitlines()
    try:
        header = json.loads(lines[0])
        if header.get("version") != VERSION:
            raise ValueError(f"version {header.get('version')!r}, expected {VERSION}")
        if not header["kept"]:
            return Kept(None, None, why=header["why"])
        shape = Shape(**header["shape"])
        rows = {}
        for k, line in enumerate(lines[1:], 2):
            r = json.loads(line)
            rows[r["ids"]] = (r["text"], int(r["n_tokens"]), r["stop"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        where = f" line {k}" if "k" in locals() else ""
        raise ArtifactError(f"{path}{where}: not a file of kept generations ({type(e).__name__}: {e}); rerun "
                            f"evaluate (dvc repro) to write it again") from None
    return Kept(header["key"], shape, rows)
