"""Greedy generations kept across stages: the evaluate stage's `none` and `mless` rows are the sweep's count-0 and
count-55 rows (the same prompt ids), generated once.

A row is kept only where its tokens are a function of the row alone: under the plan's one shape (the compiled path:
every batch `rows` rows, prompts left-padded to one width, one cache length; engines.TransformersEngine.fit), each
operation of a decoder step works row by row (a matmul's rows, attention per row, norms per row) at sizes the shape
fixes, so neither the other rows of a batch nor which batch a row ran in changes its tokens
(tests/test_generations.py generates rows in different company and compares). With per-batch shapes (the CPU's
default) a row's arithmetic depends on its batch's width: nothing is kept.

A store is one file per key, `<cache root>/generations/<key>.jsonl`: the key holds everything a row's tokens depend
on beyond its prompt ids: the weights' digest, the engine's settings (dtype, device, attention, compile, batch size,
the shape, max_new_tokens, the stop rule, the end-of-text ids), the generating code's digest, the torch and
transformers versions and the machine (the GPU's name, or the CPU's instruction set). A reused row is then the row a
new run would generate, so a stage's outputs do not depend on what ran before (as with DVC's run-cache). Only greedy,
unedited rows are kept (an `arm` row's edit depends on its problem; a sampled row on its seed). Lines are appended
whole and fsynced; a torn or damaged line is skipped (that row is generated again). Delete the folder to start afresh;
MLESS_REUSE=0 turns reuse off.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from meaningless_tokens.store import fs_error

VERSION = 1


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


class Store:
    """One key's rows: prompt ids digest -> (text, n_tokens, stop, seconds)."""

    def __init__(self, folder: Path, key: dict):
        self.key = key
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        self.path = folder / f"{name}.jsonl"
        self.rows: dict[str, tuple] = {}
        self.skipped = 0
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_bytes().split(b"\n")
        except OSError as e:
            print(f"{self.path}: not read ({e.strerror or e}); its rows are generated again", file=sys.stderr)
            return
        for line in lines[1:]:
            try:
                r = json.loads(line)
                self.rows[r["ids"]] = (r["text"], int(r["n_tokens"]), r["stop"], float(r["seconds"]))
            except (ValueError, KeyError, TypeError):
                self.skipped += bool(line.strip())
        if self.skipped:
            print(f"{self.path}: {self.skipped} damaged lines skipped (a run killed while writing?); "
                  f"those rows are generated again", file=sys.stderr)

    def get(self, item) -> tuple | None:
        return self.rows.get(ids_digest(item.input_ids))

    def put(self, rows: list[tuple]) -> None:
        """rows: (item, text, n_tokens, stop, seconds); each line written whole with one append (concurrent stages
        append to the same file without interleaving a line)."""
        fresh = [(ids_digest(it.input_ids), text, n, stop, seconds) for it, text, n, stop, seconds in rows
                 if reusable(it)]
        fresh = [r for r in fresh if r[0] not in self.rows]
        if not fresh:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size == 0:
                    os.write(fd, (json.dumps({"version": VERSION, "key": self.key}, sort_keys=True) + "\n").encode())
                for ids, text, n, stop, seconds in fresh:
                    line = {"ids": ids, "text": text, "n_tokens": n, "stop": stop, "seconds": seconds}
                    os.write(fd, (json.dumps(line, ensure_ascii=True) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise fs_error(e, self.path) from None
        for ids, text, n, stop, seconds in fresh:
            self.rows[ids] = (text, n, stop, seconds)
