"""sweep@<model>: the dose-response stage equals the main pipeline's statistics at the same count and
samples, count 0 is the none prompt (no span mass, no drop), the accuracy sweep's bookkeeping, byte-identical
reruns, and bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest

from stages import extract, stats, sweep
from meaningless_tokens.cli import parse_shard
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ArtifactError, ConfigError
from meaningless_tokens.store import read_h5
from tests.test_extract import tiny_params
from tests.params import ROOT

OUTPUTS = ("artifacts/sweep/tiny.h5", "metrics/sweep/tiny.json", "artifacts/plots/sweep/tiny.csv")


def sweep_params(write_params, tiny_dirs, arch="llama", **cfg):
    params = tiny_params(write_params, tiny_dirs, arch, n_samples=3)
    raw = params.model_dump()
    raw["prompt"]["conditions"] = ["none", "mless"]
    raw["stats"]["n_boot"] = 200
    raw["sweep"].update({"counts": [0, 10, 55], "attention_samples": 3, "seed": raw["extract"]["seed"],
                         "n_boot": 200, "top_heads": 2, **cfg})
    return load_params(write_params(raw))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_value_at_count_55_is_the_main_pipelines_statistic_and_count_0_is_none(arch, tiny_dirs, write_params,
                                                                                    cache_dir, tmp_path):
    params = sweep_params(write_params, tiny_dirs, arch)
    assert params.prompt.mless.count == 55 and params.stats.n_boot == params.sweep.n_boot
    extract.run(params, "tiny", root=tmp_path)
    st = stats.run(params, "tiny", root=tmp_path)  # reads extract's artifact under the same root
    out = sweep.run(params, "tiny", root=tmp_path)
    with read_h5(st, "stats") as f, read_h5(out, "sweep") as g:
        t = g["token_0"]
        np.testing.assert_array_equal(g["problems/index"][()], f["problem_index"][()])  # the same samples
        np.testing.assert_allclose(g["orig_mean_none"][()], f["none/orig_mean"][:, 0], rtol=1e-12)
        k = list(g.attrs["counts"]).index(55)
        for ds in ("drop", "drop_ci", "drop_pct", "drop_pct_ci", "span_mass", "span_mass_ci"):
            np.testing.assert_allclose(t[ds][k], f[f"mless/{ds}"][()][..., 0, :], rtol=1e-9, atol=1e-15, err_msg=ds)
        assert t["span_tokens"][k] == 55 * t["pieces_per_repetition"][()]
        zero = list(g.attrs["counts"]).index(0)
        assert t["span_tokens"][zero] == 0
        for ds in ("drop", "drop_heads", "drop_top", "span_mass", "span_mass_heads", "drop_ci", "span_mass_ci"):
            assert not np.any(t[ds][zero]), ds
        # the top heads are the largest drops at the reference count, for every count
        assert list(t["top_heads"][()]) == list(np.argsort(-t["drop"][k], kind="stable")[:2])
        np.testing.assert_allclose(t["drop_top"][()], t["drop"][()][:, t["top_heads"][()]].mean(axis=1), rtol=1e-12)
    m = json.loads((tmp_path / "metrics/sweep/tiny.json").read_text())
    row = m["tokens"]["/"]["counts"]["55"]
    assert row["span_mass"] == pytest.approx(float(np.mean(stats_span(st))), abs=1e-6)
    assert m["tokens"]["/"]["counts"]["0"] == {"span_tokens": 0, "drop_pct": 0.0, "drop_pct_ci95": [0.0, 0.0],
                                               "drop_top_pct": 0.0, "span_mass": 0.0, "lambda": 1.0}
    table = (tmp_path / "artifacts/plots/sweep/tiny.csv").read_text().splitlines()
    assert table[0].startswith("token,count,span_tokens,drop_pct") and len(table) == 4


def stats_span(path):
    with read_h5(path, "stats") as f:
        return f["mless/span_mass"][0]


def test_accuracy_sweep_rerun_is_byte_identical(tiny_dirs, write_params, cache_dir, tmp_path):
    params = sweep_params(write_params, tiny_dirs, counts=[0, 10], reference_count=10, tokens=["/", "#"],
                          accuracy_samples=2)
    raw = params.model_dump()
    raw["evaluate"].update(max_new_tokens=3, batch_size=3)
    params = load_params(write_params(raw))
    a = sweep.run(params, "tiny", root=tmp_path / "a")
    b = sweep.run(params, "tiny", root=tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    assert not (tmp_path / "a/artifacts/sweep/.journal/tiny.jsonl").exists()  # removed once the artifact is written
    m = json.loads((tmp_path / "a/metrics/sweep/tiny.json").read_text())
    assert m["accuracy_samples"] == 2 and set(m["tokens"]) == {"/", "#"}
    with read_h5(a, "sweep") as f:
        none = f["correct_none"][()]
        for k, token in enumerate(("/", "#")):
            g = f[f"token_{k}"]
            assert g.attrs["token"] == token
            np.testing.assert_array_equal(g["correct"][0], none)  # count 0 is the none prompt
            np.testing.assert_allclose(g["accuracy"][()], g["correct"][()].mean(axis=1))
            np.testing.assert_allclose(g["accuracy_delta"][()], g["accuracy"][()] - none.mean())
            row = m["tokens"][token]["counts"]["10"]
            assert row["accuracy"] == g["accuracy"][1] and 0 <= row["mcnemar_p"] <= 1
            assert "accuracy_delta" not in m["tokens"][token]["counts"]["0"]


def shard_params(write_params, tiny_dirs, **evaluate):
    params = sweep_params(write_params, tiny_dirs, counts=[0, 10], reference_count=10, tokens=["/", "#"],
                          accuracy_samples=3)  # 3 problems x (none, /x10, #x10): 9 rows
    raw = params.model_dump()
    raw["evaluate"].update({"max_new_tokens": 3, "batch_size": 2, **evaluate})  # 5 batches
    return load_params(write_params(raw))


def test_the_sweeps_generation_in_shards_merged_by_the_stage_equals_one_run_byte_for_byte(tiny_dirs, write_params,
                                                                                          cache_dir, tmp_path):
    params = shard_params(write_params, tiny_dirs)
    one = {k: (tmp_path / "one" / k) for k in OUTPUTS}
    sweep.run(params, "tiny", root=tmp_path / "one")
    root = tmp_path / "sharded"
    parts = [sweep.run(params, "tiny", root=root, shard=parse_shard(f"{i}/2")) for i in range(2)]
    assert [p.name for p in parts] == [f"tiny.part-{i}-of-2.jsonl" for i in range(2)]
    assert parts[0].parent == root / "artifacts/sweep/.journal"
    assert not (root / OUTPUTS[0]).exists()  # a shard writes its part only
    assert [p.read_text().count("\n") - 1 for p in parts] == [5, 4]  # batches 0, 2, 4 (2, 2, 1 rows) and 1, 3
    assert "settings" in json.loads(parts[0].read_text().splitlines()[0])
    sweep.run(params, "tiny", root=root)  # the stage's run merges; nothing is left to generate
    for k, path in one.items():
        assert (root / k).read_bytes() == path.read_bytes(), k
    timing = json.loads((root / "metrics/timing/sweep-tiny.json").read_text())["accuracy"]
    assert timing["merged_parts"] == {p.name: n for p, n in zip(parts, (5, 4))}
    assert not any(p.exists() for p in parts) and not (root / "artifacts/sweep/.journal/tiny.jsonl").exists()


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_a_sweep_part_made_at_another_batch_size_is_refused_naming_it(tiny_dirs, write_params, cache_dir, tmp_path):
    part = sweep.run(shard_params(write_params, tiny_dirs, batch_size=4), "tiny", root=tmp_path,
                     shard=parse_shard("1/2"))
    with pytest.raises(ArtifactError) as e:
        sweep.run(shard_params(write_params, tiny_dirs), "tiny", root=tmp_path)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{part}: made for other inputs (batch_size: 4 in the file, 2 in this run")
    assert part.exists() and not (tmp_path / OUTPUTS[0]).exists()


def test_a_sweep_shard_without_the_accuracy_sweep_is_one_line_naming_the_key(tiny_dirs, write_params, tmp_path):
    params = sweep_params(write_params, tiny_dirs)
    cli = subprocess.run([sys.executable, "-m", "stages.sweep", "--model", "tiny", "--params", str(params.file),
                          "--shard", "0/2"], capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 2, cli.stderr
    assert cli.stderr.strip().splitlines() == [
        f"error: {params.file}: sweep.accuracy_samples: 0: the sweep generates nothing, so it has no shards (--shard); "
        "run the stage whole"]
    cli = subprocess.run([sys.executable, "-m", "stages.sweep", "--model", "tiny", "--params", str(params.file),
                          "--shard", "2/2"], capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 2 and cli.stderr.strip().splitlines() == [
        "error: --shard 2/2: index 2 is out of range for count 2 (0..1) (index I of count N, 0 <= I < N)"]


@pytest.mark.parametrize("change, message", [
    ({"counts": [0, -5, 55]}, "sweep.counts.1: Input should be greater than or equal to 0"),
    ({"tokens": ["/", " "]}, "sweep.tokens: Value error, token 1 is empty or whitespace"),
    ({"tokens": [""]}, "sweep.tokens: Value error, token 0 is empty"),
    ({"counts": [0, 10], "reference_count": 55}, "sweep: Value error, reference_count 55 is not one of counts [0, 10]"),
    ({"bogus": 1}, "sweep: Value error, unknown key(s) ['bogus']"),
])
def test_bad_sweep_params_are_one_line_naming_the_key(change, message, write_params):
    raw = load_params(write_params()).model_dump()
    raw["sweep"].update(change)
    with pytest.raises(ConfigError) as e:
        load_params(write_params(raw))
    assert message.replace("Value error, ", "") in str(e.value) and "params.yaml" in str(e.value)
    assert len(str(e.value).splitlines()) == 1


def test_a_layer_beyond_the_model_is_refused_before_any_work(tiny_dirs, write_params, cache_dir, tmp_path):
    params = sweep_params(write_params, tiny_dirs, layer=9)
    with pytest.raises(ConfigError, match=r"params.yaml: sweep.layer: 9 out of range; model 'tiny' has 4 layers"):
        sweep.run(params, "tiny", root=tmp_path)
    assert not (tmp_path / "artifacts").exists()


def test_likelihood_sweep_at_count_55_is_the_likelihood_stages_number(tiny_dirs, write_params, cache_dir, tmp_path):
    """sweep.likelihood_samples: at count 55 the solution's mean log-prob per problem is the likelihood stage's
    mless value on the same problems, at count 0 its none value (difference 0)."""
    from stages import likelihood

    params = sweep_params(write_params, tiny_dirs, "qwen2", counts=[0, 55], attention_samples=2, likelihood_samples=3)
    raw = params.model_dump()
    raw["likelihood"].update(n_samples=3, solution_tokens=20, n_boot=100)
    params = load_params(write_params(raw))
    out = sweep.run(params, "tiny", root=tmp_path)
    lik = likelihood.run(params, "tiny", root=tmp_path)
    with read_h5(out, "sweep") as g, read_h5(lik, "likelihood") as f:
        assert g.attrs["likelihood_samples"] == 3
        np.testing.assert_array_equal(g["likelihood_problem_index"][()], f["problems/index"][()])
        t = g["token_0"]
        np.testing.assert_allclose(t["likelihood"][1], f["mless/solution/mean"][()], atol=1e-5)
        np.testing.assert_allclose(t["likelihood"][0], f["none/solution/mean"][()], atol=1e-5)
        assert t["likelihood_delta"][0] == 0 and t["likelihood_p"][0] == 1.0
        assert t["likelihood_delta"][1] == pytest.approx(np.mean(t["likelihood"][1] - t["likelihood"][0]))
    m = json.loads((tmp_path / "metrics/sweep/tiny.json").read_text())
    assert m["likelihood_samples"] == 3 and "likelihood_delta" in m["tokens"]["/"]["counts"]["55"]
    table = (tmp_path / "artifacts/plots/sweep/tiny.csv").read_text().splitlines()
    assert table[0].endswith(",likelihood_delta") and table[1].endswith(",0")


def test_the_sweep_runs_without_the_stage(tiny_dirs, write_params, cache_dir, tmp_path):
    """sweep.measure on the full params and models.setup_for (a notebook's call, no stage prelude) gives the
    drops, span mass and metrics the stage stores."""
    import functools

    from meaningless_tokens import measures, models
    from meaningless_tokens.dataset import dataset_spec, load_problems

    params = sweep_params(write_params, tiny_dirs, counts=[0, 55], attention_samples=2)
    out = sweep.run(params, "tiny", root=tmp_path)
    problems, _ = load_problems(dataset_spec(params.dataset, params.file))
    s = measures.sweep.measure(params, functools.partial(models.setup_for, params, "tiny"), problems,
                               tmp_path / "journal.jsonl")
    assert not s.accuracy.problems and not s.likelihood.problems
    att = s.attention
    with read_h5(out, "sweep") as f:
        np.testing.assert_array_equal(f["problems/index"][()], [p.index for p in att.problems])
        np.testing.assert_array_equal(f["orig_mean_none"][()], att.per["none"][0])
        for k, c in enumerate(params.sweep.counts):
            for ds in ("drop", "drop_ci", "span_mass", "drop_top_pct"):
                np.testing.assert_array_equal(f[f"token_0/{ds}"][k], att.summary["/"]["rows"][c][ds], err_msg=ds)
    metrics = measures.sweep.metrics_summary(params.sweep, att.summary, att.tokenization, {}, len(att.problems), 0)
    assert {**metrics, "stage": "sweep", "model": "tiny"} == json.loads((tmp_path / "metrics/sweep/tiny.json").read_text())
