import csv
import json
from pathlib import Path

import numpy as np
import pytest

from meaningless_tokens import charts
from stages import activations, extract, figures, likelihood, stats, sweep
from meaningless_tokens.charts import span_accuracy, style
from meaningless_tokens.report import paper
from meaningless_tokens.results.context import load_context
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ArtifactError, ConfigError
from meaningless_tokens.store import read_h5
from tests.conftest import ROOT
from tests.test_extract import tiny_params


@pytest.fixture
def tiny_stats(write_params, tiny_dirs, cache_dir, tmp_path):
    """Extraction (every sample a showcase) and statistics for a tiny gemma3 model."""
    params = tiny_params(write_params, tiny_dirs, "gemma3", n_samples=5, showcase=5)
    src = extract.run(params, "tiny", root=tmp_path)
    out = stats.run(params, "tiny", root=tmp_path)
    return params, src, out


def beside(src: Path, root: Path, data: bytes | None = None) -> Path:
    """`root`, a project root holding the attention artifact `src` (or `data` in its place) where stats reads it."""
    copy = root / src.relative_to(src.parents[2])
    copy.parent.mkdir(parents=True)
    copy.write_bytes(src.read_bytes() if data is None else data)
    return root


def direct(src, query_set="original", exclude_first=True):
    """The statistics recomputed from the full showcase matrices, sample by sample."""
    with read_h5(src, "attention") as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        n_orig = np.diff(f["none/offsets"][()])
        orig_off = np.concatenate([[0], np.cumsum(n_orig)])
        res = {}
        for c in conds:
            orig, full, span_mass = [], [], []
            for s in range(len(n_orig)):
                A = f[f"showcase/{s:03d}/{c}"][()].astype(np.float64)  # [L, H, T, T]
                T = A.shape[-1]
                pos = f[c]["original_pos"][orig_off[s]:orig_off[s + 1]]
                start, end = f[c]["span"][s]
                n = len(pos)
                if query_set == "original":
                    o = np.stack([A[:, :, pos[j:], pos[j]].sum(-1) / (n - j) for j in range(n)], -1)
                else:  # all
                    o = np.stack([A[:, :, pos[j]:, pos[j]].sum(-1) / (T - pos[j]) for j in range(n)], -1)
                orig.append(o)
                full.append(np.stack([A[:, :, p:, p].sum(-1) / (T - p) for p in range(T)], -1))
                after = pos[pos >= end] if end > start else []
                span_mass.append(A[:, :, after][:, :, :, start:end].sum(-1).mean(-1) if len(after)
                                 else np.zeros(A.shape[:2]))
            res[c] = (orig, full, np.stack(span_mass))
    first = 1 if exclude_first else 0
    orig_mean = {c: np.stack([o[:, :, first:].mean(-1) for o in res[c][0]]) for c in conds}
    return res, orig_mean


def padded_mean(rows):
    width = max(r.shape[-1] for r in rows)
    out = np.full((len(rows),) + rows[0].shape[:2] + (width,), np.nan)
    for k, r in enumerate(rows):
        out[k, :, :, :r.shape[-1]] = r
    return np.nanmean(out, axis=0)


