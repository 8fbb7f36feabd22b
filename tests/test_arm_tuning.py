"""arm_tuning@<model>: the choice and the selection effect on constructed gains, the stage against the likelihood
stage at the chosen setting (the same problems, the same draws), disjoint problem sets, and bad input."""

import json

import numpy as np
import pytest

from meaningless_tokens import measures, store
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.store import read_h5
from stages import arm_tuning, likelihood
from tests.test_likelihood import lik_params

GRID = {"llama": [[0.13, 99.5], [0.32, 90.0]], "gemma": [[0.25, 0.85], [0.25, 0.7]]}


def tuning_params(write_params, tiny_dirs, arch="llama", **tune):
    params = lik_params(write_params, tiny_dirs, arch, conditions=["none", "arm"], n_samples=3, solution_tokens=12,
                        showcase=3)
    raw = params.model_dump()
    raw["arm_tuning"].update({"models": ["tiny"], "n_samples": 2, "seed": 1, "grid": GRID, "n_boot": 200, **tune})
    return load_params(write_params(raw))


def test_choice_and_selection_effect_on_constructed_gains():
    # setting 1 is best on the tuning problems, setting 0 on the tested ones: the in-sample pick gains 0.3 more
    tuning = np.array([[0.0, 0.1, 0.2], [0.5, 0.4, 0.6]])
    tested = np.array([[0.5, 0.4, 0.6, 0.5], [0.2, 0.2, 0.2, 0.2]])
    r = measures.arm_tuning.selection(tuning, tested, seed=0, n_boot=500)
    assert (r["chosen"], r["best_in_sample"]) == (1, 0)
    assert r["out_of_sample"]["mean"] == pytest.approx(0.2)
    assert r["in_sample"]["mean"] == pytest.approx(0.5)
    assert r["selection_effect"]["mean"] == pytest.approx(0.3)
    lo, hi = r["selection_effect"]["ci"]
    assert 0.1 < lo <= 0.3 <= hi < 0.5
    # one setting: nothing to choose, no selection effect in any resample
    one = measures.arm_tuning.selection(tuning[:1], tested[:1], seed=0, n_boot=200)
    assert one["selection_effect"] == {"mean": 0.0, "ci": (0.0, 0.0)}
    # equals: the first one in grid order
    assert measures.arm_tuning.choose(np.array([[0.1, 0.3], [0.3, 0.1]])) == 0


def test_stage_gains_equal_the_likelihood_stage_at_the_chosen_setting(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tuning_params(write_params, tiny_dirs)
    out = arm_tuning.run(params, "tiny", root=tmp_path)
    summary = json.loads((tmp_path / store.path("metrics/arm_tuning", "tiny")).read_text())
    with read_h5(out, "arm_tuning") as f:
        tested = list(f["tested/problems/index"][()])
        tuning = list(f["tuning/problems/index"][()])
        gains = f["tested/gain"][()]
        chosen = int(f["chosen"][()])
        assert f["grid"][()].tolist() == GRID["llama"]
        prov = json.loads(f.attrs["provenance"])
    assert len(tuning) == 2 and not set(tuning) & set(tested)
    assert [g["c"] for g in prov["arm"]["grid"]] == [0.13, 0.32]
    assert summary["chosen"]["index"] == chosen and summary["own"] == {"index": 0, "c": 0.13, "percentage": 99.5,
                                                                        "origin": "fallback (llama variant)"}
    assert summary["out_of_sample"]["mean"] == pytest.approx(gains[chosen].mean(), abs=1e-6)
    assert summary["in_sample"]["mean"] == pytest.approx(gains.mean(axis=1).max(), abs=1e-6)
    # the likelihood stage, run with each grid setting as the model's own, gives the same per-problem gains
    for k, (c, pct) in enumerate(GRID["llama"]):
        raw = params.model_dump()
        raw["models"]["tiny"]["arm"].update(c=c, percentage=pct)
        lk = likelihood.run(load_params(write_params(raw)), "tiny", root=tmp_path / f"lk{k}")
        with read_h5(lk, "likelihood") as f:
            assert list(f["problems/index"][()]) == tested
            np.testing.assert_allclose(f["contrasts/arm-none/solution/diff"][()], gains[k], atol=1e-4)
    assert not list(tmp_path.rglob("*.partial"))


def test_in_bfloat16_the_stage_scores_packed_at_every_setting(tiny_dirs, write_params, cache_dir, tmp_path):
    """In bfloat16 packed and whole-sequence sums differ by rounding alone; the exact mask check admits the packed
    scoring of the none rows and of the arm rows at every grid setting, and nothing falls back."""
    raw = tuning_params(write_params, tiny_dirs, "gemma3").model_dump()
    raw["runtime"]["dtype"] = "bfloat16"
    raw["likelihood"]["solution_tokens"] = 40
    out = arm_tuning.run(load_params(write_params(raw)), "tiny", root=tmp_path)
    with read_h5(out, "arm_tuning") as f:
        how = json.loads(f.attrs["provenance"])["scoring"]
    assert len(how["arm"]) == len(GRID["gemma"])
    for info in [how["none"], *how["arm"]]:
        assert info["method"] == "packed", info
        assert info["mask_check_max_abs_diff"] == 0.0
        assert info["packed_check_compared"] is False and "why" not in info


def test_bad_input_is_refused_naming_the_key(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tuning_params(write_params, tiny_dirs, grid={"llama": [[0.32, 90.0], [0.13, 99.5]],
                                                         "gemma": GRID["gemma"]})
    raw = params.model_dump()
    raw["models"]["tiny"]["arm"].update(c=0.2, percentage=95.0)
    with pytest.raises(ConfigError, match=r"arm_tuning\.grid\.llama: .* lacks model 'tiny''s own setting \(0\.2, 95\)"):
        arm_tuning.run(load_params(write_params(raw)), "tiny", root=tmp_path)
    raw = params.model_dump()
    raw["arm_tuning"]["n_samples"] = 498
    with pytest.raises(ConfigError, match=r"arm_tuning\.n_samples: 498 tuning problems asked for, but only 497"):
        arm_tuning.run(load_params(write_params(raw)), "tiny", root=tmp_path)
    # the model's variant's pairs, checked by the stage before the model loads
    for pairs, why in (([[0.32, 90.0]], "lacks the variant's fallback"),
                       ([[0.13, 99.5], [0.1, 150.0]], r"\(0\.1, 150\): percentage 150.0 is outside \[0, 100\]")):
        raw = params.model_dump()
        raw["arm_tuning"]["grid"] = {"llama": pairs, "gemma": GRID["gemma"]}
        with pytest.raises(ConfigError, match=rf"arm_tuning\.grid\.llama: .*{why}"):
            arm_tuning.run(load_params(write_params(raw)), "tiny", root=tmp_path)
    for grid, why in (({"llama": GRID["llama"]}, "gemma: missing"),
                      ({"llama": GRID["llama"] * 2, "gemma": GRID["gemma"]}, "names a pair twice")):
        raw = params.model_dump()
        raw["arm_tuning"]["grid"] = grid
        with pytest.raises(ConfigError, match=rf"arm_tuning\.grid.*{why}"):
            load_params(write_params(raw))
    raw = params.model_dump()
    raw["models"]["other"] = raw["models"]["tiny"]
    raw["arm_tuning"]["models"] = ["tiny"]
    raw["likelihood"]["models"] = ["other"]
    with pytest.raises(ConfigError, match=r"arm_tuning\.models: \['tiny'\] not in likelihood\.models"):
        load_params(write_params(raw))
    assert not (tmp_path / "artifacts").exists()
