"""Attention probabilities of chosen layers, captured through transformers' attention interface.

A registered attention function calls the model family's own `eager_attention_forward` (so every
family's scaling, softcapping, sinks and masks are the model's), keeps the probabilities of the
requested layers and stops the forward pass after the last of them. `probe` checks that a model
works this way before any long work: the captured weights must equal the model's own eager
`output_attentions`, be causal and have rows that sum to one.
"""

from __future__ import annotations

import contextlib
import math
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field

from meaningless_tokens.errors import CaptureError, StopForward

CAPTURE = "mless_capture"
TOLERANCE = 1e-6  # captured vs eager output_attentions, and |row sum - 1|
PROBE_VERSION = 2  # bump when the probe's checks change (its result is memoized per weights)


@dataclass
class _Request:
    layers: frozenset[int]
    last: int
    captured: dict = field(default_factory=dict)
    seen: list = field(default_factory=list)


_REQUEST: ContextVar[_Request | None] = ContextVar("mless_capture_request", default=None)


def _fp32_probs(module, query, key, attention_mask, scaling, softcap=None):
    """Probabilities recomputed in float32: the eager path casts them back to a bf16/fp16 model dtype."""
    import torch

    from transformers.models.llama.modeling_llama import repeat_kv

    k = repeat_kv(key, query.shape[1] // key.shape[1]).float()
    scores = torch.matmul(query.float(), k.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : k.shape[-2]].float()
    return torch.softmax(scores, dim=-1)


def _capture(module, query, key, value, attention_mask, **kwargs):
    family = sys.modules[type(module).__module__]
    eager = getattr(family, "eager_attention_forward", None)
    if eager is None:
        raise CaptureError(f"{type(module).__module__} has no eager_attention_forward (attention of its own)")
    layer_idx = getattr(module, "layer_idx", None)
    if layer_idx is None:
        raise CaptureError(f"{type(module).__name__} has no layer_idx")
    # the model family's own eager attention: identical to `attn_implementation="eager"`
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    request = _REQUEST.get()
    if request is not None:
        request.seen.append(layer_idx)
        if layer_idx in request.layers:
            if weights is None:
                raise CaptureError(f"{type(module).__module__}.eager_attention_forward returns no probabilities")
            if weights.dtype.itemsize < 4:
                if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
                    raise CaptureError("attention sinks in a half-precision model: run it in float32")
                weights = _fp32_probs(module, query, key, attention_mask, kwargs.get("scaling", module.scaling),
                                      kwargs.get("softcap"))
            request.captured[layer_idx] = weights[0].detach().float()
        if layer_idx >= request.last:
            raise StopForward
    return out, weights


def install_capture(model):
    """Switch `model` to the capturing attention (eager math; the eager mask, incl. sliding windows). Returns the
    undo (meaningless_tokens/hooks.py runs it when its block ends): the model's previous attention implementation
    back, and the interfaces' entries dropped when this call made them (a capture another caller installed before
    stays)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    previous = model.config._attn_implementation
    ours = [i for i in (AttentionInterface, AttentionMaskInterface) if CAPTURE not in i._global_mapping]
    AttentionInterface.register(CAPTURE, _capture)
    # without the eager mask function the custom attention gets attention_mask=None for an unpadded
    # batch and silently computes non-causal probabilities
    AttentionMaskInterface.register(CAPTURE, eager_mask)
    model.set_attn_implementation(CAPTURE)

    def undo() -> None:
        if previous != CAPTURE:
            model.set_attn_implementation(previous)
        for interface in ours:
            interface._global_mapping.pop(CAPTURE, None)

    return undo


def registered() -> list[str]:
    """The transformers interfaces that hold this module's capturing attention (none once every block is closed)."""
    from transformers import AttentionInterface, AttentionMaskInterface

    return [i.__name__ for i in (AttentionInterface, AttentionMaskInterface) if CAPTURE in i._global_mapping]


@contextlib.contextmanager
def capturing(layers, stop_after_attention: bool = True):
    """Capture the attention probabilities of `layers` in the forward passes inside the block (a model
    set up by `install_capture`); with `stop_after_attention`, StopForward ends the pass right after
    the attention of max(layers), before its MLP. Yields the request (`.captured`: {layer: [H, T, T]})."""
    request = _Request(frozenset(layers), max(layers) if stop_after_attention else sys.maxsize)
    token = _REQUEST.set(request)
    try:
        yield request
    finally:
        _REQUEST.reset(token)


def prompt_inputs(model, input_ids) -> dict:
    """One prompt's decoder inputs on the model's device: its ids (one upload) and an all-ones attention mask made
    there. With no mask transformers looks for packed sequences in the positions, a host sync per mask type at
    every forward; the all-ones mask gives the same causal (and sliding-window) mask."""
    import torch

    ids = torch.tensor([list(input_ids)], device=model.device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def attention(model, input_ids, layers) -> dict:
    """{layer: float32 tensor [heads, T, T]} for one prompt, running the decoder up to max(layers)."""
    import torch

    inputs = prompt_inputs(model, input_ids)
    with capturing(layers) as request:
        try:
            with torch.no_grad():
                model.get_decoder()(**inputs, use_cache=False)
        except StopForward:
            pass
    missing = sorted(set(layers) - set(request.captured))
    if missing:
        how = ("its attention modules never call transformers' attention interface" if not request.seen
               else f"the attention interface saw layers {sorted(set(request.seen))}")
        raise RuntimeError(f"attention of layers {missing} was not captured ({how}; "
                           f"attn_implementation={model.config._attn_implementation!r})")
    return request.captured


def compare(model, input_ids, layers, tolerance: float = TOLERANCE) -> dict:
    """Capture `layers` and compare with the model's own eager `output_attentions` on `input_ids`.

    Leaves the model switched to the capturing attention. Raises CaptureError with the reason when
    the weights differ by more than `tolerance`, are not causal, or rows do not sum to one (in a
    bf16/fp16 model the eager probabilities are rounded to that dtype, the captured ones are not)."""
    import torch

    install_capture(model)
    try:
        captured = attention(model, input_ids, layers)
    except RuntimeError as e:
        raise CaptureError(str(e).split("; attn_implementation")[0] + ")") from None
    model.set_attn_implementation("eager")
    ids = torch.tensor([list(input_ids)], device=model.device)
    try:
        with torch.no_grad():
            ref = model.get_decoder()(input_ids=ids, use_cache=False, output_attentions=True).attentions
    except Exception as e:  # noqa: BLE001 - any failure of the plain eager forward refuses the model
        raise CaptureError(f"eager forward with output_attentions failed: {type(e).__name__}: {e}") from None
    finally:
        install_capture(model)
    if not ref or len(ref) <= max(layers) or any(ref[i] is None for i in layers):
        raise CaptureError(f"eager output_attentions returned {len(ref or ())} layers, not {max(layers) + 1}")
    T = len(input_ids)
    above = torch.triu(torch.ones(T, T, dtype=torch.bool, device=model.device), diagonal=1)
    diff = rows = 0.0
    for layer in layers:
        got, want = captured[layer], ref[layer][0].float()
        if got.shape != want.shape:
            raise CaptureError(f"layer {layer}: captured shape {tuple(got.shape)} != eager {tuple(want.shape)}")
        for what, t in (("captured", got), ("eager", want)):  # max() with a NaN would pass it as "diff 0"
            bad = ~torch.isfinite(t)
            if bad.any():
                first = [int(i) for i in bad.nonzero()[0].tolist()]
                raise CaptureError(f"layer {layer}: {what} attention holds non-finite values ({int(bad.sum())} of "
                                   f"{t.numel()}, the first at [head, query, key] {first}): damaged weights?")
        diff = max(diff, (got - want).abs().max().item())
        rows = max(rows, (got.sum(-1) - 1).abs().max().item())
        if got[:, above].abs().max().item() > 0:
            raise CaptureError(f"layer {layer}: non-causal attention (queries attend to later positions)")
    if diff > tolerance:
        raise CaptureError(f"captured weights differ from eager output_attentions by {diff:.3g} (> {tolerance:g})")
    if rows > TOLERANCE:
        raise CaptureError(f"attention rows sum to 1 only within {rows:.3g} (> {TOLERANCE:g})")
    # the row-sum error is float32 rounding (about 1e-7) and may differ between CPUs: recorded as the
    # power of ten it stays below, so that manifests are identical on every machine
    below = 10.0 ** math.ceil(math.log10(rows)) if rows > 0 else 0.0
    return {"layers": list(layers), "prompt_tokens": T, "max_abs_diff": diff, "max_row_sum_error_below": below,
            "tolerance": tolerance}


def probe_layers(facts: dict) -> list[int]:
    """Layer 0 and the first layer of every other layer type (a sliding and a full layer, say)."""
    types = facts.get("layer_types") or []
    firsts = {}
    for i, t in enumerate(types):
        firsts.setdefault(t, i)
    return sorted({0, *firsts.values()})


def probe_ids(vocab_size: int, n: int = 32) -> list[int]:
    """A fixed prompt of `n` ordinary token ids (no tokenizer needed: the probe checks arithmetic)."""
    start = min(vocab_size // 4, 1000)
    span = max(1, min(vocab_size - start, 5000))
    return [start + (7919 * k) % span for k in range(n)]
