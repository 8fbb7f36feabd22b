"""activations@<model>: stored histograms, per-sample measures, lambda and statistics against a direct
computation from a plain full forward pass with a hook, byte-identical reruns, and bad input."""

import numpy as np
import pytest
import torch

from meaningless_tokens import measures, models
from stages import activations
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
from meaningless_tokens.prompts import builder_for
from meaningless_tokens.store import read_h5
from meaningless_tokens.tolerances import allowed
from tests.test_extract import ARCHS, tiny_params


def act_params(write_params, tiny_dirs, arch, **act):
    params = tiny_params(write_params, tiny_dirs, arch, n_samples=4)
    raw = params.model_dump()
    raw["activations"].update({"layers": [0, 1], "bins": 40, "range": [-0.2, 0.2], "n_boot": 300, "showcase": 2,
                               **act})
    return load_params(write_params(raw))


def direct_measures(a: np.ndarray, z: np.ndarray, mad_c: float, eps: float) -> dict:
    """The measures written out plainly (float64, numpy only, another Gini formula)."""
    x = np.abs(a.astype(np.float64)).ravel()
    med = np.median(x)
    radius = 1.4826 * np.median(np.abs(x - med)) * mad_c
    s = np.sort(x)
    n = len(s)
    lorenz = np.cumsum(s) / s.sum()
    return {"near_zero_robust": np.mean(x < np.float32(radius)), "near_zero_fixed": np.mean(x < np.float32(eps)),
            "l1": x.mean(), "l2": np.sqrt(np.mean(x ** 2)),
            "gini": 1 - (2 * lorenz.sum() - 1) / n,  # 1 - 2 * area under the Lorenz curve (trapezoids)
            "z_var": np.var(z.astype(np.float64), axis=1).mean()}


@pytest.mark.parametrize("arch", ARCHS)
def test_stored_activations_equal_a_plain_forward_with_a_hook(arch, tiny_dirs, write_params, cache_dir, tmp_path):
    params = act_params(write_params, tiny_dirs, arch)
    out = activations.run(params, "tiny", root=tmp_path)
    cfg = params.activations

    setup = models.setup_for(params, "tiny")

    model, tok = models.load(setup)  # eager attention, the whole model, no capture function
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, params.extract.n_samples, params.extract.seed)
    builder = builder_for(params.prompt, setup, tok)
    insertion = len(builder.prefix) + len(builder.instruction)
    mlp_in = {}
    hooks = [model.get_decoder().layers[layer].mlp.register_forward_hook(
        lambda m, i, o, layer=layer: mlp_in.__setitem__(layer, i[0][0])) for layer in cfg.layers]
    edges = np.linspace(*cfg.range, cfg.bins + 1)
    with read_h5(out, "activations") as f:
        np.testing.assert_array_equal(f["bin_edges"][()], edges)
        for c in params.prompt.conditions:
            hist = {s: np.zeros((2, cfg.bins), np.int64) for s in activations.SETS}
            near = {s: np.zeros((2, cfg.bins + 1), np.int64) for s in activations.SETS}
            for k, problem in enumerate(chosen):
                pr = builder.build(problem)[c]
                with torch.no_grad():
                    res = model(torch.tensor([pr.input_ids]), output_attentions=True)
                pos = np.array(pr.original_pos)
                for li, layer in enumerate(cfg.layers):
                    mlp = model.get_decoder().layers[layer].mlp
                    with torch.no_grad():
                        z = mlp.gate_proj(mlp_in[layer])
                        a = mlp.act_fn(z)
                    probs = res.attentions[layer][0].numpy()  # the model's own eager attention
                    lam = probs[:, pos[insertion:]][:, :, pos].sum(-1).mean(-1)
                    np.testing.assert_allclose(f[c]["lambda"][k, li], lam, rtol=0, atol=1e-6)
                    for s, rows in (("original", pos), ("after_span", pos[insertion:])):
                        a_s, z_s = a[rows].numpy(), z[rows].numpy()
                        hist[s][li] += np.histogram(a_s, bins=edges)[0]
                        # values within the activation tolerance of each edge (its own tolerance, at |edge| + r)
                        r = allowed("activation-f32", np.abs(edges) + allowed("activation-f32", edges))
                        near[s][li] += ((a_s.ravel()[:, None] >= edges - r) & (a_s.ravel()[:, None] <= edges + r)).sum(0)
                        for m, v in direct_measures(a_s, z_s, cfg.mad_c, cfg.eps).items():
                            np.testing.assert_allclose(f[c][s][m][k, li], v, rtol=1e-9, atol=1e-12, err_msg=m)
                    if k < cfg.showcase:
                        np.testing.assert_array_equal(f[f"showcase/{k:03d}/{c}/a"][li], a.numpy().astype(np.float16))
            for s in activations.SETS:
                np.testing.assert_array_equal(f[c][f"hist_{s}"][()], hist[s])
                # how far float noise can move each count: the values near the bin's two edges, or the range's end
                np.testing.assert_array_equal(f[c][f"hist_{s}_noise"][()], near[s][:, :-1] + near[s][:, 1:])
                np.testing.assert_array_equal(f[c][f"outside_{s}_noise"][()], near[s][:, [0, -1]])
            if c == "none":
                np.testing.assert_allclose(f[c]["lambda"][()], 1.0, atol=1e-6)
            else:
                assert (f[c]["lambda"][()] < 1).all()  # the span takes some attention in every head
    for h in hooks:
        h.remove()