def test_statistics_equal_a_direct_computation(tiny_stats):
    params, src, out = tiny_stats
    res, orig_mean = direct(src)
    with read_h5(out, "stats") as f:
        assert f.attrs["query_set"] == "original"
        for c in ("none", "mless", "mful"):
            np.testing.assert_allclose(f[c]["original_avg"][()], padded_mean(res[c][0]), atol=1e-6)
            np.testing.assert_allclose(f[c]["full_avg"][()], padded_mean(res[c][1]), atol=1e-6)
            np.testing.assert_allclose(f[c]["span_mass"][()], res[c][2].mean(0), atol=1e-6)
            np.testing.assert_allclose(f[c]["orig_mean"][()], orig_mean[c], atol=1e-6)
        drop = (orig_mean["none"] - orig_mean["mless"]).mean(0)
        np.testing.assert_allclose(f["mless/drop"][()], drop, atol=1e-6)
        np.testing.assert_allclose(f["mless/drop_pct"][()], 100 * drop / orig_mean["none"].mean(0), atol=1e-4)
        lo, hi = f["mless/drop_ci"][()]
        assert np.all(lo <= drop + 1e-12) and np.all(drop <= hi + 1e-12)
        assert np.array_equal(f["mless/head_rank"][()], np.argsort(-drop, axis=1, kind="stable"))
        # the verdict's layer-level numbers: heads averaged before the ratio, then differences of those percents
        base = orig_mean["none"].mean(2).mean(0)
        layer = {c: 100 * (base - orig_mean[c].mean(2).mean(0)) / base for c in ("mless", "mful")}
        np.testing.assert_allclose(f["mless/layer_drop_pct"][()], layer["mless"], atol=1e-4)
        np.testing.assert_allclose(f["mless/first_layer_lead_pct"][()], [layer["mless"][0] - layer["mless"][1:].max()],
                                   atol=1e-4)
        np.testing.assert_allclose(f["mless/mful_gap_pct"][()], layer["mless"] - layer["mful"], atol=1e-4)
        for k in ("layer_drop_pct", "first_layer_lead_pct", "mful_gap_pct"):
            lo, hi = f[f"mless/{k}_ci"][()]
            assert np.all(lo <= f[f"mless/{k}"][()] + 1e-9) and np.all(f[f"mless/{k}"][()] <= hi + 1e-9), k
        assert "mful_gap_pct" not in f["mful"] and "first_layer_lead_pct" in f["mful"]
        with read_h5(src, "attention") as a:
            assert tuple(f["mless"].attrs["span"]) == tuple(a["mless/span"][0])
        assert np.all(f["none/span_mass"][()] == 0) and np.all(f["mless/span_mass"][()] > 0)
        # rows of attention sum to 1: over the full prompt, what position p receives averages to a weight
        assert np.all(f["mless/full_avg"][()] <= 1 + 1e-9)


def test_query_set_all_and_bad_inputs(tiny_stats, write_params, tmp_path):
    params, src, _ = tiny_stats
    raw = params.model_dump()
    raw["stats"]["query_set"] = "all"
    p2 = load_params(write_params(raw))
    out = stats.run(p2, "tiny", root=beside(src, tmp_path / "all"))
    res, _ = direct(src, "all")
    with read_h5(out, "stats") as f:
        np.testing.assert_allclose(f["mless/original_avg"][()], padded_mean(res["mless"][0]), atol=1e-6)
    raw["stats"]["query_set"] = "everything"
    with pytest.raises(ConfigError, match=r"stats.query_set: Input should be 'original', 'all' or 'last'"):
        load_params(write_params(raw))
    bad = beside(src, tmp_path / "bad", src.read_bytes()[:5000])
    with pytest.raises(ArtifactError, match=r"bad/artifacts/attention/tiny.h5: not a readable HDF5 file"):
        stats.run(params, "tiny", root=bad)
    assert not (bad / "artifacts/stats").exists()


def test_stats_are_deterministic(tiny_stats, tmp_path):
    params, src, out = tiny_stats
    again = stats.run(params, "tiny", root=beside(src, tmp_path / "again"))
    assert again.read_bytes() == out.read_bytes()


def test_stats_averages_run_without_the_stage(tiny_stats):
    """stats.read and averages on the attention artifact (a notebook's call, no stage prelude) give the
    datasets the stage stores."""
    from meaningless_tokens.measures import stats

    params, src, out = tiny_stats
    with read_h5(src, "attention", stats.REQUIRED) as f:
        att = stats.read(f, params.stats.query_set)
    results = stats.averages(att, params.stats)
    with read_h5(out, "stats") as f:
        assert set(results) == set(att.conditions) == {str(c) for c in f.attrs["conditions"]}
        for c, values in results.items():
            assert set(values) == set(f[c]) and ("layer_drop_pct" in values) == (c != "none")
            for k, v in values.items():
                np.testing.assert_array_equal(f[f"{c}/{k}"][()], v, err_msg=f"{c}/{k}")


