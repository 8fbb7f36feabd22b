"""ARM (meaningless_tokens/arm.py): the edit against the paper's pseudo-code, the hook's row isolation, seeding, an
identity hook that changes nothing, and bad input refused before any work."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meaningless_tokens import arm, engines, models
from stages import activations, evaluate
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.prompts import builder_for, dataset_spec, load_math500
from meaningless_tokens.store import read_h5

SEED = 1234


# ---- the edit on fixed tensors against a direct implementation of the paper's pseudo-code ---------------

def paper_llama(a, c, percentage, k, pmin, pmax, u):
    """notes/paper-method.md section 2, Qwen2/Llama variant, in numpy; `u(n)` gives the n uniforms."""
    x = a.ravel().astype(np.float32)
    absx = np.abs(x)
    med = np.sort(absx)[(x.size - 1) // 2]                                # torch.median: the lower median
    mad = max(np.sort(np.abs(absx - med))[(x.size - 1) // 2], np.float32(1e-12))
    eps = np.float32(np.float32(1.4826) * mad) * np.float32(c)
    share = np.float32(np.mean(absx < eps))
    frac = float(np.clip(np.float32(k) * share, np.float32(pmin), np.float32(pmax)))
    n = max(1, int(round(frac * x.size)))
    top = np.percentile(x, percentage)
    neg = abs(x[x < 0].min()) if (x < 0).any() else 0.0
    idx = np.sort(np.argsort(absx, kind="stable")[:n])  # ties at the cut by position; draws in position order
    s = np.sign(x[idx])
    s[s == 0] = 1
    uu = u(n)
    out = x.copy()
    out[idx] = s * np.where(s > 0, uu * top, uu * neg)
    return out.reshape(a.shape), idx


def paper_gemma(a, c, percentage, u):
    """The Gemma 3 variant: the c-quantile of |a| as the cut (ties included), top the percentage-quantile."""
    x = a.ravel().astype(np.float32)
    absx = np.abs(x)
    idx = np.nonzero(absx <= np.float32(np.quantile(absx, c)))[0]
    top = np.quantile(absx, percentage)
    neg = abs(x[x < 0].min()) if (x < 0).any() else 0.0
    s = np.sign(x[idx])
    s[s == 0] = 1
    uu = u(len(idx))
    out = x.copy()
    out[idx] = s * np.where(s > 0, uu * top, uu * neg)
    return out.reshape(a.shape), idx


def fixed_tensors():
    rng = np.random.default_rng(7)
    smooth = (rng.standard_normal((6, 40)) * 0.3).astype(np.float32)
    ties = np.round(smooth, 1).astype(np.float32)             # many equal |a|, and exact zeros, at the cut
    ties[0, :7] = 0.0
    positive = np.abs(smooth) + np.float32(0.01)               # no negatives: |min a| = 0
    silu = (smooth / (1 + np.exp(-smooth))).astype(np.float32)  # the shape ARM sees on SiLU models
    return {"smooth": smooth, "ties": ties, "positive": positive, "silu": silu}


def settings(variant, c, percentage, k=1.0, pmin=0.02, pmax=0.25, pool="row", apply="all"):
    return arm.ArmSettings(variant, c, percentage, k, pmin, pmax, pool, apply, SEED, {})


@pytest.mark.parametrize("name", list(fixed_tensors()))
@pytest.mark.parametrize("variant,c,percentage,pmin,pmax", [
    ("llama", 0.13, 99.5, 0.02, 0.25), ("llama", 0.32, 90.0, 0.20, 0.25), ("llama", 2.0, 50.0, 0.02, 0.9),
    ("gemma", 0.25, 0.85, 0.02, 0.25), ("gemma", 0.5, 0.3, 0.02, 0.25)])
def test_edit_equals_the_papers_pseudo_code(name, variant, c, percentage, pmin, pmax):
    a = fixed_tensors()[name]
    s = settings(variant, c, percentage, pmin=pmin, pmax=pmax)
    got = arm.edit(torch.from_numpy(a), s, torch.Generator().manual_seed(5)).numpy()
    g = torch.Generator().manual_seed(5)
    draws = lambda n: torch.rand(n, generator=g, dtype=torch.float32).numpy()  # noqa: E731
    want, idx = (paper_llama(a, c, percentage, 1.0, pmin, pmax, draws) if variant == "llama"
                 else paper_gemma(a, c, percentage, draws))
    moved = np.zeros(a.size, bool)
    moved[idx] = True
    assert moved.sum() >= 1
    np.testing.assert_array_equal(got.ravel()[~moved], a.ravel()[~moved])   # everything else untouched
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    if name == "positive":
        assert (got >= 0).all()  # no negatives: moved elements stay on [0, top]
    if name == "ties" and variant == "gemma":
        cut = np.quantile(np.abs(a), c)
        assert moved.sum() == (np.abs(a) <= cut).sum() > round(c * a.size)  # ties at the cut all move


@pytest.mark.parametrize("variant,c,percentage", [("llama", 0.13, 99.5), ("llama", 2.0, 50.0), ("gemma", 0.25, 0.85)])
def test_batched_rows_equal_the_edit_row_by_row(variant, c, percentage):
    """edit_rows (a decode step's rows at once) is `edit` of each row, bit for bit, ties and all."""
    t = fixed_tensors()
    v = torch.from_numpy(np.concatenate([t["smooth"], t["ties"], t["positive"], t["silu"]])[:, None, :])
    s = settings(variant, c, percentage, pmax=0.9 if c == 2.0 else 0.25)
    gens = lambda: [torch.Generator().manual_seed(k) for k in range(len(v))]  # noqa: E731
    rows = arm.edit_rows(v, s, gens())
    assert torch.equal(rows, torch.stack([arm.edit(v[r], s, g) for r, g in enumerate(gens())]))
    assert torch.equal(arm.edit_rows(v, s, gens(), identity=True), v)


def test_hook_edits_only_arm_rows_over_their_valid_positions():
    """The hook on a [batch, T, I] tensor: arm rows get `edit` of their non-pad positions with the generator
    of (seed, problem index, step 0); pad positions and the other rows keep their values."""
    torch.manual_seed(0)
    a = torch.randn(3, 5, 16)
    valid = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    s = settings("llama", 0.13, 99.5, pmin=0.1)
    mlp = torch.nn.Module()
    mlp.act_fn = torch.nn.SiLU()
    hook = arm.ArmHook(mlp, s)
    hook.begin([17, None, 4], valid)
    out = hook(None, (), a)
    for r, problem in ((0, 17), (2, 4)):
        g = torch.Generator().manual_seed(arm.row_seed(SEED, problem, 0))
        assert torch.equal(out[r, valid[r]], arm.edit(a[r, valid[r]], s, g))
        assert torch.equal(out[r, ~valid[r]], a[r, ~valid[r]])
        assert not torch.equal(out[r], a[r])
    assert torch.equal(out[1], a[1])
    hook.settings = arm.ArmSettings(**{**s.describe(), "seed": 9})
    hook.begin([17, None, 4], valid)
    assert not torch.equal(hook(None, (), a)[0], out[0])  # arm.seed reaches the draws
    hook.settings = s
    hook.begin([17, None, 4], valid)
    hook(None, (), a)
    # a decode step (step 1): every position is real; prefill-only leaves it alone
    step1 = hook(None, (), a[:, :1])
    g = torch.Generator().manual_seed(arm.row_seed(SEED, 17, 1))
    assert torch.equal(step1[0], arm.edit(a[0, :1], s, g))
    hook.settings = settings("llama", 0.13, 99.5, apply="prefill")
    assert hook(None, (), a[:, :1]) is None
    # pool: batch, the paper's pooling: one edit over every position (pads included) of the batch's arm rows
    hook.settings = settings("llama", 0.13, 99.5, pool="batch")
    hook.begin([17, None, 4], valid)
    pooled = hook(None, (), a)
    g = torch.Generator().manual_seed(arm.row_seed(SEED, 0, 17, 4))
    assert torch.equal(pooled[[0, 2]], arm.edit(a[[0, 2]], hook.settings, g)) and torch.equal(pooled[1], a[1])
    hook.remove()


# ---- on tiny models of three families ------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One model cache for this file's tests: each tiny model is prepared (converted and probed) once."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("arm-model-cache")
    mp.setenv("MLESS_CACHE", str(path))
    yield path
    mp.undo()


def arm_params(write_params, tiny_dirs, arch, conditions=("none", "mless", "mful", "arm"), arm_cfg=None, model_arm=None,
               **evaluate_cfg):
    raw = load_params(write_params()).model_dump()
    raw["runtime"]["threads"] = 1  # tiny models: one thread is fastest, and fair on a busy machine
    raw["prompt"]["conditions"] = list(conditions)
    raw["evaluate"].update(dict(n_samples=4, max_new_tokens=12, batch_size=8, stop_at_boxed=False) | evaluate_cfg)
    raw["arm"].update(arm_cfg or {})
    raw["models"] = {"tiny": {"display_name": f"Tiny {arch}", "family": arch, "arm": model_arm or {},
                              "source": {"kind": "local_dir", "path": str(tiny_dirs[arch])}}}
    return load_params(write_params(raw))


def loaded(params, identity=False):
    setup = models.setup_for(params, "tiny")
    model, tokenizer = models.load(setup, attn_implementation=engines.ATTENTION)
    s = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    hook = arm.ArmHook(arm.layer0_mlp(model, setup), s, identity=identity)
    return model, tokenizer, hook, engines.stop_ids(model.generation_config, tokenizer), setup


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_pool_row_generates_the_same_tokens_alone_and_in_a_batch_of_8(arch, tiny_dirs, write_params, cache_dir):
    params = arm_params(write_params, tiny_dirs, arch)
    model, tokenizer, hook, eos, setup = loaded(params)
    assert hook.settings.variant == ("gemma" if arch == "gemma3" else "llama")
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    built = [builder.build(p) for p in problems[:6]]
    # 4 arm rows among none / mless / mful rows of other lengths (left padding differs per row)
    batch = [engines.Item(p.index, "arm", b["arm"].input_ids) for p, b in zip(problems[:4], built)]
    batch += [engines.Item(p.index, c, b[c].input_ids) for p, b in zip(problems[4:], built[4:]) for c in b][:4]
    assert len(batch) == 8 and len({len(it.input_ids) for it in batch}) > 4
    together = engines.generate(model, tokenizer, batch, 10, False, eos, hook)
    for it, out in zip(batch[:4], together):
        assert engines.generate(model, tokenizer, [it], 10, False, eos, hook) == [out], it.index
    # batched none generations equal one-at-a-time ones (test_evaluate.py), so one batch serves here
    none = engines.generate(model, tokenizer, [engines.Item(it.index, "none", it.input_ids) for it in batch[:4]],
                             10, False, eos)
    assert none != together[:4], "ARM changed no arm row's tokens: the comparison would hold for an idle hook too"


def test_identity_hook_generates_exactly_the_none_tokens(tiny_dirs, write_params, cache_dir):
    params = arm_params(write_params, tiny_dirs, "llama")
    model, tokenizer, hook, eos, setup = loaded(params, identity=True)
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    prompts = [builder.build(p) for p in problems[:4]]
    none = [engines.Item(p.index, "none", b["none"].input_ids) for p, b in zip(problems, prompts)]
    arms = [engines.Item(p.index, "arm", b["arm"].input_ids) for p, b in zip(problems, prompts)]
    assert engines.generate(model, tokenizer, arms, 10, False, eos, hook) == \
        engines.generate(model, tokenizer, none, 10, False, eos)
    assert hook.step == 10  # the hook ran at the prompt and at every decode step


def test_evaluate_with_arm_is_seeded_byte_identical_and_reports_arm_minus_none(tiny_dirs, write_params, cache_dir,
                                                                               tmp_path):
    params = arm_params(write_params, tiny_dirs, "llama", n_samples=3, max_new_tokens=8, batch_size=5)  # mixed batches
    out = evaluate.run(params, "tiny", root=tmp_path / "a")
    again = evaluate.run(params, "tiny", root=tmp_path / "b")
    assert again.read_bytes() == out.read_bytes()
    metrics = json.loads((tmp_path / "a/metrics/accuracy/tiny.json").read_text())
    assert set(metrics["accuracy"]) == {"none", "mless", "mful", "arm"}
    assert set(metrics["arm-none"]) >= {"delta", "ci95_low", "ci95_high", "mcnemar_p"}
    with read_h5(out, "eval", ("arm/output",)) as f:
        prov = json.loads(f.attrs["provenance"])
        assert prov["arm"]["variant"] == "llama" and prov["arm"]["origin"]["c"] == "fallback (llama variant)"
        assert prov["arm"]["c"] == 0.13 and prov["arm"]["percentage"] == 99.5
        assert (prov["arm"]["pmin"], prov["arm"]["pmax"]) == (0.2, 0.25)  # the Llama file's defaults


def test_activations_store_the_arm_transformed_histogram_from_the_same_hook(tiny_dirs, write_params, cache_dir,
                                                                            tmp_path):
    raw = arm_params(write_params, tiny_dirs, "qwen2").model_dump()
    raw["extract"]["n_samples"] = 3
    raw["activations"]["showcase"] = 1
    params = load_params(write_params(raw))
    out = activations.run(params, "tiny", root=tmp_path)
    with read_h5(out, "activations", ("arm/hist_original",)) as f:
        assert list(f.attrs["conditions"]) == ["none", "mless", "mful", "arm"]
        arm_a = f["showcase/000/arm/a"][0].astype(np.float32)
        index = int(f["showcase/000"].attrs["problem_index"])
        assert not np.array_equal(f["arm/hist_original"][()], f["none/hist_original"][()])
        assert f["arm/original/near_zero_fixed_diff"][0] < 0  # ARM empties the near-zero region
        np.testing.assert_allclose(f["arm/lambda"][()], 1, atol=1e-6)  # no span: all attention stays on originals
    # the stored arm activations are the edit of the float32 none activations of the same problem
    from meaningless_tokens.capture import install_capture

    setup = models.setup_for(params, "tiny")
    model, tokenizer = models.load(setup, layers=[0])
    install_capture(model)
    problem = next(p for p in load_math500(dataset_spec(params.dataset, params.file))[0] if p.index == index)
    ids = builder_for(params.prompt, setup, tokenizer).build(problem)["none"].input_ids
    none_a = torch.from_numpy(activations.forward(model, activations.gated_mlps(model, setup, [0]), [0], ids)[1][0])
    s = arm.settings_for(params.arm, params.dataset.benchmark, setup)  # the tiny qwen2
    want = arm.edit(none_a, s, torch.Generator().manual_seed(arm.row_seed(s.seed, index, 0))).numpy()
    np.testing.assert_allclose(arm_a, want, rtol=1e-3, atol=1e-4)  # stored as float16


# ---- bad input ---------------------------------------------------------------------------------------

def test_bad_arm_input_is_one_line_naming_the_key_before_any_work(tiny_dirs, write_params, cache_dir, tmp_path):
    cases = [("gemma3", {"percentage": 99.5}, r"models.tiny.arm.percentage: 99.5 is outside \[0, 1\], the gemma"),
             ("llama", {"percentage": 150}, r"models.tiny.arm.percentage: 150.0 is outside \[0, 100\], the llama"),
             ("llama", {"pmin": 0.3}, r"models.tiny.arm.pmin: 0.3 is greater than pmax 0.25"),
             ("gemma3", {"c": 1.5}, r"models.tiny.arm.c: 1.5 is outside \(0, 1\]")]
    for arch, bad, message in cases:
        params = arm_params(write_params, tiny_dirs, arch, model_arm=bad)
        with pytest.raises(ConfigError, match=message) as e:
            evaluate.run(params, "tiny", root=tmp_path)
        assert "\n" not in str(e.value) and str(params.file) in str(e.value)
        assert not (tmp_path / "artifacts").exists()
    with pytest.raises(ConfigError, match=r"models.tiny.arm: pmin 0.3 is greater than pmax 0.2"):
        arm_params(write_params, tiny_dirs, "llama", model_arm={"pmin": 0.3, "pmax": 0.2})
    with pytest.raises(ConfigError, match=r"arm.pool: Input should be 'row' or 'batch'"):
        arm_params(write_params, tiny_dirs, "llama", arm_cfg={"pool": "rows"})


def test_arm_on_a_model_without_a_gated_mlp_is_refused(write_params, tiny_dirs):
    from transformers import AutoModelForCausalLM, PhiConfig

    params = arm_params(write_params, tiny_dirs, "llama")
    phi = AutoModelForCausalLM.from_config(PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=2, num_attention_heads=4))
    with pytest.raises(ConfigError, match=r"prompt.conditions: 'arm' needs a gated MLP .* has PhiMLP \(model_type 'phi'\)"):
        arm.layer0_mlp(phi, models.setup_for(params, "tiny"))


