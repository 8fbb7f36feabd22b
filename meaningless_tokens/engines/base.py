"""The engine interface and what every backend shares: the items and records of a generation, the fixed batches, the
journal (and the shard parts it merges) and the journaled run that grades as it goes.

`Engine` is what the stages call, whichever backend `evaluate.engine` names: `generate(batches, done)` (greedy or
seeded sampled continuations), `loglikelihood(seqs, ...)` (teacher-forced log-probs), `fit`, `settings`, `close`.
`Scorer` is its scoring part alone: what the likelihood stages need, which read none of evaluate's settings.
The backends: meaningless_tokens/engines/transformers.py and meaningless_tokens/engines/vllm.py.

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
from typing import TYPE_CHECKING, Iterator, NamedTuple, Protocol, runtime_checkable

import numpy as np

from meaningless_tokens import models, progress, vllm_engine
from meaningless_tokens.config import CONDITIONS, Evaluate, Runtime
from meaningless_tokens.errors import ArtifactError, ConfigError
from meaningless_tokens.grading import grade
from meaningless_tokens.store import fs_error

if TYPE_CHECKING:
    from meaningless_tokens.scoring import Seq

JOURNAL_VERSION = 1


@dataclass(frozen=True)
class Item:
    index: int              # problem index (row of the dataset file)
    condition: str
    input_ids: tuple[int, ...]
    sample: int = -1        # -1: the greedy output; 0..n-1: a sampled one (evaluate.sampling)

    @property
    def key(self) -> tuple:
        return (self.index, self.condition) if self.sample < 0 else (self.index, self.condition, self.sample)


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

Generated = tuple[Item, str, int, str, float]  # item, text, n_tokens, stop reason, seconds


class Scores(NamedTuple):
    """What `loglikelihood` returns: per sequence the log-prob of each scored token (float64), how they were computed
    (scoring's method and checks, for the provenance) and the seconds the scoring took."""
    logprobs: list[np.ndarray]
    how: dict
    seconds: float


class Closing:
    """`with engine:` closes it on every exit (what each backend's `close` removes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@runtime_checkable
class Scorer(Protocol):
    """Teacher-forced scoring (the likelihood stages, the sweep's likelihood, ARM's tuning)."""

    tokenizer: object

    def loglikelihood(self, seqs: list[Seq], batch_tokens: int, arm=None, *, method: str = "fastest",
                      shown: bool = False, bar=None, warn=None, desc: str = "scoring", name: str = "") -> Scores:
        """Per sequence (scoring.Seq) the log-prob of each scored token given everything before it, batched within
        `batch_tokens`; `arm`: a TeacherForcedArm hook installed on the model, editing the `arm` rows. `method`:
        "fastest" (packed where the model passes the packing checks, else whole), "packed" or "whole". `shown`: a
        progress bar `desc` over the sequences and a fall-back said on stderr as `<name>: <why>`; else `bar` (one
        shared by several calls) and `warn` (called with a fall-back's reason)."""

    def close(self) -> None:
        """What the engine installed on the model removed (the stage's finally; a `with` block closes it too)."""

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class Engine(Scorer, Protocol):
    """A generation backend (`evaluate.engine`), loaded for one model by `open_engine`."""

    eos: list[int]               # end-of-text ids
    settings: dict               # what the outputs depend on beyond prompts and weights: provenance, journal key
    stats: dict                  # how the run went (warm-up, auto batch size, vLLM's start): the timing sidecar
    sampling: dict | None        # the sampled rows' settings (sampling.settings_for); None: greedy rows only
    batch_size: int | str | None  # rows per journaled batch, resolved by `fit`

    def fit(self, groups: list[tuple[list[Item], int]], like=None) -> int:
        """The batch size (and a compiled plan's shape) from every item the stage generates, `groups`: (items, their
        max_new_tokens); called before `settings` is read. `like`: another stage's shape to adopt where the items fit.
        """

    def row_key(self) -> dict | None:
        """What a kept greedy row depends on beyond its prompt (meaningless_tokens/generations.py), after `fit`; None
        where this run keeps none (a row's tokens depend on its batch)."""

    def take(self, kept) -> int:
        """Rows of evaluate's run (generations.Kept) to reuse where their key is `row_key()`; how many."""

    def generate(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        """The continuations of every batch (`done`: the keys already journaled, which a backend may skip), as
        they finish: (item, text, n_tokens, stop reason, seconds)."""


# ---- journal ------------------------------------------------------------------------------------

class Journal:
    """Append-only record of finished batches; bound to one configuration by `key`."""

    def __init__(self, path: Path, key: str, foreign: str = "restart"):
        self.path, self.key, self.foreign = path, key, foreign
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
                raise ArtifactError(f"{self.path}: made for other inputs (params, code, model or engine differ from "
                                    f"this run's); rerun that shard with these, or delete the file")
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
                    f.write(json.dumps({"version": JOURNAL_VERSION, "key": self.key}) + "\n")
                for rec in records:
                    # ASCII: a text with a lone surrogate (a model can write one) has no UTF-8 form
                    f.write(json.dumps(asdict(rec), ensure_ascii=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise fs_error(e, self.path) from None
        for rec in records:
            self.records[rec.key] = rec


def part_path(journal: Path, index: int, count: int) -> Path:
    return journal.with_name(f"{journal.stem}.part-{index}-of-{count}.jsonl")


def merge_parts(journal: Journal, journal_path: Path) -> dict[Path, int]:
    """Copy the generations of every shard's part (evaluate.shard) into `journal`: {part: generations}. A part
    made for other inputs is refused (it names the file): shards of one evaluation share every input."""
    merged = {}
    for part in sorted(journal_path.parent.glob(f"{journal_path.stem}.part-*-of-*.jsonl")):
        recs = Journal(part, journal.key, foreign="refuse").records
        journal.append([r for k, r in sorted(recs.items()) if k not in journal.records])
        merged[part] = len(recs)
    if merged:
        print(f"merged {sum(merged.values())} generations from {len(merged)} shard parts in {journal_path.parent}",
              file=sys.stderr)
    return merged

def _common_settings(cfg: Evaluate, setup: models.ModelSetup, eos: list[int], device: str) -> dict:
    return {"max_new_tokens": cfg.max_new_tokens, "stop_at_boxed": cfg.stop_at_boxed, "greedy": True,
            "eos_token_ids": eos, "device": device, "dtype": setup.dtype}

def check_engine(cfg: Evaluate, conditions: list[str], runtime: Runtime, params_file: Path) -> None:
    """The engine's own bad input (vLLM missing, more devices than there are, arm on vLLM), before any work
    (before the model is prepared: a stage checks this first). `cfg`: params' evaluate, `conditions`: the
    stage's (evaluate: prompt.conditions; the sweep: its own); `runtime`'s device is resolved here only for vLLM or
    evaluate.batch_size auto (else the stage resolves it when it prepares the model)."""
    if cfg.engine == "vllm":
        vllm_engine.check(cfg, conditions, models.torch_device(runtime, params_file), params_file)
    elif cfg.batch_size == "auto" and not models.torch_device(runtime, params_file).startswith("cuda"):
        raise ConfigError(f"{params_file}: evaluate.batch_size: auto sizes batches by free CUDA memory, and this run "
                          f"is on the CPU (runtime.device {runtime.device}); give the rows per batch as an int")

# ---- journaled generation (evaluate and the sweep's accuracy) -------------------------------------

def run_journaled(engine: Engine, batches: list[list[Item]], journal: "Journal", gold: dict[int, str], desc: str, name: str,
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