def metrics_from_records(root, name="tiny"):
    """metrics/<name>.json as the evaluation stage summarizes hand-made graded records."""
    from meaningless_tokens.engines import Record
    from meaningless_tokens.measures.evaluate import summarize

    recs = {c: [Record(i, c, "", 1, "eos", "", ok, None, False, 0.0) for i, ok in enumerate(pattern)]
            for c, pattern in {"none": [1, 0, 0, 1], "mless": [1, 1, 0, 1], "mful": [0, 0, 0, 1]}.items()}
    from meaningless_tokens.store import write_metrics

    m = summarize(recs, seed=0)
    (root / "metrics/accuracy").mkdir(parents=True, exist_ok=True)
    write_metrics(root / "metrics/accuracy" / f"{name}.json", m)  # as the stage writes it: with its stage and model
    return m


def test_figures_plot_the_statistics_and_are_byte_identical(tiny_stats, write_params, tmp_path):
    params, src, out = tiny_stats
    raw = params.model_dump()
    raw["figures"].update(original_positions=20, full_positions=40, n_heads=2)
    raw["activations"].update(n_boot=200)
    raw["sweep"].update(counts=[0, 5, 55], attention_samples=2, n_boot=100)
    raw["likelihood"].update(n_samples=5, solution_tokens=12, n_boot=100)
    params = load_params(write_params(raw))
    act = activations.run(params, "tiny")
    sw = sweep.run(params, "tiny")
    lik = likelihood.run(params, "tiny")
    m = metrics_from_records(params.file.parent)
    plt = figures._setup()
    ctx = load_context(params)
    assert ctx.metrics["tiny"]["accuracy"] == m["accuracy"]
    # any measure's file read whole for a chart with no loader of its own: every dataset and the root attributes
    whole = ctx.measure("sweep")["tiny"]
    with read_h5(sw, "sweep") as f:
        assert whole["@attrs"]["provenance"] == f.attrs["provenance"]
        np.testing.assert_array_equal(whole["token_0/drop_heads_pct"], f["token_0/drop_heads_pct"][()])
        assert {k for k in whole if k != "@attrs"} == {k for k in _datasets(f)}
    drawn = dict(figures.draw_all(plt, ctx))
    # the span sweep: drop and span mass against the count; no accuracy chart while the accuracy sweep is off
    assert "span-accuracy" not in drawn
    assert "sweep.accuracy_samples: 0" in charts.unavailable(span_accuracy, ctx)
    left, right = drawn["span-sweep"].axes
    with read_h5(sw, "sweep") as f:
        np.testing.assert_array_equal(left.lines[0].get_xdata(), [0, 5, 55])
        np.testing.assert_array_equal(left.lines[0].get_ydata(), f["token_0/drop_heads_pct"][()])
        np.testing.assert_array_equal(left.lines[1].get_ydata(), f["token_0/drop_top_pct"][()])
        np.testing.assert_array_equal(right.lines[0].get_ydata(), 100 * f["token_0/span_mass_heads"][()])
    with read_h5(out, "stats") as f:
        rank = f["mless/head_rank"][0]
        none, mless = f["none/original_avg"][()], f["mless/original_avg"][()]
        full = f["mless/full_avg"][()]
        span = tuple(f["mless"].attrs["span"])
    heads = drawn["tiny-heads"]
    top, bottom = heads.axes[0], heads.axes[2]
    assert top.get_title() == f"Tiny gemma3 Layer 1 Head {rank[0] + 1}"  # heads counted from 1 on charts
    np.testing.assert_array_equal(top.lines[0].get_ydata(), none[0, rank[0], :20])
    np.testing.assert_array_equal(top.lines[1].get_ydata(), mless[0, rank[0], :20])
    np.testing.assert_array_equal(bottom.lines[0].get_ydata(), full[0, rank[0], :40])
    shaded = [p for p in bottom.patches if p.get_label() == "Meaningless tokens"]
    assert len(shaded) == 1 and shaded[0].get_x() == span[0] - 0.5
    layer_sweep = drawn["tiny-layer-sweep"]
    assert [a.get_title() for a in layer_sweep.axes] == [f"Tiny gemma3 Layer {k} Head {rank[0] + 1}" for k in (1, 2, 3)]
    np.testing.assert_array_equal(layer_sweep.axes[2].lines[1].get_ydata(), mless[2, rank[0], :20])
    acc = drawn["accuracy"]
    assert [round(b.get_height(), 9) for b in acc.axes[0].patches[:1]] == [round(100 * m["accuracy"]["none"], 9)]
    # the activation histogram and its insets are the file's numbers
    hist_ax = drawn["activations"].axes[0]
    with read_h5(act, "activations") as f:
        for stairs, c in zip([p for p in hist_ax.patches if p.get_label().startswith(("No", "Mean", "Random"))],
                             ("none", "mless", "mful")):
            values, edges, _ = stairs.get_data()
            np.testing.assert_array_equal(values, f[c]["hist_original"][0])
            np.testing.assert_array_equal(edges, f["bin_edges"][()])
        insets = hist_ax.child_axes
        assert [a.get_title() for a in insets] == ["Sparsity", "L1 norm", "L2 norm", "Gini"]
        for inset, measure in zip(insets, ("near_zero_robust", "l1", "l2", "gini")):
            heights = [b.get_height() for b in inset.patches]
            assert heights == [f[c]["original"][f"{measure}_mean"][0] for c in ("none", "mless", "mful")]
        shift = drawn["activation-shift"].axes[2]  # L1, mless then mful bars
        base = f["none/original/l1_mean"][0]
        assert [b.get_height() for b in shift.patches] == pytest.approx(
            [100 * f[c]["original/l1_diff"][0] / base for c in ("mless", "mful")])

    # the likelihood chart: the forest plot's dot is the file's mean difference, its whiskers the interval
    forest = drawn["likelihood"].axes[0]
    with read_h5(lik, "likelihood") as f:
        mean, ci = f["contrasts/mless-none/solution/mean"][0], f["contrasts/mless-none/solution/ci"][0]
    dot = forest.lines[0].get_xdata()[0]
    assert dot == mean and forest.collections[0].get_segments()[0][:, 0].tolist() == pytest.approx(list(ci))
    plt.close("all")
    open_at_save, save = [], figures.save
    figures.save = lambda fig, *a: open_at_save.append(len(plt.get_fignums())) or save(fig, *a)
    try:
        a = figures.run(params, root=tmp_path / "a")
    finally:
        figures.save = save
    # one figure open at a time, none left after the stage: memory flat with the number of models
    assert open_at_save and max(open_at_save) == 1 and plt.get_fignums() == []
    b = figures.run(params, root=tmp_path / "b")
    # 7 charts, span-sweep and likelihood (no span-accuracy: that sweep is off)
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 2 * 9
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), x.name
    # the accuracy table `dvc plots` draws: one row per model and condition, the metrics' numbers
    rows = list(csv.DictReader((tmp_path / "a/reports/accuracy.csv").open()))
    assert [(r["model"], r["condition"], r["label"]) for r in rows] == [
        ("tiny", c, f"tiny / {c}") for c in ("none", "mless", "mful")]
    for r in rows:
        assert float(r["accuracy"]) == pytest.approx(m["accuracy"][r["condition"]], abs=1e-6)
        assert int(r["correct"]) == m["correct"][r["condition"]] and int(r["n"]) == m["n_problems"] == 4


