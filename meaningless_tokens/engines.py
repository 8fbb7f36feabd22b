"""Generation engines and their journal, shared by the evaluate stage and the sweep's accuracy.

The transformers engine: greedy generation (`do_sample=False`, set explicitly: instruct checkpoints would
otherwise sample by their generation_config), batched with left padding, SDPA attention and a static cache
sized per batch (a dynamic cache re-concatenates every layer's keys and values at each step: half of the CPU
time at batch 12; outputs were identical), optionally stopping a row once it has written a complete
\\boxed{...}; `arm` rows are edited by the ARM hook (meaningless_tokens/arm.py). With evaluate.compile on (CUDA by
default) the decode step is compiled and sees the plan's shapes alone: one prompt width and cache length per stage,
short batches filled to the batch size (`TransformersEngine.fit`); at that shape a row's tokens are its own, and
greedy unedited rows are kept across stages (meaningless_tokens/generations.py). The vLLM engine runs in
worker processes (meaningless_tokens/vllm_engine.py). Sampled rows draw each token with their own seed
(meaningless_tokens/sampling.py).

Each finished batch is appended to a journal; an interrupted run resumes from it with the same batches, so
the final artifact equals an uninterrupted run's. Shards (evaluate.shard) write parts the merge reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from meaningless_tokens import arm, generations, hooks, models, progress, sampling, vllm_engine
from meaningless_tokens.config import CONDITIONS, Evaluate, Runtime
from meaningless_tokens.errors import ArtifactError, ConfigError
from meaningless_tokens.grading import grade, has_complete_box
from meaningless_tokens.store import fs_error

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


# ---- generation -----------------------------------------------------------------------------

class _BoxedStop:
    """Stopping criterion: a row is done once its generated text holds a complete \\boxed{...}.

    One copy to the host per decode step, the step's new tokens; each row's tokens are kept on the host, and a row is
    decoded and checked only at a token whose text writes a '}' (the only token that can close a box: text before it
    is unchanged). A row once done stays done, as its text keeps the box. The done flags go back to the device only
    when one changes, without blocking (from pinned memory on CUDA)."""

    def __init__(self, tokenizer, prompt_len: int):
        self.tok, self.prompt_len = tokenizer, prompt_len
        self.rows: list[list[int]] = []
        self.done: list[bool] = []
        self.flags = None  # the done flags on the device
        self.closes: dict[int, bool] = {}  # token id -> its text holds a '}'

    def _closes(self, token: int) -> bool:
        hit = self.closes.get(token)
        if hit is None:
            hit = self.closes[token] = "}" in self.tok.decode([token], skip_special_tokens=True)
        return hit

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        seen = len(self.rows[0]) if self.rows else 0
        new = input_ids[:, self.prompt_len + seen:].tolist()
        if not self.rows:
            self.rows, self.done = [[] for _ in new], [False] * len(new)
        changed = self.flags is None
        for r, tokens in enumerate(new):
            self.rows[r].extend(tokens)
            if not self.done[r] and any(self._closes(t) for t in tokens) and \
                    has_complete_box(self.tok.decode(self.rows[r], skip_special_tokens=True)):
                self.done[r] = changed = True
        if changed:
            host = torch.tensor(self.done, dtype=torch.bool)
            if input_ids.device.type == "cuda":
                host = host.pin_memory()
            self.flags = host.to(input_ids.device, non_blocking=True)
        return self.flags


def stop_ids(generation_config, tokenizer) -> list[int]:
    """End-of-text ids: the generation config's and the tokenizer's eos, plus the pad token (Qwen's
    `<|endoftext|>` ends raw-prompt generations)."""
    eos = generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids |= {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    if not ids:
        raise ConfigError("the model defines no end-of-text token (generation_config.eos_token_id)")
    return sorted(ids)


ATTENTION = "sdpa"  # generation only; extraction needs eager attention's probabilities


def load_for_generation(setup: models.ModelSetup) -> tuple:
    """(model, tokenizer, attention) with SDPA, or eager for a family that has no SDPA path (Gemma 2:
    its logit softcapping)."""
    try:
        return (*models.load(setup, attn_implementation=ATTENTION), ATTENTION)
    except ValueError as e:
        if "does not support an attention implementation through torch.nn.functional.scaled_dot_product" not in str(e):
            raise
    return (*models.load(setup, attn_implementation="eager"), "eager")


@functools.cache
def _cache_kwarg() -> str:
    """generate()'s name for a cache passed in: `cache` from the transformers releases that renamed it
    (they warn on `past_key_values` at every run), `past_key_values` before (the vLLM environment's)."""
    from transformers.utils import generic

    return "cache" if hasattr(generic, "_rename_kwargs_for_bc") else "past_key_values"



class _Fillers:
    """Stopping criterion: the filler rows of a short batch are done from the first step, so that the batch ends
    when its real rows do. One constant tensor on the device: no copy at any step."""

    def __init__(self, done):
        self.done = done

    def __call__(self, input_ids, scores, **kwargs):
        return self.done


@dataclass(frozen=True)
class Shape:
    """A compiled stage's one shape: every batch has `rows` rows (short ones filled), prompts left-padded to `width`,
    a static cache of `cache_len` tokens."""
    rows: int
    width: int
    cache_len: int


def generate(model, tokenizer, batch: list[Item], max_new_tokens: int, stop_at_boxed: bool,
             eos: list[int], arm_hook: arm.ArmHook | None = None,
             sampler: sampling.RowSampler | None = None, shape: Shape | None = None,
             compile_config=None, cache=None) -> list[tuple[str, int, str]]:
    """Greedy continuations of a batch of prompts: [(text, n_tokens, stop reason)]; `arm_hook` (installed on
    the model) edits the rows whose condition is `arm`; `sampler` draws each sampled row's tokens with its own seed
    (greedy search then takes the one token it leaves). `shape`: the plan's (rows beyond the batch are fillers: a
    copy of its first prompt, never an arm row, their outputs dropped); None: the batch's own width and cache.
    `compile_config` (transformers' CompileConfig): compile the decode step; None: never compile. `cache`: the plan
    shape's StaticCache, reused (zeroed) by every batch, so the compiled step's cache tensors keep their addresses
    (a new cache per batch would record new CUDA graphs); None: a new one sized by the shape or the batch."""
    import torch
    from transformers import LogitsProcessorList, StaticCache, StoppingCriteriaList

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(it.input_ids) for it in batch)
    if shape is not None:
        if len(batch) > shape.rows or width > shape.width or shape.width + max_new_tokens > shape.cache_len:
            raise ValueError(f"a batch of {len(batch)} prompts up to {width} tokens (+{max_new_tokens}) does not "
                             f"fit the plan's shape {shape}")
        width = shape.width
    n_rows = shape.rows if shape is not None else len(batch)
    padded = batch + [Item(-1, "filler", batch[0].input_ids)] * (n_rows - len(batch))
    ids = torch.full((n_rows, width), pad, dtype=torch.long)
    mask = torch.zeros((n_rows, width), dtype=torch.long)
    for r, it in enumerate(padded):  # left padding: every prompt ends where generation starts
        ids[r, width - len(it.input_ids):] = torch.tensor(it.input_ids)
        mask[r, width - len(it.input_ids):] = 1
    criteria = StoppingCriteriaList([_BoxedStop(tokenizer, width)] if stop_at_boxed else [])
    if n_rows > len(batch):
        criteria.append(_Fillers(torch.arange(n_rows, device=model.device) >= len(batch)))
    # sized by this batch or by the plan, never by what ran before: generate's own static cache grows to the
    # longest of all earlier calls, which would make a batch's arithmetic depend on the order (and on resuming)
    if cache is not None:
        cache.reset()  # zeroed as a new one is: the batch computes what it would with a fresh cache
    else:
        cache = StaticCache(config=model.config.get_text_config(decoder=True),
                            max_cache_len=shape.cache_len if shape is not None else width + max_new_tokens)
    # a sampled arm row's ARM draws are seeded with its sample index too
    rows = [(it.index if it.sample < 0 else (it.index, it.sample)) if it.condition == "arm" else None for it in padded]
    if arm_hook is not None:
        arm_hook.begin(rows, mask.bool())
    elif any(r is not None for r in rows):
        raise ValueError("a batch with arm rows needs the ARM hook (arm_hook)")
    switch = {"compile_config": compile_config} if compile_config is not None else {"disable_compile": True}
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
            num_beams=1, eos_token_id=eos, pad_token_id=pad, stopping_criteria=criteria, use_cache=True,
            logits_processor=LogitsProcessorList([sampler] if sampler else []), **{_cache_kwarg(): cache}, **switch,
        )
    if arm_hook is not None:
        arm_hook.begin([])  # disarmed: a later forward pass of this model is left alone
    results = []
    ends = set(eos) | {pad}
    for row in out[:len(batch), width:].tolist():
        n = next((k for k, t in enumerate(row) if t in ends), len(row))
        text = tokenizer.decode(row[:n], skip_special_tokens=True)
        if stop_at_boxed and has_complete_box(text):
            reason = "boxed"
        elif n < max_new_tokens:
            reason = "eos"
        else:
            reason = "length"
        results.append((text, n, reason))
    return results


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


