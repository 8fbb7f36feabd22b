"""Every decoder-only family: tiny random models of nine families of the installed transformers.

For each: the probe accepts it (family: null, read from its config), the captured layer 0 equals an
independent recomputation (softmax of scaled q.k with the model's own mask), a model loaded with
only its first layers captures exactly what the full model captures, and evaluation (generation
and grading) runs on it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from meaningless_tokens import capture
from meaningless_tokens import models
from stages import evaluate
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500
from meaningless_tokens.prompts import PromptBuilder
from tests import shared, tiny
from tests.layer0 import own_mask, recompute_layer0

EXTRA = [f for f in tiny.FAMILIES if f not in tiny.ARCHS]


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
    return shared.family_models(tmp_path_factory)  # built once for the run (tests/test_add_model.py's too)


def family_params(write_params, path, **top):
    raw = load_params(write_params()).model_dump()
    raw["evaluate"].update(n_samples=2, max_new_tokens=6, batch_size=6, stop_at_boxed=True)
    raw["models"] = {"tiny": {"display_name": "Tiny", "family": None, "source": {"kind": "local_dir", "path": str(path)},
                              "layers": [0, 1], "heads": "all"}}
    raw.update(top)
    return load_params(write_params(raw))


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_family_probe_recomputation_and_partial_load(family, family_dirs, write_params, cache_dir, tmp_path):
    params = family_params(write_params, family_dirs[family])
    setup = models.setup_for(params, "tiny")
    prepared = setup.prepared
    assert prepared.facts["model_type"] == {"gemma3": "gemma3_text"}.get(family, family)
    probe = prepared.manifest()["probe"]
    assert probe["passed"] and probe["max_abs_diff"] <= 1e-6 and probe["max_row_sum_error_below"] <= 1e-6
    if family in ("gemma2", "gemma3"):  # layer 0 and the first layer of the other type
        assert probe["layers"] == [0, 1 if family == "gemma2" else 2]

    full, tokenizer = models.load(setup)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    ids = PromptBuilder(params.prompt, tokenizer, "raw", params.file).build(problems[3])["mless"].input_ids
    assert len(ids) > tiny.WINDOW
    expected, allowed = recompute_layer0(full, ids)
    assert np.array_equal(allowed, own_mask(full, len(ids)))

    part, _ = models.load(setup, layers=[0, 1])
    assert len(part.get_decoder().layers) == 2 and len(full.get_decoder().layers) == 4
    capture.install_capture(part)
    captured = capture.attention(part, ids, [0, 1])
    np.testing.assert_allclose(captured[0].numpy(), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(captured[0].sum(-1).numpy(), 1.0, atol=1e-6)
    capture.install_capture(full)
    whole = capture.attention(full, ids, [0, 1])
    for layer in (0, 1):  # the truncated model captures exactly what the whole model does
        assert (captured[layer] - whole[layer]).abs().max().item() == 0
    if family == "gemma2":  # the cap is in effect: without it the probabilities differ
        uncapped, _ = recompute_layer0(full, ids, softcap=False)
        assert np.abs(uncapped - expected).max() > 1e-3


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_family_evaluation_generates_and_grades(family, family_dirs, write_params, cache_dir, tmp_path):
    params = family_params(write_params, family_dirs[family])
    out = evaluate.run(params, "tiny", root=tmp_path)
    metrics = json.loads((tmp_path / "metrics/accuracy/tiny.json").read_text())
    assert metrics["n_problems"] == 2 and set(metrics["accuracy"]) == {"none", "mless", "mful"}
    assert all(0 < t <= 6 for t in metrics["mean_tokens"].values())
    assert out.is_file()