def test_plot_tables(tiny_stats):
    """artifacts/plots/{original,full}/<model>.csv: the top head's curves, fixed columns for dvc.yaml's plots."""
    params, _, out = tiny_stats
    with read_h5(out, "stats") as f:
        head = int(f["mless/head_rank"][0, 0])
        avg = {(c, k): f[c][f"{k}_avg"][0, head] for c in ("none", "mless", "mful") for k in ("original", "full")}
    for kind in ("original", "full"):
        rows = list(csv.DictReader((params.file.parent / f"artifacts/plots/{kind}/tiny.csv").open()))
        assert list(rows[0]) == ["position", "none", "mless", "mful", "layer", "head"]
        assert len(rows) == max(len(avg[(c, kind)]) for c in ("none", "mless", "mful"))
        assert {(r["layer"], r["head"]) for r in rows} == {("0", str(head))}
        for c in ("none", "mless", "mful"):
            values = avg[(c, kind)]
            got = [r[c] for r in rows]
            np.testing.assert_allclose([float(v) for v in got[:len(values)]], values, rtol=1e-5)
            assert all(v == "nan" for v in got[len(values):])  # shorter prompts: nan (left out), not 0


def test_figures_bad_params(tiny_stats, write_params, tmp_path):
    params, _, _ = tiny_stats
    metrics_from_records(params.file.parent)
    raw = params.model_dump()
    raw["figures"]["layer"] = 3
    with pytest.raises(ConfigError, match=r"figures.layer: layer 3 was not extracted for tiny"):
        figures.run(load_params(write_params(raw)), root=tmp_path / "f")
    raw["figures"].update(layer=0, heads={"tiny": [9]})
    with pytest.raises(ConfigError, match=r"figures.heads.tiny: \[9\] not among the extracted heads"):
        figures.run(load_params(write_params(raw)), root=tmp_path / "f")
    (params.file.parent / "metrics/accuracy/tiny.json").unlink()
    with pytest.raises(ArtifactError, match=r"tiny.json: missing evaluation metrics"):
        figures.run(params, root=tmp_path / "f")


