"""The transformers backend's generation loop: greedy (`do_sample=False`, set explicitly: instruct checkpoints would
otherwise sample by their generation_config) or seeded sampling, batched with left padding, SDPA attention and a
static cache sized per batch (a dynamic cache re-concatenates every layer's keys and values at each step: half of the
CPU time at batch 12; outputs were identical), optionally stopping a row once it has written a complete \\boxed{...}
(`_BoxedStop`); the plan's cache class for a compiled step; loading a model for generation."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from meaningless_tokens import models, sampling
from meaningless_tokens.engines.base import Item
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.generations import Shape
from meaningless_tokens.grading import has_complete_box

if TYPE_CHECKING:
    from meaningless_tokens import arm


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
