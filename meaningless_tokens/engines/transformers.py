"""The transformers engine: generation and teacher-forced scoring on a model loaded in this process.

Generation: greedy (`do_sample=False`, set explicitly: instruct checkpoints would
otherwise sample by their generation_config), batched with left padding, SDPA attention and a static cache
sized per batch (a dynamic cache re-concatenates every layer's keys and values at each step: half of the CPU
time at batch 12; outputs were identical), optionally stopping a row once it has written a complete
\\boxed{...}; `arm` rows are edited by the ARM hook (meaningless_tokens/arm/). With evaluate.compile on (CUDA by
default) the decode step is compiled and sees the plan's shapes alone: one prompt width and cache length per stage,
short batches filled to the batch size (`TransformersEngine.fit`); at that shape a row's tokens are its own, and
greedy unedited rows are kept across stages (meaningless_tokens/generations.py). Sampled rows draw each token with
their own seed (meaningless_tokens/sampling.py).

Scoring (`loglikelihood`): engines/scorer.py's, on the engine's model (the likelihood stages open that module's
`TransformersScorer`, without evaluate's generation settings).
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from meaningless_tokens import arm, generations, hooks, models, sampling
from meaningless_tokens.config import Evaluate, Runtime
from meaningless_tokens.engines.base import Closing, Generated, Item, _common_settings
from meaningless_tokens.engines.scorer import Likelihood
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.generations import Shape
from meaningless_tokens.grading import has_complete_box

if TYPE_CHECKING:
    from pathlib import Path


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


@functools.cache
def plan_cache_class():
    """StaticCache with a host length until its first write: the plan shape's one cache, reused by every batch."""
    from transformers import StaticCache

    class PlanCache(StaticCache):
        """The plan shape's StaticCache, reused (zeroed by `reset`) by every batch so that the compiled step's cache
        tensors keep their addresses. Its length is a host 0 from `reset` until its first write: transformers' prefill
        reads `get_seq_length()` to slice the prompt, and a reset static layer answers with its device counter, which
        the slice would copy to the host (one host-device sync per batch on CUDA; a fresh cache answers a host 0)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fresh = True

        def reset(self):
            super().reset()
            self.fresh = True

        def get_seq_length(self, layer_idx: int = 0):
            return 0 if self.fresh else super().get_seq_length(layer_idx)

        def update(self, *args, **kwargs):
            import torch

            if not torch.compiler.is_compiling():  # the prompt's pass (uncompiled) writes first; then it is never fresh
                self.fresh = False
            return super().update(*args, **kwargs)

    return PlanCache


def generate(model, tokenizer, batch: list[Item], max_new_tokens: int, stop_at_boxed: bool,
             eos: list[int], arm_hook: arm.ArmHook | None = None,
             sampler: sampling.RowSampler | None = None, shape: Shape | None = None,
             compile_config=None, cache=None) -> list[tuple[str, int, str]]:
    """Greedy continuations of a batch of prompts: [(text, n_tokens, stop reason)]; `arm_hook` (installed on
    the model) edits the rows whose condition is `arm`; `sampler` draws each sampled row's tokens with its own seed
    (greedy search then takes the one token it leaves). `shape`: the plan's (rows beyond the batch are fillers: a
    copy of its first prompt, never an arm row, their outputs dropped); None: the batch's own width and cache.
    `compile_config` (transformers' CompileConfig): compile the decode step; None: never compile. `cache`: the plan
    shape's cache (`plan_cache_class`), reused (zeroed) by every batch, so the compiled step's cache tensors keep their
    addresses (a new cache per batch would record new CUDA graphs); None: a new one sized by the shape or the batch."""
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


SHAPE_STEP = 256      # a planned stage's prompt width: its longest prompt rounded up to a multiple of this; coarse, so
                      # that evaluate and the sweep (whose longest prompt is a few span tokens longer) share a shape
WARMUP_TOKENS = 4     # the warm-up's new tokens: the decode step compiled, then (CUDA graphs) recorded and replayed
MEMORY_MARGIN = 0.8   # the share of free CUDA memory evaluate.batch_size auto plans to fill
# transformers' CompileConfig for a compiled decode step: static shapes (the plan gives one shape; the ARM hook traces
# into the graph: arm.ArmHook.traced), transformers' defaults otherwise (inductor, reduce-overhead: CUDA graphs). A
# harness may swap the backend in-process (tests, `make gpu-check TINY=1`: dynamo's eager backend, no C++ build).
COMPILE_OPTIONS = {"fullgraph": False, "dynamic": False}
# inductor's settings for that step, set for the process when an engine compiles: a fused kernel otherwise keeps a
# bfloat16 intermediate unrounded (SiLU's output computed in float32), so the ARM edit would sort values the eager
# step never sees and move other elements (tests/test_cuda.py; on the CPU's inductor: llama's moved sets 3 elements
# apart in 2 of 9 row-steps without it, bit for bit with it)
INDUCTOR_CONFIG = {"emulate_precision_casts": True}


# why a compiled decode step would be a new graph at every step: transformers' static cache keeps a sliding-window
# layer's length in a Python int (StaticSlidingWindowLayer.cumulative_length_int), which dynamo specializes on; past
# its recompile limit the step runs uncompiled, after one compilation per step (a tiny Gemma 3: 5 graphs in 5 steps)
SLIDING = "sliding-window layers: transformers' static cache recompiles their decode step at every step"


def compile_for(setting: str, device: str, config) -> tuple[bool, str | None]:
    """evaluate.compile resolved for a model: (on, why not where auto is off on CUDA). auto is on for CUDA, off
    elsewhere, and leaves a model with sliding-window layers (Gemma 3) uncompiled; `on` compiles it all the same (and
    says what it costs)."""
    on = device.startswith("cuda") if setting == "auto" else setting == "on"
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


@dataclass(eq=False)
class _Loaded:
    """A model loaded for generation with what its compiled decode step is made of: the ARM hook traced into it, one
    plan cache per shape, and the shapes whose step has run (warm). Engines of one key share it within a process."""
    key: str
    model: object
    tokenizer: object
    attn: str
    hooks: hooks.Hooks
    arm_hook: arm.ArmHook | None
    caches: dict
    warm: set


_SHARED: list[_Loaded] = []  # at most one: the compiled model of this process (one model's weights held at a time)


def release() -> None:
    """The process's shared compiled model let go (its hook removed): the next engine loads afresh."""
    import gc

    while _SHARED:
        loaded = _SHARED.pop()
        loaded.hooks.close()
        cuda = loaded.model.device.type == "cuda"
        del loaded
        gc.collect()
        if cuda:
            import torch

            torch.cuda.empty_cache()


def _loaded_key(setup: models.ModelSetup, arm_settings) -> str:
    """What a compiled step depends on beyond the shape: the weights, where and how they run, the ARM hook in it."""
    import json

    return json.dumps({"weights": setup.prepared.weights_sha256, "path": str(setup.prepared.path),
                       "device": setup.device, "dtype": setup.dtype, "compile": repr(sorted(COMPILE_OPTIONS.items())),
                       "trust_remote_code": setup.spec.trust_remote_code,
                       "arm": arm_settings.describe() if arm_settings else None}, sort_keys=True, default=str)


class TransformersEngine(Likelihood, Closing):
    """transformers.generate over the static batches; `arm` rows are edited by the ARM hook. `fit` (before the
    journal's key) resolves the batch size and, with planned shapes (`planned`), the plan's one shape.

    Where the decode step is compiled, engines opened one after another in a process for the same model and ARM
    settings share one loaded model, its hook, its compiled step and its plan caches (`_SHARED`; `release()` lets go):
    the evaluate stage, the sweep's accuracy and the generation benchmark of a harness that runs them in-process then
    compile once per shape. Each stage of `dvc repro` is a process of its own, so there it changes nothing."""

    def __init__(self, cfg: Evaluate, setup: models.ModelSetup, arm_settings: arm.ArmSettings | None = None,
                 sampled: bool = True):
        self.cfg = cfg
        key = _loaded_key(setup, arm_settings)
        shared = next((x for x in _SHARED if x.key == key), None)
        if shared is None:
            release()  # a compiled model of another key: its memory back before this one loads
            self.model, self.tokenizer, attn = load_for_generation(setup)
        else:
            self.model, self.tokenizer, attn = shared.model, shared.tokenizer, shared.attn
        device = str(self.model.device)
        self.compiled, why_not = compile_for(cfg.compile, device, self.model.config)
        self.compile_config = None
        if self.compiled:
            from transformers import CompileConfig

            import torch._inductor.config as inductor

            self.compile_config = CompileConfig(**COMPILE_OPTIONS)
            for option, value in INDUCTOR_CONFIG.items():
                setattr(inductor, option, value)
            if not device.startswith("cuda"):
                self.compile_config._compile_all_devices = True  # transformers compiles on CUDA alone otherwise
        if shared is None:
            hook_set = hooks.Hooks()
            arm_hook = hook_set.arm(arm.ArmHook(arm.layer0_mlp(self.model, setup), arm_settings)) \
                if arm_settings else None
            shared = _Loaded(key, self.model, self.tokenizer, attn, hook_set, arm_hook, {}, set())
            if self.compiled:
                _SHARED.append(shared)
        self.loaded = shared
        # the ARM hook's life is the engine's (`close`, the stage's finally, removes it), or the shared model's
        self.hooks = shared.hooks
        self.arm_hook = shared.arm_hook
        self.eos = stop_ids(self.model.generation_config, self.tokenizer)
        self.sampling = sampling.settings_for(cfg, self.model.generation_config) if sampled and cfg.sampling.n else None
        self.batch_size = cfg.batch_size if cfg.batch_size != "auto" else None  # resolved by fit
        self.settings = {"engine": "transformers", **_common_settings(cfg, setup, self.eos, device),
                         "batch_size": self.batch_size, "attn_implementation": attn, "cache": "static",
                         "compile": {"setting": cfg.compile, "on": self.compiled,
                                     **({"why_not": why_not} if why_not else {})}}
        self.setup = setup
        self.arm_settings = arm_settings
        # every batch the plan's one shape: what a compiled step needs, and what keeps rows for other stages (a model
        # left uncompiled for its sliding-window layers keeps the shape on CUDA for that)
        self.planned = self.compiled or why_not is not None
        self.shape: Shape | None = None
        self.kept: dict = {}  # prompt ids digest -> (text, n_tokens, stop): rows `take` accepted from evaluate's file
        self.filler: tuple[int, ...] | None = None
        self.stats: dict = {}

    @property
    def warm(self) -> bool:
        return self.shape in self.loaded.warm

    def close(self) -> None:
        """The ARM hook disarmed, and removed unless the model is the process's shared compiled one (`release`): the
        model generates unedited from here on."""
        if self.arm_hook is not None:
            self.arm_hook.begin([])
        if self.loaded not in _SHARED:
            self.hooks.close()

    def fit(self, groups: list[tuple[list[Item], int]], like: Shape | None = None) -> int:
        """The plan's batch size and shape from every item the stage generates, `groups`: (items, their
        max_new_tokens); recorded in `settings` (the journal's key). Without `planned` (compile off: the CPU) the
        batches keep their own widths and caches (the CPU's bytes of before); with it (compile on, a model left
        uncompiled for its sliding-window layers on CUDA, or a test) every batch gets one shape: `like` (another
        stage's shape: the sweep takes evaluate's) where every item fits in it, else the longest prompt rounded up to
        SHAPE_STEP tokens (within the context), a cache of that plus the largest max_new_tokens, and the batch size's
        rows. evaluate.batch_size auto (CUDA only, check_engine) fills the free memory."""
        groups = [(items, limit) for items, limit in groups if items]
        longest = max(len(it.input_ids) for items, _ in groups for it in items)
        limit = max(limit for _, limit in groups)
        rows = max(len(items) for items, _ in groups)
        text = self.model.config.get_text_config(decoder=True)
        width = longest
        if self.planned and like is not None and longest <= like.width and limit <= like.cache_len - like.width:
            self.shape = like
            size = like.rows
        else:
            if self.planned:
                context = getattr(text, "max_position_embeddings", None) or longest + limit
                width = max(longest, min(-(-longest // SHAPE_STEP) * SHAPE_STEP, context - limit))
            size = self.cfg.batch_size
            if size == "auto":
                size = self._auto_size(width, limit, rows)
            if self.planned:  # no more rows than the plan has: a batch size above that would only add fillers
                self.shape = Shape(min(size, rows), width, width + limit)
        self.batch_size = self.settings["batch_size"] = size
        if self.shape is not None:
            self.settings["shape"] = {"width": self.shape.width, "cache_len": self.shape.cache_len}
            self.stats["shape"] = {"rows": self.shape.rows, "width": self.shape.width,
                                   "cache_len": self.shape.cache_len}
            self.filler = groups[0][0][0].input_ids
        return size

    def _auto_size(self, width: int, limit: int, rows: int) -> int:
        import torch

        text = self.model.config.get_text_config(decoder=True)
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
        return size

    def row_key(self) -> dict | None:
        """What a kept row's tokens depend on beyond its prompt (meaningless_tokens/generations.py); None without the
        plan's one shape (after `fit`), where a row's tokens depend on its batch."""
        if self.shape is None:
            return None
        return {"version": generations.VERSION, "weights": self.setup.prepared.weights_sha256,
                # what the arithmetic sees: the shape's rows, not the batch size (auto may resolve another)
                "settings": {**{k: v for k, v in self.settings.items() if k != "batch_size"}, "rows": self.shape.rows},
                "arm_hook": self.arm_settings.describe() if self.arm_settings else None,
                "code": generations.code_digest(__name__, "meaningless_tokens.grading"),
                "machine": generations.machine(str(self.model.device))}

    def take(self, kept: generations.Kept | None) -> int:
        """Rows of another stage's run (evaluate's file) to reuse, where its key is this engine's (after `fit`) and
        MLESS_REUSE is not 0; returns how many were accepted, and says why where none."""
        self.kept = {}
        if kept is None or not generations.enabled():
            return 0
        mine = self.row_key()
        if kept.key is None or mine is None or kept.key != mine:
            why = kept.why or ("this run keeps per-batch shapes" if mine is None else
                               "its key differs: " + ", ".join(k for k in sorted(set(mine) | set(kept.key or {}))
                                                               if mine.get(k) != (kept.key or {}).get(k)))
            print(f"{self.setup.name}: evaluate's generations not reused ({why})", file=sys.stderr)
            return 0
        self.kept = kept.rows
        return len(self.kept)

    def plan_cache(self):
        """The plan shape's one cache (`plan_cache_class`), shared by the engines of the process's compiled model;
        None without a shape."""
        if self.shape is None:
            return None
        cache = self.loaded.caches.get(self.shape)
        if cache is None:
            cache = self.loaded.caches[self.shape] = plan_cache_class()(
                config=self.model.config.get_text_config(decoder=True), max_cache_len=self.shape.cache_len)
        return cache

    def warm_up(self) -> None:
        """One generate of a filler batch at the plan's shape: the decode step compiled (and its CUDA graph recorded)
        before any journaled batch, its seconds in `stats` apart from the batches'."""
        import torch

        t0 = time.perf_counter()
        generate(self.model, self.tokenizer, [Item(-1, "filler", self.filler)], WARMUP_TOKENS, False, self.eos,
                 self.arm_hook, None, self.shape, self.compile_config, self.plan_cache())
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.loaded.warm.add(self.shape)
        self.stats["warmup_seconds"] = round(time.perf_counter() - t0, 2)

    def reuse(self, batches: list[list[Item]], done: set) -> tuple[list[Generated], list[list[Item]]]:
        """The rows `take` accepted, and the rest cut anew into batches (a row's tokens are its own at a fixed shape:
        meaningless_tokens/generations.py). Without any, none, and `batches` as they are."""
        if not self.kept:
            return [], batches
        todo = [[it for it in b if it.key not in done] for b in batches]
        hits = {it.key: self.kept.get(generations.ids_digest(it.input_ids)) for b in todo for it in b
                if generations.reusable(it)}
        hits = {k: v for k, v in hits.items() if v is not None}
        self.stats["reused"] = self.stats.get("reused", 0) + len(hits)
        if hits:
            print(f"{self.setup.name}: {len(hits)} generations taken from evaluate's", file=sys.stderr)
        rest = [[it for it in b if it.key not in hits] for b in todo]
        if not any(it.condition == "arm" for b in rest for it in b):  # (ARM's pool: batch edits a batch's arm rows
            n = self.shape.rows                                          # together: their batches stay as planned)
            rest = [[it for b in rest for it in b if (it.sample >= 0) == s] for s in (False, True)]  # limits differ
            rest = [part[i:i + n] for part in rest for i in range(0, len(part), n)]
        return [(it, *hits[it.key], 0.0) for b in todo for it in b if it.key in hits], [b for b in rest if b]

    def generate(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
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
            self.stats["generated"] = self.stats.get("generated", 0) + len(batch)
            yield [(it, text, n, reason, share) for it, (text, n, reason) in zip(batch, outs)]


# ---- the backend's entry points (engines/base.py: BACKENDS) ---------------------------------------------

def check_params(cfg: Evaluate, conditions: list[str], runtime: Runtime, params_file: Path) -> None:
    """evaluate.batch_size auto needs CUDA (the device resolved here only then)."""
    if cfg.batch_size == "auto" and not models.torch_device(runtime, params_file).startswith("cuda"):
        raise ConfigError(f"{params_file}: evaluate.batch_size: auto sizes batches by free CUDA memory, and this run "
                          f"is on the CPU (runtime.device {runtime.device}); give the rows per batch as an int")


def open_engine(cfg: Evaluate, conditions: list[str], setup: models.ModelSetup,
                arm_settings: arm.ArmSettings | None = None, sampled: bool = True) -> TransformersEngine:
    return TransformersEngine(cfg, setup, arm_settings, sampled)
