"""The transformers engine: generation and teacher-forced scoring on a model loaded in this process.

Generation runs generation.py's loop (greedy or seeded sampling, left padding, a static cache, the boxed stop) over
the static batches; `arm` rows are edited by the ARM hook (meaningless_tokens/arm/). With evaluate.compile on (CUDA by
default) the decode step is compiled and sees the plan's shapes alone (planning.py): one prompt width and cache
length per stage, short batches filled to the batch size (`TransformersEngine.fit`); at that shape a row's tokens
are its own, and greedy unedited rows are kept across stages (meaningless_tokens/generations.py). Sampled rows draw
each token with their own seed (meaningless_tokens/sampling.py). Engines of one key share one loaded model in a
process (`_SHARED`; `release()`).

Scoring (`loglikelihood`): engines/scorer.py's, on the engine's model (the likelihood stages open that module's
`TransformersScorer`, without evaluate's generation settings).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from meaningless_tokens import arm, generations, hooks, models, sampling
from meaningless_tokens.config import Evaluate, Runtime
from meaningless_tokens.engines.base import Closing, Generated, Item, _common_settings
from meaningless_tokens.engines.generation import generate, load_for_generation, plan_cache_class, stop_ids
from meaningless_tokens.engines.planning import (MEMORY_MARGIN, SHAPE_STEP, WARMUP_TOKENS, auto_batch_size, compile_for,
                                                 kv_bytes_per_token, row_bytes)
from meaningless_tokens.engines.scorer import Likelihood
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.generations import Shape

if TYPE_CHECKING:
    from pathlib import Path

# transformers' CompileConfig for a compiled decode step: static shapes (the plan gives one shape; the ARM hook traces
# into the graph: arm.ArmHook.traced), transformers' defaults otherwise (inductor, reduce-overhead: CUDA graphs). A
# harness may swap the backend in-process (tests, `make gpu-check TINY=1`: dynamo's eager backend, no C++ build).
COMPILE_OPTIONS = {"fullgraph": False, "dynamic": False}
# inductor's settings for that step, set for the process when an engine compiles: a fused kernel otherwise keeps a
# bfloat16 intermediate unrounded (SiLU's output computed in float32), so the ARM edit would sort values the eager
# step never sees and move other elements (tests/test_cuda.py; on the CPU's inductor: llama's moved sets 3 elements
# apart in 2 of 9 row-steps without it, bit for bit with it)
INDUCTOR_CONFIG = {"emulate_precision_casts": True}


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
                "code": generations.code_digest(__name__, "meaningless_tokens.engines.generation",
                                                "meaningless_tokens.grading"),
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
