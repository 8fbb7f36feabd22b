"""The journal of a generation and what runs through it: the records, the fixed batches, the journal's key, the
journal itself (and the shard parts it merges) and the journaled run that grades as it goes.

Each finished batch is appended to a journal; an interrupted run resumes from it with the same batches, so
the final artifact equals an uninterrupted run's. Shards (evaluate.shard) write parts the merge reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from meaningless_tokens import progress
from meaningless_tokens.config import CONDITIONS
from meaningless_tokens.engines.base import Engine, Item
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.grading import grade
from meaningless_tokens.store import fs_error

JOURNAL_VERSION = 1


@dataclass
class Record:
    index: int
    condition: str
    output: str
    n_tokens: int           # generated tokens, end-of-text excluded
    stop: str               # eos | boxed | length
    extracted: str
    correct: bool
    paper_extracted: str | None
    paper_correct: bool
    seconds: float          # wall time of its batch, shared equally by the batch's rows
    sample: int = -1        # as Item.sample; graded on the output alone when >= 0 (the paper's pass@3)

    @property
    def key(self) -> tuple:
        return (self.index, self.condition) if self.sample < 0 else (self.index, self.condition, self.sample)


def make_batches(items: list[Item], batch_size: int, condition_rank=None) -> list[list[Item]]:
    """Items sorted by prompt length (least padding), cut into fixed batches: a resumed run
    regenerates exactly the batches an uninterrupted run would. Equal lengths go by problem, then by
    `condition_rank(condition)` (default: the order of CONDITIONS; the sweep's `<token>x<count>` conditions go by
    name), then by sample: a batch's rows are part of what its outputs are, so the order is fixed."""
    rank = condition_rank or {c: k for k, c in enumerate(CONDITIONS)}.__getitem__
    ranked = sorted(items, key=lambda it: (len(it.input_ids), it.index, rank(it.condition), it.sample))
    return [ranked[i:i + batch_size] for i in range(0, len(ranked), batch_size)]


def journal_key(weights_sha256: str | None, settings: dict, items: list[Item], version: int | None = None,
                **more) -> str:
    """The key a journal is kept under: a version, the weights, the generation settings, every greedy item (problem,
    condition, prompt ids) and `more` (the samples per item); a run resumes only a journal of the same inputs. The
    version leads, as in the sweep's keys before this function: a journal an interrupted run left keeps its key."""
    return hashlib.sha256(json.dumps({
        **({"version": version} if version is not None else {}), "weights": weights_sha256, "settings": settings,
        "items": [(it.index, it.condition, it.input_ids) for it in items], **more}).encode()).hexdigest()

# ---- journal ------------------------------------------------------------------------------------