# ---- engines ------------------------------------------------------------------------------------

Generated = tuple[Item, str, int, str, float]  # item, text, n_tokens, stop reason, seconds


SHAPE_STEP = 256      # a planned stage's prompt width: its longest prompt rounded up to a multiple of this; coarse, so
                      # that evaluate and the sweep (whose longest prompt is a few span tokens longer) share a shape
WARMUP_TOKENS = 4     # the warm-up's new tokens: the decode step compiled, then (CUDA graphs) recorded and replayed
MEMORY_MARGIN = 0.8   # the share of free CUDA memory evaluate.batch_size auto plans to fill


def compile_on(setting: str, device: str) -> bool:
    """evaluate.compile resolved: auto is on for CUDA, off elsewhere."""
    return device.startswith("cuda") if setting == "auto" else setting == "on"


# why a compiled decode step would be a new graph at every step: transformers' static cache keeps a sliding-window
# layer's length in a Python int (StaticSlidingWindowLayer.cumulative_length_int), which dynamo specializes on; past
# its recompile limit the step runs uncompiled, after one compilation per step (a tiny Gemma 3: 5 graphs in 5 steps)
SLIDING = "sliding-window layers: transformers' static cache recompiles their decode step at every step"


def compile_for(setting: str, device: str, config) -> tuple[bool, str | None]:
    """evaluate.compile resolved for a model: (on, why not where auto is off on CUDA). auto leaves a model with
    sliding-window layers (Gemma 3) uncompiled; `on` compiles it all the same (and says what it costs)."""
    on = compile_on(setting, device)
    sliding = "sliding_attention" in (getattr(config.get_text_config(decoder=True), "layer_types", None) or ())
    if on and sliding and setting == "auto":
        return False, SLIDING
    if on and sliding:
        print(f"evaluate.compile: on with {SLIDING}", file=sys.stderr)
    return on, None


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """A static cache's bytes per token and row: keys and values of every layer (2 x layers x kv heads x head dim)."""
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv * head_dim * dtype_bytes