def test_label_modes_are_tables_over_the_descriptive_texts():
    """figures.labels: each mode is one table keyed by chart kind; it may only replace texts the descriptive
    table draws (a misspelt key would silently never apply), and a legend only names conditions."""
    kinds = {k.KIND for k in charts.KINDS} | {"*"}
    conditions = set(style.LABELS)
    for mode, table in style.MODES.items():
        assert set(table) <= kinds, mode
        for kind, texts in table.items():
            known = set(style.DESCRIPTIVE["*"]) | set(style.DESCRIPTIVE.get(kind, {}))
            assert {k.split("@")[0] for k in texts} <= known, (mode, kind)
            assert set(texts.get("legend", {})) <= conditions, (mode, kind)
        for kind in kinds - {"*"}:
            labels = style.Labels(mode, kind)
            assert all(labels.legend(c) for c in conditions)
    paper_heads = style.Labels("paper", "heads")
    assert paper_heads.legend("mless") == "w/ meaningless tokens" and paper_heads["y"] == "Average Attention Weight"
    assert style.Labels("descriptive", "heads").legend("mless") == style.LABELS["mless"]


def test_the_papers_models_are_named_by_their_params_keys():
    """The paper beside this run recognises the paper's models by their names in params (the GPU profile's),
    whatever their display names."""
    gpu = load_params(ROOT / "profiles/gpu.yaml")
    assert paper.PAPER_MODELS == {n: m.display_name for n, m in gpu.models.items()}
    assert {m for seeds in paper.SEEDS.values() for m, *_ in seeds} <= set(paper.PAPER_MODELS.values())
    assert set(paper.ACCURACY) <= set(paper.PAPER_MODELS.values())


def _datasets(f) -> list[str]:
    import h5py

    found = []
    f.visititems(lambda k, o: found.append(k) if isinstance(o, h5py.Dataset) else None)
    return found


def test_the_chart_kinds_are_the_packages_modules_in_their_order():
    """charts.KINDS is every module of charts/ that declares KIND (no list kept by hand): the per-model kinds first,
    each group by ORDER, each ORDER once, and every kind with the parts figures and report call."""
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(charts.__path__)}
    assert {k.__name__.rsplit(".", 1)[1] for k in charts.KINDS} == modules - {"style"}
    assert charts.KINDS == charts.PER_MODEL + charts.STUDY and all(k.PER_MODEL for k in charts.PER_MODEL)
    for group in (charts.PER_MODEL, charts.STUDY):
        assert [k.ORDER for k in group] == sorted({k.ORDER for k in group})
    for k in charts.KINDS:
        assert callable(k.draw) and callable(k.explain) and k.SECTION and k.TEXT.startswith("charts/"), k.KIND


def test_the_chart_kinds_params_select_are_chart_modules():
    """figures.charts.<kind> (config.CHART_KINDS, checked when params load, before any chart module is imported)
    names chart kinds that charts/ draws; the one-layer kinds draw heads of one layer."""
    from meaningless_tokens.config import CHART_KINDS, ONE_LAYER_KINDS

    kinds = {k.KIND: k for k in charts.KINDS}
    assert set(CHART_KINDS) <= set(kinds) and set(ONE_LAYER_KINDS) <= set(CHART_KINDS)