class Journal:
    """Append-only record of finished batches; bound to one configuration by `key`."""

    def __init__(self, path: Path, key: str, foreign: str = "restart", settings: dict | None = None):
        # settings: what the key was made from beyond the items, kept in the header so that a part refused at the
        # merge says which setting differs (a batch size that evaluate.batch_size auto resolved on another node)
        self.path, self.key, self.foreign, self.settings = path, key, foreign, settings
        self.records: dict[tuple, Record] = {}  # by Record.key
        if path.is_file():
            self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise ArtifactError(f"{self.path}: {e.strerror or e}") from None
        # A kill mid-write leaves a torn last line (no newline after it): cut back to the last complete
        # record before appending, or the next record would be glued onto the torn one.
        end = data.rfind(b"\n") + 1
        if end < len(data):
            if end == 0:  # not even the header was written: nothing was saved
                self.path.unlink()
                return
            try:
                with open(self.path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            except OSError as e:
                raise ArtifactError(f"{self.path}: cannot cut its torn last line: {e.strerror or e}") from None
            print(f"{self.path}: cut a torn last line ({len(data) - end} bytes, a run killed while writing); "
                  f"that batch is redone", file=sys.stderr)
        lines = data[:end].decode("utf-8", errors="replace").split("\n")[:-1]
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = {}
        if header.get("key") != self.key or header.get("version") != JOURNAL_VERSION:
            if self.foreign == "refuse":
                differ = settings_differ(header.get("settings"), self.settings)
                if "batch_size:" in differ:  # auto resolves per node: its free memory
                    differ += (" (evaluate.batch_size auto resolves each node's own size from its free memory: "
                               "set a number for shards made on unlike GPUs)")
                raise ArtifactError(f"{self.path}: made for other inputs ("
                                    + (f"{differ}" if differ else "params, code, model or engine differ from this run's")
                                    + "); rerun that shard with these, or delete the file")
            print(f"{self.path}: made for other inputs; starting afresh", file=sys.stderr)
            self.path.unlink()
            return
        for k, line in enumerate(lines[1:], start=2):
            try:
                rec = Record(**json.loads(line))
            except (json.JSONDecodeError, TypeError) as e:
                raise ArtifactError(f"{self.path}:{k}: damaged journal line ({e}); delete the file to start over") from None
            self.records[rec.key] = rec

    def append(self, records: list[Record]) -> None:
        try:  # a full disk leaves at most a torn last line, which the next run cuts
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.is_file()
            with open(self.path, "a", encoding="utf-8") as f:
                if fresh:
                    f.write(json.dumps({"version": JOURNAL_VERSION, "key": self.key,
                                        **({"settings": self.settings} if self.settings is not None else {})},
                                       ensure_ascii=True) + "\n")
                for rec in records:
                    # ASCII: a text with a lone surrogate (a model can write one) has no UTF-8 form
                    f.write(json.dumps(asdict(rec), ensure_ascii=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise fs_error(e, self.path) from None
        for rec in records:
            self.records[rec.key] = rec


def settings_differ(theirs: dict | None, ours: dict | None, prefix: str = "") -> str:
    """`a: x in the file, y in this run; ...` for each setting that differs ("" when either is unknown or none
    differs: the items or the weights differ then)."""
    if not isinstance(theirs, dict) or not isinstance(ours, dict):
        return ""
    lines = []
    for k in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(k), ours.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = settings_differ(a, b, f"{prefix}{k}.")
            lines += [inner] if inner else []
        elif a != b:
            lines.append(f"{prefix}{k}: {json.dumps(a)} in the file, {json.dumps(b)} in this run")
    return "; ".join(lines)


def part_path(journal: Path, index: int, count: int) -> Path:
    return journal.with_name(f"{journal.stem}.part-{index}-of-{count}.jsonl")


def merge_parts(journal: Journal, journal_path: Path) -> dict[Path, int]:
    """Copy the generations of every shard's part (evaluate.shard) into `journal`: {part: generations}. A part
    made for other inputs is refused (it names the file): shards of one evaluation share every input."""
    merged = {}
    for part in sorted(journal_path.parent.glob(f"{journal_path.stem}.part-*-of-*.jsonl")):
        recs = Journal(part, journal.key, foreign="refuse", settings=journal.settings).records
        journal.append([r for k, r in sorted(recs.items()) if k not in journal.records])
        merged[part] = len(recs)
    if merged:
        print(f"merged {sum(merged.values())} generations from {len(merged)} shard parts in {journal_path.parent}",
              file=sys.stderr)
    return merged

# ---- journaled generation (evaluate and the sweep's accuracy) -------------------------------------

def run_journaled(engine: Engine, batches: list[list[Item]], journal: Journal, gold: dict[int, str], desc: str, name: str,
                  conditions: list[str] | None = None) -> int:
    """Generate and grade every item the journal does not hold yet, appending each as it is done, so an
    interrupted run resumes with the same batches; `conditions` adds a running score per condition to the bar.
    Returns how many generations the journal already held."""
    total = sum(len(b) for b in batches)
    todo = [b for b in batches if any(it.key not in journal.records for it in b)]
    done = sum(it.key in journal.records for b in batches for it in b)
    if done:
        print(f"{name}: resuming from {journal.path} ({done} of {total} generations done)", file=sys.stderr)
    bar = progress.bar(total=total, initial=done, desc=desc, unit="gen")
    tok = engine.tokenizer
    generations = engine.generate(todo, set(journal.records))
    try:
        for outs in generations:
            recs = []
            for it, text, n, reason, seconds in outs:
                # the paper grades greedy outputs with the prompt before them, sampled ones alone (its pass@3)
                prompt = "" if it.sample >= 0 else tok.decode(list(it.input_ids), skip_special_tokens=True)
                g = grade(text, gold[it.index], prompt)
                recs.append(Record(it.index, it.condition, text, n, reason, g.extracted, g.correct,
                                   g.paper_extracted, g.paper_correct, round(seconds, 4), it.sample))
            fresh = sum(r.key not in journal.records for r in recs)
            journal.append(recs)
            bar.update(fresh)
            if conditions:
                bar.set_postfix_str(" ".join(
                    f"{c}={sum(r.correct for r in journal.records.values() if r.condition == c and r.sample < 0)}"
                    f"/{sum(r.condition == c and r.sample < 0 for r in journal.records.values())}" for c in conditions),
                    refresh=False)
    except KeyboardInterrupt:
        bar.close()
        print(f"\n{name}: interrupted; {len(journal.records)} of {total} generations kept in "
              f"{journal.path}; rerun to resume", file=sys.stderr)
        raise
    finally:
        generations.close()  # the vLLM engine's workers stop here, not when the generator is collected
    bar.close()
    return done