def test_statistics_of_the_per_sample_measures(tiny_dirs, write_params, cache_dir, tmp_path):
    """Means, paired differences, bootstrap intervals and Wilcoxon p from the stored per-sample values."""
    from scipy.stats import wilcoxon

    params = act_params(write_params, tiny_dirs, "llama", layers=[0])
    out = activations.run(params, "tiny", root=tmp_path)
    with read_h5(out, "activations") as f:
        for s in activations.SETS:
            for m in activations.MEASURES:
                none = f["none"][s][m][()]
                np.testing.assert_allclose(f["none"][s][f"{m}_mean"][()], none.mean(0))
                for c in ("mless", "mful"):
                    d = f[c][s][m][()] - none
                    np.testing.assert_allclose(f[c][s][f"{m}_diff"][()], d.mean(0))
                    lo, hi = f[c][s][f"{m}_diff_ci"][()]
                    assert lo[0] <= d.mean() <= hi[0] and d.min() <= lo[0] and hi[0] <= d.max()
                    p = 1.0 if not d.any() else wilcoxon(d[:, 0]).pvalue
                    assert f[c][s][f"{m}_diff_p"][0] == pytest.approx(p)


def test_rerun_is_byte_identical(tiny_dirs, write_params, cache_dir, tmp_path):
    params = act_params(write_params, tiny_dirs, "gemma3", layers=[0])
    a = activations.run(params, "tiny", root=tmp_path / "a")
    b = activations.run(params, "tiny", root=tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()


def test_bad_input_is_refused_before_any_work(tiny_dirs, write_params, cache_dir, tmp_path):
    params = act_params(write_params, tiny_dirs, "qwen2", layers=[0, 7])
    with pytest.raises(ConfigError, match=r"activations.layers: \[7\] out of range; tiny has 4 layers"):
        activations.run(params, "tiny", root=tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written, not even a folder
    raw = params.model_dump()
    for change, message in (({"bins": 0}, r"activations.bins: Input should be greater than 0"),
                            ({"range": [0.1, 0.1]}, r"activations.range: .*low < high"),
                            ({"mad_c": 0}, r"activations.mad_c: Input should be greater than 0")):
        bad = {**raw, "activations": {**raw["activations"], **change}}
        with pytest.raises(ConfigError, match=message):
            load_params(write_params(bad))


def test_a_model_without_a_gated_mlp_is_refused(write_params, tiny_dirs, tmp_path):
    """Phi's MLP is fc1 -> activation -> fc2: there is no gate_proj for the stage (or ARM) to read."""
    from transformers import AutoModelForCausalLM, PhiConfig

    params = act_params(write_params, tiny_dirs, "llama")
    phi = AutoModelForCausalLM.from_config(PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=2, num_attention_heads=4))
    with pytest.raises(ConfigError, match=r"models.tiny: layer 0's MLP \(PhiMLP, model_type 'phi'\) is not a gated MLP"):
        measures.activations.gated_mlps(phi, models.setup_for(params, "tiny"), [0])


def test_the_measurement_runs_without_the_stage(tiny_dirs, write_params, cache_dir, tmp_path):
    """measures.activations.measure on the full params and models.setup_for (a notebook's call, no stage prelude) gives
    the per-sample measures, histograms and lambda the stage stores."""
    from meaningless_tokens.dataset import extraction_problems

    params = act_params(write_params, tiny_dirs, "llama", layers=[0], showcase=0)
    out = activations.run(params, "tiny", root=tmp_path)
    chosen, _ = extraction_problems(dataset_spec(params.dataset, params.file), params.extract)
    m = measures.activations.measure(params, models.setup_for(params, "tiny", layers=[0]), chosen)
    assert [p.index for p in m.problems] == [p.index for p in chosen] and m.layers == [0]
    with read_h5(out, "activations") as f:
        np.testing.assert_array_equal(f["problems/index"][()], [p.index for p in chosen])
        for c in params.prompt.conditions:
            np.testing.assert_array_equal(f[f"{c}/lambda"][()], np.stack(m.lam[c]))
            for s in measures.activations.SETS:
                np.testing.assert_array_equal(f[f"{c}/hist_{s}"][()], m.hist[c][s])
                for meas in measures.activations.MEASURES:
                    np.testing.assert_array_equal(f[f"{c}/{s}/{meas}"][()], m.per[c][s][meas])
                    np.testing.assert_array_equal(f[f"{c}/{s}/{meas}_mean"][()], m.summary[(c, s, f"{meas}_mean")])
