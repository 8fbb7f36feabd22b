"""Host-device synchronisations of the hot loops, counted on the CPU.

On a GPU every copy of a device tensor to the host (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, a tensor's
truth value or number, `nonzero`) and every blocking upload (`torch.tensor(..., device=...)`) waits for the
device. The CUDA tier (`tests/test_cuda.py`) counts them with torch's sync debug mode on a GPU; this file counts
the Python-level calls that would be such a synchronisation, on the CPU, in the loops of extract, activations
and generation (the model's set-up and load are not counted), and checks that they are a constant per prompt or
per decode step that does not grow with the number of layers.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys

import pytest
import torch

from meaningless_tokens import engines, models
from meaningless_tokens.config import load_params
from stages import activations, extract
from tests import tiny
from tests.test_extract import tiny_params

# the Tensor methods that copy a device tensor's values to the host
SYNCING_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero")

# the budgets, per prompt and per decode step (docs/gpu.md, "The CUDA test tier"); `.cpu()` and `.numpy()` of one copy
# count twice here (the second is free on a GPU: its tensor is on the host by then)
# extract: the upload of the prompt's ids (1) and the copy of
# the prompt's stacked [layer, head, T, T] weights (.cpu and .numpy: 2)
EXTRACT_PER_PROMPT = 1 + 2
# activations: the same, the copy being the prompt's attention, a and z packed in one buffer
ACTIVATIONS_PER_PROMPT = 1 + 2
# generation, per decode step: transformers' end-of-sequence check and the boxed stop's copy of the step's new tokens;
# per batch: transformers' set-up (its special tokens' uploads and checks of them, 9 in this version) and the copy of
# the outputs (1)
GEN_PER_STEP = 1 + 1
GEN_PER_BATCH = 9 + 1


class Syncs:
    """Counts the calls that would synchronise on a GPU while `counting`; `paused()` stops counting inside."""

    def __init__(self):
        self.counting = False
        self.where: collections.Counter = collections.Counter()

    @property
    def count(self) -> int:
        return sum(self.where.values())

    def hit(self, what: str) -> None:
        if self.counting:
            frame = sys._getframe(2)
            self.where[f"{what} at {frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}"] += 1

    @contextlib.contextmanager
    def on(self):
        self.where.clear()
        self.counting = True
        try:
            yield self
        finally:
            self.counting = False

    def paused(self, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            was, self.counting = self.counting, False
            try:
                return fn(*args, **kwargs)
            finally:
                self.counting = was
        return call


@pytest.fixture
def syncs(monkeypatch) -> Syncs:
    """The syncing calls wrapped (the originals run unchanged); the model's set-up and load paused."""
    s = Syncs()

    def method(name, orig):
        def wrapper(self, *args, **kwargs):
            s.hit(name)
            return orig(self, *args, **kwargs)
        return wrapper

    for name in SYNCING_METHODS:
        monkeypatch.setattr(torch.Tensor, name, method(name, getattr(torch.Tensor, name)))

    def counted(orig, what, wanted):
        def wrapper(*args, **kwargs):
            if wanted(args, kwargs):
                s.hit(what)
            return orig(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(torch, "nonzero", counted(torch.nonzero, "torch.nonzero", lambda a, k: True))
    monkeypatch.setattr(torch, "tensor", counted(torch.tensor, "torch.tensor(device=)",
                                                 lambda a, k: k.get("device") is not None))
    for name in ("setup_for", "load"):
        monkeypatch.setattr(models, name, s.paused(getattr(models, name)))
    return s


def _report(s: Syncs) -> str:
    return "\n".join(f"{n:4d}  {w}" for w, n in s.where.most_common())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_extract_copies_once_per_prompt(arch, tiny_dirs, write_params, cache_dir, tmp_path, syncs, monkeypatch):
    monkeypatch.setattr(extract, "compare", syncs.paused(extract.compare))  # the one-off probe, once per layer set
    counts = {}
    for layers in ([0], [0, 1, 2, 3]):
        params = tiny_params(write_params, tiny_dirs, arch, n_samples=2, layers=layers)
        with syncs.on():
            extract.run(params, "tiny", root=tmp_path / str(len(layers)))
        counts[len(layers)] = (syncs.count, _report(syncs))
    prompts = 2 * 3  # none, mless, mful
    assert counts[1][0] == counts[4][0], f"the count grows with the layers:\n{counts[1][1]}\n---\n{counts[4][1]}"
    assert counts[4][0] <= prompts * EXTRACT_PER_PROMPT, counts[4][1]


def test_activations_copy_once_per_prompt(tiny_dirs, write_params, cache_dir, tmp_path, syncs):
    counts = {}
    for layers in ([0], [0, 1, 2, 3]):
        raw = tiny_params(write_params, tiny_dirs, "llama", n_samples=2).model_dump()
        raw["activations"].update(layers=layers, n_boot=20, showcase=1)
        raw["prompt"]["conditions"] = ["none", "mless", "mful"]
        params = load_params(write_params(raw))
        with syncs.on():
            activations.run(params, "tiny", root=tmp_path / str(len(layers)))
        counts[len(layers)] = (syncs.count, _report(syncs))
    prompts = 2 * 3
    assert counts[1][0] == counts[4][0], f"the count grows with the layers:\n{counts[1][1]}\n---\n{counts[4][1]}"
    assert counts[4][0] <= prompts * ACTIVATIONS_PER_PROMPT, counts[4][1]


def _old_boxed_stop(tok, prompt_len, input_ids) -> list[bool]:
    """The criterion as first written: every row's whole text decoded and checked at every step."""
    from meaningless_tokens.grading import has_complete_box

    texts = tok.batch_decode(input_ids[:, prompt_len:], skip_special_tokens=True)
    return [has_complete_box(t) for t in texts]


BOX_TEXTS = ["so \\boxed{12} done", "\\boxed{\\frac{1}{2}} and more", "x}} \\boxed{", "\\fbox{3} then",
             "a{b}c \\boxed{{x}}y", "\\boxed{1 and more", "}{\\boxed{}}", "é}ü \\boxed{é}", "\\boxed", "no box at all"]


def test_the_boxed_stop_decides_as_decoding_every_row_at_every_step(tiny_dirs):
    """Step by step, on texts whose boxes close across tokens, nest, stay open or never open, rows ending early
    (end-of-text, then padding) and random token strings rich in braces: the same flags as decoding every row's
    whole text at every step; also when the whole continuation comes in one call."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    prompt = tok("question:")["input_ids"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in BOX_TEXTS]
    rows[1] = rows[1][:9] + [tok.eos_token_id]  # ends before its box closes; padded after
    pieces = [i for i in range(len(tok)) if any(c in tok.decode([i]) for c in "{}\\bx")]
    draw = random.Random(0)
    rows += [[draw.choice(pieces) for _ in range(draw.randint(5, 30))] for _ in range(40)]
    width = max(map(len, rows))
    gen = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    ids = torch.cat([torch.tensor([prompt] * len(rows)), gen], dim=1)
    stop = engines._BoxedStop(tok, len(prompt))
    decided = []
    for step in range(1, width + 1):
        now = ids[:, :len(prompt) + step]
        want = _old_boxed_stop(tok, len(prompt), now)
        assert stop(now, None).tolist() == want, step
        decided.append(want)
    assert any(decided[-1]) and not all(decided[-1])
    assert decided[-1][:5] == [True, False, False, True, True]
    assert engines._BoxedStop(tok, len(prompt))(ids, None).tolist() == decided[-1]


def _generate_counting(syncs, monkeypatch, model, tok, steps: int) -> tuple[int, int, str]:
    """(syncs counted, decode steps run, where) for one batch of three prompts of different lengths."""
    calls = []
    criterion = engines._BoxedStop.__call__
    monkeypatch.setattr(engines._BoxedStop, "__call__", lambda self, *a, **k: calls.append(1) or criterion(self, *a, **k))
    batch = [engines.Item(k, "none", tuple(tok(text)["input_ids"]))
             for k, text in enumerate(["What is 1+1?", "Please reason step by step. What is 2+3?", "x"])]
    eos = engines.stop_ids(model.generation_config, tok)
    with syncs.on():
        engines.generate(model, tok, batch, steps, True, eos)
    return syncs.count, len(calls), _report(syncs)


@pytest.fixture(scope="module")
def llama_two_layers(tmp_path_factory):
    return tiny.build("llama", tmp_path_factory.mktemp("syncs") / "llama2", layers=2)


def test_generation_syncs_a_constant_per_decode_step(tiny_dirs, llama_two_layers, write_params, cache_dir, syncs,
                                                      monkeypatch):
    """Without arm rows (ARM's hook is counted by its own tests): per decode step transformers' end-of-sequence
    check and the boxed stop's one copy of the new tokens, on 2 and 4 layers alike; per batch a fixed set-up (the
    ids' and mask's uploads, the cache) and the copy of the outputs."""
    per_step = {}
    for label, folder in (("2 layers", llama_two_layers), ("4 layers", tiny_dirs["llama"])):
        params = tiny_params(write_params, {"llama": folder}, "llama", n_samples=2, layers=[0, 1])
        model, tok, _ = engines.load_for_generation(models.setup_for(params, "tiny"))
        short, n_short, where_short = _generate_counting(syncs, monkeypatch, model, tok, 4)
        long, n_long, where_long = _generate_counting(syncs, monkeypatch, model, tok, 12)
        assert n_long > n_short, (n_short, n_long)  # random weights: no end-of-text in the first steps
        per_step[label] = (long - short) / (n_long - n_short)
        assert per_step[label] <= GEN_PER_STEP, f"{label}:\n{where_short}\n---\n{where_long}"
        assert long - GEN_PER_STEP * n_long <= GEN_PER_BATCH, where_long
    assert per_step["2 layers"] == per_step["4 layers"], per_step


def test_a_reused_plan_cache_gives_each_prefill_a_host_length(tiny_dirs, write_params, cache_dir, monkeypatch):
    """The plan's one cache, reused (reset) by every batch: transformers' prefill first reads its `get_seq_length()` to
    slice the prompt, and a reset static layer would answer with its device counter, which the slice copies to the
    host (a sync per batch on CUDA, which a Tensor method patch on the CPU does not see: the answer's type is checked).
    The first read of each of three batches gets a host 0, the cache being the same object throughout. (Later reads,
    the masks' query offset at each step, stay device tensors that no host code reads.)"""
    from tests.test_engine_shapes import engine_and_items, shape_params

    engine, items = engine_and_items(shape_params(write_params, tiny_dirs, max_new_tokens=4, batch_size=3))
    engine.planned = True  # the compiled path's shape and cache, without compiling
    first = []
    with engine:
        engine.fit([(items, 4)])
        cache = engine.plan_cache()
        cls = type(cache)
        original = cls.get_seq_length

        def recorded(self, *args, **kwargs):
            answer = original(self, *args, **kwargs)
            if first[-1] is None:
                first[-1] = answer
            return answer
        monkeypatch.setattr(cls, "get_seq_length", recorded)
        none = [it for it in items if it.condition == "none"]
        for batch in (none[:3], none[3:] + none[:1], none[1:3]):
            first.append(None)
            list(engine.generate([batch], set()))
            assert engine.plan_cache() is cache
    assert all(type(a) is int and a == 0 for a in first), first