def row_bytes(cache_len: int, kv_per_token: int, vocab: int, width: int, hidden: int, intermediate: int, heads: int,
              dtype_bytes: int) -> int:
    """A row's memory in a generate call: its static cache; a step's logits (in the model's dtype, the float32 copy
    generate takes and one processed copy); the prompt's forward pass, whose largest transients are one layer's MLP
    (gate, up, their product), its hidden states (a few copies) and, where SDPA falls back to plain arithmetic,
    the attention scores over the whole cache."""
    logits = vocab * (dtype_bytes + 4 + 4)
    prefill = width * (3 * intermediate + 4 * hidden) * dtype_bytes + heads * width * cache_len * dtype_bytes
    return cache_len * kv_per_token + logits + prefill


def auto_batch_size(free_bytes: int, per_row: int, rows: int, margin: float = MEMORY_MARGIN) -> int:
    """evaluate.batch_size auto: the rows `margin` of the free memory holds, rounded down to a multiple of 8 (fewer
    than 8 as they are), at most `rows` (the plan's); 0 when not even one fits."""
    fit = int(free_bytes * margin) // per_row
    return min(fit if fit < 8 else fit // 8 * 8, rows)


class TransformersEngine:
    """transformers.generate over the static batches; `arm` rows are edited by the ARM hook. `fit` (before the
    journal's key) resolves the batch size and, with compile on, the plan's one shape."""

    def __init__(self, cfg: Evaluate, setup: models.ModelSetup, arm_settings: arm.ArmSettings | None = None,
                 sampled: bool = True):
        self.cfg = cfg
        self.model, self.tokenizer, attn = load_for_generation(setup)
        device = str(self.model.device)
        self.compiled, why_not = compile_for(cfg.compile, device, self.model.config)
        self.compile_config = None
        if self.compiled:
            from transformers import CompileConfig

            # static shapes: the plan gives one shape (the ARM hook traces into the graph: arm.ArmHook.traced)
            self.compile_config = CompileConfig(fullgraph=False, dynamic=False)
            if not device.startswith("cuda"):
                self.compile_config._compile_all_devices = True  # transformers compiles on CUDA alone otherwise
        self.hooks = hooks.Hooks()  # the ARM hook's life is the engine's: `close` (the stage's finally) removes it
        self.arm_hook = self.hooks.arm(arm.ArmHook(arm.layer0_mlp(self.model, setup), arm_settings)) \
            if arm_settings else None
        self.eos = stop_ids(self.model.generation_config, self.tokenizer)
        self.sampling = sampling.settings_for(cfg, self.model.generation_config) if sampled and cfg.sampling.n else None
        self.batch_size = cfg.batch_size if cfg.batch_size != "auto" else None  # resolved by fit
        self.settings = {"engine": "transformers", **_common_settings(cfg, setup, self.eos, device),
                         "batch_size": self.batch_size, "attn_implementation": attn, "cache": "static",
                         "compile": {"setting": cfg.compile, "on": self.compiled,
                                     **({"why_not": why_not} if why_not else {})}}
        self.setup = setup
        # every batch the plan's one shape: what a compiled step needs, and what keeps rows for other stages (a model
        # left uncompiled for its sliding-window layers keeps the shape on CUDA for that)
        self.planned = self.compiled or why_not is not None
        self.shape: Shape | None = None
        self.store: generations.Store | None = None  # rows kept across stages (planned shapes only)
        self.warm = False
        self.filler: tuple[int, ...] | None = None
        self.stats: dict = {}

    def close(self) -> None:
        """The model's hooks removed (the ARM hook): the model generates unedited from here on."""
        self.hooks.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fit(self, groups: list[tuple[list[Item], int]]) -> int:
        """The plan's batch size and shape from every item the stage generates, `groups`: (items, their
        max_new_tokens); recorded in `settings` (the journal's key). With compile off the batches keep their own
        widths and caches (the CPU's bytes of before); with compile on every batch gets one shape: the longest prompt
        rounded up to SHAPE_STEP tokens (within the context), a cache of that plus the largest max_new_tokens, and
        the batch size's rows (`planned`: set with compile, or by a test). evaluate.batch_size auto (CUDA only,
        check_engine) fills the free memory."""
        groups = [(items, limit) for items, limit in groups if items]
        longest = max(len(it.input_ids) for items, _ in groups for it in items)
        limit = max(limit for _, limit in groups)
        rows = max(len(items) for items, _ in groups)
        text = self.model.config.get_text_config(decoder=True)
        width = longest
        if self.planned:
            context = getattr(text, "max_position_embeddings", None) or longest + limit
            width = max(longest, min(-(-longest // SHAPE_STEP) * SHAPE_STEP, context - limit))
        size = self.cfg.batch_size
        if size == "auto":
            import torch

            dtype_bytes = self.model.dtype.itemsize
            free, _ = torch.cuda.mem_get_info(self.model.device)
            per_row = row_bytes(width + limit, kv_bytes_per_token(self.model.config, dtype_bytes), text.vocab_size,
                                width, text.hidden_size, text.intermediate_size, text.num_attention_heads, dtype_bytes)
            size = auto_batch_size(free, per_row, rows)
            if size < 1:
                raise ConfigError(f"evaluate.batch_size: auto: not one row of {width + limit} tokens "
                                  f"({per_row / 2**20:.0f} MiB) fits {MEMORY_MARGIN:.0%} of the free CUDA memory "
                                  f"({free / 2**20:.0f} MiB); give an int or fewer evaluate.max_new_tokens")
            self.stats["batch_size_auto"] = {"free_bytes": free, "row_bytes": per_row, "margin": MEMORY_MARGIN}
        self.batch_size = self.settings["batch_size"] = size
        if self.planned:  # no more rows than the plan has: a batch size above that would only add fillers
            self.shape = Shape(min(size, rows), width, width + limit)
            self.settings["shape"] = {"width": width, "cache_len": width + limit}
            self.filler = groups[0][0][0].input_ids
            if generations.enabled():
                self.store = generations.Store(
                    models.cache_root(self.setup.entry.runtime, self.setup.entry.params_file) / "generations",
                    {"version": generations.VERSION, "weights": self.setup.prepared.weights_sha256,
                     "settings": {**{k: v for k, v in self.settings.items() if k != "batch_size"},
                                  "rows": self.shape.rows},  # what the arithmetic sees (auto may resolve another size)
                     "code": generations.code_digest(__name__, "meaningless_tokens.grading"),
                     "machine": generations.machine(str(self.model.device))})
        return size

    def plan_cache(self):
        """The plan shape's one StaticCache (compiled stages), made at its first use; None without a shape."""
        if self.shape is None:
            return None
        if getattr(self, "_cache", None) is None:
            from transformers import StaticCache

            self._cache = StaticCache(config=self.model.config.get_text_config(decoder=True),
                                      max_cache_len=self.shape.cache_len)
        return self._cache

    def warm_up(self) -> None:
        """One generate of a filler batch at the plan's shape: the decode step compiled (and its CUDA graph recorded)
        before any journaled batch, its seconds in `stats` apart from the batches'."""
        import torch

        t0 = time.perf_counter()
        generate(self.model, self.tokenizer, [Item(-1, "filler", self.filler)], WARMUP_TOKENS, False, self.eos,
                 self.arm_hook, None, self.shape, self.compile_config, self.plan_cache())
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.warm = True
        self.stats["warmup_seconds"] = round(time.perf_counter() - t0, 2)

    def reuse(self, batches: list[list[Item]], done: set) -> tuple[list[Generated], list[list[Item]]]:
        """With the plan's shapes: the rows the store holds, and the rest cut anew into batches (a row's tokens are its
        own at a fixed shape: meaningless_tokens/generations.py). Otherwise none, and `batches` as they are."""
        if self.store is None:
            return [], batches
        todo = [[it for it in b if it.key not in done] for b in batches]
        hits = {it.key: self.store.get(it) for b in todo for it in b if generations.reusable(it)}
        hits = {k: v for k, v in hits.items() if v is not None}
        self.stats["reused"] = self.stats.get("reused", 0) + len(hits)
        if hits:
            print(f"{self.setup.name}: {len(hits)} generations reused from {self.store.path}", file=sys.stderr)
        rest = [[it for it in b if it.key not in hits] for b in todo]
        if not any(it.condition == "arm" for b in rest for it in b):  # (ARM's pool: batch edits a batch's arm rows
            n = self.shape.rows                                          # together: their batches stay as planned)
            rest = [[it for b in rest for it in b if (it.sample >= 0) == s] for s in (False, True)]  # limits differ
            rest = [part[i:i + n] for part in rest for i in range(0, len(part), n)]
        return [(it, *hits[it.key]) for b in todo for it in b if it.key in hits], [b for b in rest if b]

    def run(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        cfg = self.cfg
        reused, batches = self.reuse(batches, done)
        if reused:
            yield reused
        if batches and self.compile_config is not None and not self.warm:
            self.warm_up()
        for batch in batches:  # regenerated whole: with per-batch shapes a row's arithmetic depends on its batch
            t0 = time.perf_counter()
            sampler, limit = None, cfg.max_new_tokens
            if any(it.sample >= 0 for it in batch):
                s = self.sampling
                seeds = [sampling.sample_seed(s["seed"], it.index, it.condition, it.sample) if it.sample >= 0 else None
                         for it in batch]
                fillers = self.shape.rows - len(batch) if self.shape is not None else 0
                sampler = sampling.RowSampler(seeds + [None] * fillers, s["temperature"], s["top_p"], s["top_k"])
                limit = s["max_new_tokens"]
            outs = generate(self.model, self.tokenizer, batch, limit, cfg.stop_at_boxed, self.eos,
                            self.arm_hook, sampler, self.shape, self.compile_config, self.plan_cache())
            share = (time.perf_counter() - t0) / len(batch)
            done_rows = [(it, text, n, reason, share) for it, (text, n, reason) in zip(batch, outs)]
            if self.store is not None:
                self.store.put(done_rows)
            yield done_rows


class VllmEngine:
    """vLLM in worker processes (meaningless_tokens/vllm_engine.py); only the tokenizer is loaded here."""

    def __init__(self, cfg: Evaluate, conditions: list[str], setup: models.ModelSetup, sampled: bool = True):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.cfg, self.setup, prepared = cfg, setup, setup.prepared
        self.device = setup.device
        self.trust = setup.spec.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=self.trust)
        try:
            gen = GenerationConfig.from_pretrained(prepared.path, local_files_only=True)
        except OSError:  # no generation_config.json: the model config's, as from_pretrained builds it
            gen = GenerationConfig.from_model_config(
                AutoConfig.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=self.trust))
        self.eos = stop_ids(gen, self.tokenizer)
        self.sampling = sampling.settings_for(cfg, gen) if sampled and cfg.sampling.n else None
        self.settings = {**_common_settings(cfg, setup, self.eos, self.device),
                         **vllm_engine.settings(cfg, conditions, setup)}
        self.stats: dict = {}
        self.batch_size = cfg.batch_size

    def close(self) -> None:
        """Nothing to remove: no model here, and the workers stop with `run`'s generator."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fit(self, groups: list[tuple[list[Item], int]]) -> int:
        """The batch size of the journal's batches (vLLM schedules its own): auto is every row in one."""
        if self.batch_size == "auto":
            self.batch_size = max(len(items) for items, _ in groups)
        return self.batch_size

    def run(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        cfg = self.cfg
        items = {":".join(map(str, it.key)): it for b in batches for it in b if it.key not in done}
        s = self.sampling
        # a sampled job carries its own seed (vLLM's per-request seed) and sampling values
        jobs = [(k, list(it.input_ids)) if it.sample < 0 else
                (k, list(it.input_ids), {"temperature": s["temperature"], "top_p": s["top_p"], "top_k": s["top_k"] or -1,
                                         "max_tokens": s["max_new_tokens"],
                                         "seed": vllm_engine.request_seed(sampling.sample_seed(
                                             s["seed"], it.index, it.condition, it.sample))})
                for k, it in items.items()]
        if not jobs:  # every generation is journaled or merged from shards: no engine to start
            return
        for job, ids, seconds in vllm_engine.generate(cfg, self.setup, self.settings, jobs, self.eos, self.stats):
            limit = cfg.max_new_tokens if items[job].sample < 0 else self.sampling["max_new_tokens"]
            text, n, reason = vllm_engine.cut(self.tokenizer, ids, self.eos, limit, cfg.stop_at_boxed)
            yield [(items[job], text, n, reason, seconds)]


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


def open_engine(cfg: Evaluate, conditions: list[str], setup: models.ModelSetup,
                arm_settings: arm.ArmSettings | None = None, sampled: bool = True):
    """The engine `evaluate.engine` names, loaded for the stage's model: `.tokenizer`, `.eos`, `.settings` (what
    the outputs depend on beyond prompts and weights: provenance and journal key), `.fit(groups)` (the batch size,
    and the compiled shape, from the plan's items: called before `.settings` is read), `.run(batches, done)`,
    `.close()` (the stage's finally: the ARM hook removed; a `with` block closes it too).
    `sampled`: whether sampled rows may come (evaluate.sampling is read only then: the sweep generates greedily)."""
    if cfg.engine == "vllm":
        return VllmEngine(cfg, conditions, setup, sampled)
    return TransformersEngine(cfg, setup, arm_settings, sampled)


# ---- journaled generation (evaluate and the sweep's accuracy) -------------------------------------

def run_journaled(engine, batches: list[list[Item]], journal: "Journal", gold: dict[int, str], desc: str, name: str,
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
    generations = engine.run(todo, set(journal.records))
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