def test_paper_defaults_by_repo_and_family():
    """The paper's (c, percentage) for its models, its files' pmin/pmax per family, fallbacks otherwise."""
    from meaningless_tokens.config import Params

    raw = load_params(tiny_params_path()).model_dump()
    raw["models"] = {
        "q": {"display_name": "q", "source": {"kind": "hf", "repo_id": "Qwen/Qwen2.5-Math-7B"}},
        "l": {"display_name": "l", "source": {"kind": "hf", "repo_id": "meta-llama/Llama-3.1-8B-Instruct"}},
        "g": {"display_name": "g", "source": {"kind": "hf", "repo_id": "google/gemma-3-4b-it"}},
        "o": {"display_name": "o", "source": {"kind": "local_dir", "path": "x"}, "arm": {"c": 0.2}}}
    raw["evaluate"]["models"] = raw["likelihood"]["models"] = list(raw["models"])  # every model
    params = Params.model_validate(raw)
    q, l, g, o = (arm_settings(params, n, t) for n, t in (("q", "qwen2"), ("l", "llama"), ("g", "gemma3_text"),
                                                           ("o", "mistral")))
    assert (q.variant, q.c, q.percentage, q.pmin, q.pmax) == ("llama", 0.1, 95.0, 0.02, 0.25)
    assert (l.variant, l.c, l.percentage, l.pmin, l.pmax) == ("llama", 0.32, 90.0, 0.2, 0.25)
    assert (g.variant, g.c, g.percentage) == ("gemma", 0.25, 0.85) and g.origin["c"].startswith("paper")
    assert (o.c, o.percentage, o.origin["c"], o.origin["percentage"]) == (0.2, 99.5, "params", "fallback (llama variant)")
    # the dataset selects the paper's column: Qwen2.5-Math-7B (0.05, 90) on AIME2024, Llama off on AIME 2025
    raw["dataset"]["benchmark"] = "aime2024"
    q = arm_settings(Params.model_validate(raw), "q", "qwen2")
    assert (q.c, q.percentage, q.origin["c"]) == (0.05, 90.0, "paper (Qwen/Qwen2.5-Math-7B, aime2024)")
    raw["dataset"]["benchmark"] = "aime2025"
    with pytest.raises(ConfigError, match=r"models.l.arm: the paper runs meta-llama/Llama-3.1-8B-Instruct on aime2025 "
                                          r"without ARM; set models.l.arm.c and percentage"):
        arm_settings(Params.model_validate(raw), "l", "llama")
    raw["models"]["l"]["arm"] = {"c": 0.32, "percentage": 90}   # params still override
    assert arm_settings(Params.model_validate(raw), "l", "llama").origin["c"] == "params"


def arm_settings(params, name: str, model_type: str) -> arm.ArmSettings:
    """ARM's settings for model `name` of a given model_type, without fetching it (hub sources): the setup a stage
    would resolve, its manifest holding only the model_type ARM reads."""
    prepared = models.PreparedModel(name=name, path=Path("unfetched"), weights_sha256="", files={}, source={},
                                    facts={"model_type": model_type}, probe={})
    setup = models.ModelSetup(models.ModelEntry.of(params, name), prepared, "cpu", "float32", None)
    return arm.settings_for(params.arm, params.dataset.benchmark, setup)


def tiny_params_path():
    from tests.conftest import ROOT

    return ROOT / "params.yaml"
