"""ARM's hook traced by torch.compile at decode steps (meaningless_tokens/arm/, ArmHook.traced): its edits equal the
eager hook's exactly, and transformers' compiled decode step with the hook inside is one graph without a break for
every step and every batch of one shape, generating the tokens of the uncompiled run. On the CPU with dynamo's
`eager` backend (no inductor, no C++ compiler), on a tiny llama (both ARM variants: the edit is the same code on any
family; Gemma 3's sliding-window cache layers guard on a Python int that changes at every step, transformers' own
recompile, unrelated to the hook)."""

import numpy as np
import pytest
import torch

from meaningless_tokens import arm, draws, engines, hooks, models
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500
from meaningless_tokens.prompts import builder_for
from tests.test_arm import SEED, settings

VARIANTS = [("llama", 0.13, 99.5), ("gemma", 0.25, 0.85)]


def act_fn_mlp():
    mlp = torch.nn.Module()
    mlp.act_fn = torch.nn.SiLU()
    return mlp


@pytest.mark.parametrize("variant, c, percentage", VARIANTS)
@pytest.mark.parametrize("keep", [[1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]])
def test_edit_pooled_equals_edit_of_the_kept_rows(variant, c, percentage, keep):
    """Counts as tensors, other rows at +inf in one sort: the same order statistics, share, cut, ties and draws as
    `edit` of the kept rows in batch order; the other rows keep their values, all of them without a kept row. Ties
    (a coarse grid of values) put elements at the cut and at the quantiles."""
    rng = np.random.default_rng(sum(keep) + len(variant))
    keep = torch.tensor(keep, dtype=torch.bool)
    for v in (torch.from_numpy(rng.standard_normal((6, 1, 48)).astype(np.float32)),
              torch.from_numpy(np.round(rng.standard_normal((6, 1, 48)) * 4).astype(np.float32) / 4),
              torch.from_numpy(rng.standard_normal((6, 1, 48)).astype(np.float32)).to(torch.bfloat16)):
        for pmin, pmax in ((0.02, 0.25), (0.2, 0.2)):
            s = settings(variant, c, percentage, pmin=pmin, pmax=pmax, pool="batch")
            state = draws.stream(SEED, [(3,), (9, 1)], 5)
            out = arm.edit_pooled(v, keep, s, draws.lanes([state])[0])
            assert torch.equal(out[keep], arm.edit(v[keep], s, state))
            assert torch.equal(out[~keep], v[~keep])
            assert not torch.equal(out[keep], v[keep])
            assert torch.equal(arm.edit_pooled(v, torch.zeros(6, dtype=torch.bool), s, draws.lanes([state])[0]), v)


@pytest.mark.parametrize("variant, c, percentage", VARIANTS)
@pytest.mark.parametrize("pool", ["row", "batch"])
def test_the_traced_step_edits_what_the_eager_step_does(variant, c, percentage, pool):
    """ArmHook.traced (what torch.compile traces, here run eagerly) at decode steps 1..3: every arm row's values
    equal the eager hook's, the other rows untouched; both advance the one clock."""
    s = settings(variant, c, percentage, pool=pool)
    eager, traced = arm.ArmHook(act_fn_mlp(), s), arm.ArmHook(act_fn_mlp(), s)
    rows = [None, 4, (2, 1), None, 7, None]
    valid = torch.ones(6, 5, dtype=torch.bool)
    valid[::2, :2] = False
    torch.manual_seed(5)
    prompt = torch.randn(6, 5, 32)
    for hook in (eager, traced):
        hook.begin(rows, valid)
        hook(None, (), prompt)
    for step in (1, 2, 3):
        d = torch.randn(6, 1, 32)
        want, got = eager(None, (), d), traced.traced(d)
        assert torch.equal(got, want) and traced.clock == eager.clock == step + 1
        assert torch.equal(got[[0, 3, 5]], d[[0, 3, 5]]) and not torch.equal(got[[1, 2, 4]], d[[1, 2, 4]])


# ---- compiled decode through transformers' generate, tiny llama ------------------------------------------------

def counting_backend(graphs: list):
    """A dynamo backend appending each graph handed to it to `graphs` and running it as traced (dynamo's `eager`);
    a function, not an object: CompileConfig deep-copies its fields, and a copy would count apart."""
    def backend(gm, example_inputs, **kwargs):
        graphs.append(gm)
        return gm.forward

    return backend


def generate_batches(model, tokenizer, eos, hook, batches, shape, compile_config):
    from transformers import StaticCache

    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=shape.cache_len)
    return [engines.generate(model, tokenizer, b, shape.cache_len - shape.width, False, eos, hook, None, shape,
                             compile_config, cache) for b in batches]


@pytest.mark.parametrize("variant", ["llama", "gemma"])
@pytest.mark.parametrize("pool", ["row", "batch"])
def test_compiled_decode_traces_the_hook_once_for_every_step_and_batch(variant, pool, tiny_dirs, write_params,
                                                                       cache_dir):
    """fullgraph=True (any graph break is an error) over three batches of one shape whose arm rows differ (places and
    count, none at all): one graph, the edit in it, for all their decode steps; the tokens of the uncompiled run."""
    from transformers import CompileConfig

    raw = load_params(write_params()).model_dump()
    raw["runtime"]["threads"] = 1
    raw["prompt"]["conditions"] = ["none", "arm"]
    raw["arm"].update(pool=pool, variant=variant)
    raw["models"] = {"tiny": {"display_name": "Tiny llama", "family": "llama",
                              "source": {"kind": "local_dir", "path": str(tiny_dirs["llama"])}}}
    params = load_params(write_params(raw))
    setup = models.setup_for(params, "tiny")
    model, tokenizer = models.load(setup, attn_implementation=engines.ATTENTION)
    s = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    hook = hooks.Hooks().arm(arm.ArmHook(arm.layer0_mlp(model, setup), s))
    eos = engines.stop_ids(model.generation_config, tokenizer)
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    built = {p.index: builder.build(p) for p in problems[:6]}
    item = lambda i, c: engines.Item(i, c, built[i][c].input_ids)  # noqa: E731
    idx = list(built)
    batches = [[item(idx[0], "arm"), item(idx[1], "none"), item(idx[2], "arm"), item(idx[3], "none")],
               [item(idx[4], "none"), item(idx[5], "arm"), item(idx[1], "arm"), item(idx[3], "arm")],
               [item(idx[2], "none"), item(idx[0], "none")]]  # no arm row, filler rows (the engine's warm-up)
    width = max(len(it.input_ids) for b in batches for it in b)
    shape = engines.Shape(4, width, width + 6)
    eager = generate_batches(model, tokenizer, eos, hook, batches, shape, None)
    graphs = []
    config = CompileConfig(fullgraph=True, dynamic=False, backend=counting_backend(graphs), mode=None)
    config._compile_all_devices = True  # transformers compiles on CUDA alone otherwise
    torch._dynamo.reset()
    try:
        compiled = generate_batches(model, tokenizer, eos, hook, batches, shape, config)
    finally:
        torch._dynamo.reset()
    assert compiled == eager
    assert len(graphs) == 1, f"{len(graphs)} graphs: a recompile per step or per batch"
    assert "kthvalue" in graphs[0].code or "sort" in graphs[0].code, "the edit is not in the graph"
    # the comparison means something: ARM changed the arm rows' tokens
    none = generate_batches(model, tokenizer, eos, None,
                            [[engines.Item(it.index, "none", it.input_ids) for it in b] for b in batches], shape, None)
    assert none != eager
