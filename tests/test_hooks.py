"""hooks.Hooks: every hook and the capturing attention removed on every way out of a block, and after each stage
that hooks a model (activations, likelihood, arm_tuning, evaluate) the stage's model is left bare."""

import pytest
import torch

from meaningless_tokens import arm, capture, engines, hooks, models, scoring
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import StopForward
from stages import activations, arm_tuning, evaluate, likelihood
from tests.test_activations import act_params
from tests.test_arm import arm_params, settings
from tests.test_arm_tuning import tuning_params
from tests.test_likelihood import lik_params


def hooked(model) -> list[str]:
    """The modules of `model` that still hold a forward hook."""
    return [name for name, m in model.named_modules() if m._forward_hooks]


def bare(model) -> None:
    """No hook and no capturing attention on `model` (prepare's probe may keep the interface registered)."""
    assert hooked(model) == []
    assert model.config._attn_implementation != capture.CAPTURE


def gated():
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.act_fn = torch.nn.Linear(4, 6), torch.nn.SiLU()
    return mlp


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, StopForward])
def test_every_hook_is_removed_when_the_block_raises(exc):
    mlps = [gated(), gated()]
    with pytest.raises(exc):
        with hooks.Hooks() as h:
            h.arm(arm.ArmHook(mlps[0], settings("llama", 0.13, 99.5)))
            h.arm(scoring.TeacherForcedArm(mlps[1], settings("llama", 0.13, 99.5)))
            a, z = h.capture_mlp(mlps, [0, 1])
            h.stop_after(mlps[1].act_fn)
            assert all(m.act_fn._forward_hooks for m in mlps)
            with pytest.raises(StopForward):
                mlps[1].act_fn(mlps[1].gate_proj(torch.ones(2, 4)))
            assert set(a) == set(z) == {1}
            raise exc
    assert all(not m._forward_hooks for mlp in mlps for m in mlp.modules())


def test_the_arm_edit_sits_before_a_later_capture_and_close_twice_is_harmless():
    mlp = gated()
    s = settings("llama", 0.13, 99.5, pmin=0.1)
    h = hooks.Hooks()
    edit = h.arm(arm.ArmHook(mlp, s))
    a, _ = h.capture_mlp([mlp], [0])
    edit.begin([3])
    x = mlp.gate_proj(torch.randn(1, 5, 4))
    out = mlp.act_fn(x)
    assert torch.equal(a[0], out[0]) and not torch.equal(out, torch.nn.functional.silu(x))  # the capture sees the edit
    h.close()
    h.close()
    assert not mlp.act_fn._forward_hooks
    assert torch.equal(mlp.act_fn(x), torch.nn.functional.silu(x))


def test_the_capturing_attention_is_undone_with_the_block(tiny_dirs, write_params, cache_dir):
    params = act_params(write_params, tiny_dirs, "llama")
    model, _ = models.load(models.setup_for(params, "tiny"))
    before, registered = model.config._attn_implementation, capture.registered()
    with pytest.raises(RuntimeError):
        with hooks.Hooks() as h:
            h.attention(model)
            assert len(capture.registered()) == 2 and model.config._attn_implementation == capture.CAPTURE
            raise RuntimeError
    bare(model)
    assert model.config._attn_implementation == before and capture.registered() == registered


@pytest.fixture
def loads(monkeypatch):
    """The models the stages load, kept to look at after the stage."""
    seen = []

    def keep(module, name):
        load = getattr(module, name)

        def wrapped(*a, **kw):
            out = load(*a, **kw)
            seen.append(out[0])
            return out

        monkeypatch.setattr(module, name, wrapped)

    keep(models, "load")
    keep(scoring, "load")
    keep(engines, "load_for_generation")
    return seen


def test_the_activations_stage_leaves_its_model_bare(tiny_dirs, write_params, cache_dir, tmp_path, loads):
    raw = act_params(write_params, tiny_dirs, "llama", showcase=0).model_dump()
    raw["prompt"]["conditions"] = ["none", "mless", "arm"]
    activations.run(load_params(write_params(raw)), "tiny", root=tmp_path)
    assert len(loads) == 1
    bare(loads[0])


def test_the_likelihood_stage_leaves_its_model_bare(tiny_dirs, write_params, cache_dir, tmp_path, loads):
    params = lik_params(write_params, tiny_dirs, "llama", conditions=["none", "arm"], n_samples=2, solution_tokens=8)
    likelihood.run(params, "tiny", root=tmp_path)
    assert loads
    for model in loads:
        bare(model)


def test_the_arm_tuning_stage_leaves_its_model_bare(tiny_dirs, write_params, cache_dir, tmp_path, loads):
    arm_tuning.run(tuning_params(write_params, tiny_dirs), "tiny", root=tmp_path)
    assert loads
    for model in loads:
        bare(model)


def test_the_evaluate_stage_and_its_engine_leave_the_model_bare(tiny_dirs, write_params, cache_dir, tmp_path, loads):
    params = arm_params(write_params, tiny_dirs, "llama", conditions=("none", "arm"), n_samples=2, max_new_tokens=4)
    evaluate.run(params, "tiny", root=tmp_path)
    assert loads
    for model in loads:
        bare(model)
    # an engine used as a block: its ARM hook is removed even when the block raises
    setup = models.setup_for(params, "tiny")
    with pytest.raises(KeyboardInterrupt):
        with engines.open_engine(params.evaluate, ["none", "arm"], setup,
                                 arm.settings_for(params.arm, params.dataset.benchmark, setup)) as engine:
            assert hooked(engine.model) == ["model.layers.0.mlp.act_fn"]
            raise KeyboardInterrupt
    bare(engine.model)
