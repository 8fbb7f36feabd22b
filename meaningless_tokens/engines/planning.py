"""The transformers backend's plan: the one prompt width a planned stage pads to, whether evaluate.compile is on for a
model, and the batch size evaluate.batch_size auto fits in free CUDA memory."""

from __future__ import annotations

import sys

SHAPE_STEP = 256      # a planned stage's prompt width: its longest prompt rounded up to a multiple of this; coarse, so
                      # that evaluate and the sweep (whose longest prompt is a few span tokens longer) share a shape
WARMUP_TOKENS = 4     # the warm-up's new tokens: the decode step compiled, then (CUDA graphs) recorded and replayed
MEMORY_MARGIN = 0.8   # the share of free CUDA memory evaluate.batch_size auto plans to fill

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
