"""The GPU profile's dry run on the CPU (issue 20) and the per-chart selection's bad input.

The dry run: tiny random stand-ins of the paper's four models (their layer, head and kv-head counts and config
families), the GPU profile's prompt, figures and report params, a few problems, through every stage in-process
(`run(...)`, as `python -m tests.dry_run` does with `dvc repro`): every seed chart is drawn with the paper's
title, legend, axis title and x range, at the paper's 0-based head, and the report renders with the paper beside
this run."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from meaningless_tokens import charts
from stages import extract, figures
from meaningless_tokens.results.context import load_context
from meaningless_tokens.config import check_model_facts, load_params
from meaningless_tokens.errors import ConfigError
from tests import dry_run, tiny
from tests.conftest import ROOT

# stem -> the paper's panel titles (heads counted from 1 as in the paper: Head 22 is index 21)
SEED_TITLES = {
    "qwen2_5-math-7b-layer-sweep": [f"Qwen2.5-Math-7B Layer {k} Head 22" for k in (1, 2, 3)],
    "qwen2_5-math-7b-heads": [f"Qwen2.5-Math-7B Layer 1 Head {h}" for h in (1, 2, 8)] * 2,
    "llama3_1-8b-instruct-heads": [f"Llama-3.1-8B-Instruct Layer 1 Head {h}" for h in (20, 25, 26)] * 2,
    "cross-model": ["Qwen2.5-Math-7B Layer 1 Head 1", "Llama-3.1-8B-Instruct Layer 1 Head 27",
                    "Gemma-3-4b-it Layer 1 Head 8"],
}


# the whole pipeline in-process on four stand-ins (minutes of module setup, so one worker's: an xdist group)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dry-run")]

@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-dry-run")
    dirs = dry_run.build_models(root / "models")
    (root / "params.yaml").write_text(yaml.safe_dump(dry_run.dry_run_params(dirs, absolute_paths=True)))
    params = load_params(root / "params.yaml")
    written, (html, md) = tiny.run_pipeline(params, root)
    return root, params, dirs, written, html, md


def test_stand_ins_have_the_paper_models_shapes(dry):
    root, params, dirs, *_ = dry
    gpu = yaml.safe_load((ROOT / "profiles/gpu.yaml").read_text())
    for name, (family, layers, heads, kv, _) in tiny.PAPER_SHAPES.items():
        manifest = json.loads((root / f"artifacts/models/{name}.json").read_text())
        facts = manifest["facts"]
        assert (facts["num_layers"], facts["num_heads"], facts["num_kv_heads"]) == (layers, heads, kv), name
        assert facts["model_type"] == family == gpu["models"][name]["family"], name
    # Gemma-3-4b-it: the multimodal wrapper around a text model with 5 sliding : 1 full layers
    text = json.loads((dirs["gemma3-4b-it"] / "config.json").read_text())["text_config"]
    assert text["layer_types"][:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert text["layer_types"].count("full_attention") == 34 // 6 and text["sliding_window"] == 1024
    # everything but the sources and the CPU's sizes is the GPU profile's
    here, there = params.model_dump(), load_params(ROOT / "profiles/gpu.yaml").model_dump()
    for d in (here, there):  # the dry run's params file names the shipped text by its absolute path
        d["prompt"]["mful"]["text_file"] = str(ROOT / d["prompt"]["mful"]["text_file"])
    assert here["prompt"] == there["prompt"] and here["figures"] == there["figures"]
    assert {n: m.display_name for n, m in params.models.items()} == {n: m["display_name"] for n, m in gpu["models"].items()}


def test_every_seed_chart_is_drawn_as_the_paper_draws_it(dry):
    root, params, dirs, written, *_ = dry
    stems = sorted({p.stem for p in written})
    assert stems == sorted(["qwen2_5-math-7b-layer-sweep", "qwen2_5-math-7b-heads", "llama3_1-8b-instruct-heads",
                            "qwen2_5-math-7b-conditions", "cross-model", "accuracy", "activations", "activation-shift",
                            "span-sweep", "span-accuracy", "likelihood", "pass-at-k"])
    plt = figures._setup()
    ctx = load_context(params)
    drawn = {charts.stem(k, n): k.draw(plt, ctx, n) for k in charts.KINDS if k.KIND in
             ("layer-sweep", "heads", "conditions", "cross-model", "accuracy")
             for n in (ctx.chart_models(k.KIND) if k.PER_MODEL else [None])}
    for stem, titles in SEED_TITLES.items():
        assert [a.get_title() for a in drawn[stem].axes] == titles, stem
    cond = drawn["qwen2_5-math-7b-conditions"]
    assert cond._suptitle.get_text() == "Average attention on Head 14"
    assert [t.get_text() for t in cond.axes[0].get_legend().get_texts()] == ["None", "Mless", "Mful"]
    assert [t.get_text() for t in cond.axes[1].get_legend().get_texts()] == ["Mless", "Mful", "Meaningless tokens"]
    heads = drawn["llama3_1-8b-instruct-heads"]
    assert [t.get_text() for t in heads.axes[0].get_legend().get_texts()] == ["w/o meaningless tokens",
                                                                             "w/ meaningless tokens"]
    assert "Meaningless tokens" in [t.get_text() for t in heads.axes[3].get_legend().get_texts()]
    assert [t.get_text() for t in drawn["cross-model"].axes[0].get_legend().get_texts()] == [
        "Meaningless tokens", "Random sentence"]
    for stem in SEED_TITLES:
        for ax in drawn[stem].axes:
            assert ax.get_ylabel() == "Average Attention Weight"
    # x ranges 0-60 (original tokens) and 0-120 (full prompt)
    assert drawn["qwen2_5-math-7b-heads"].axes[0].get_xlim() == (0, 60)
    assert drawn["qwen2_5-math-7b-heads"].axes[3].get_xlim() == (0, 120)
    assert cond.axes[0].get_xlim() == (0, 60) and cond.axes[1].get_xlim() == (0, 120)
    acc = drawn["accuracy"].axes[0]
    assert acc.get_title() == "Results on Math-500"
    assert [t.get_text() for t in acc.get_xticklabels()] == ["Qwen2.5-Math-1.5B", "Qwen2.5-Math-7B",
                                                             "Llama-3.1-8B-Instruct"]
    assert [t.get_text() for t in acc.get_legend().get_texts()] == ["w/o", "w/ Mless", "w/ Mful"]
    # the curves are the paper's heads (0-based in the file): Head 22 is index 21, Head 14 index 13
    st = ctx.stats["qwen2_5-math-7b"]
    for k, ax in enumerate(drawn["qwen2_5-math-7b-layer-sweep"].axes):
        np.testing.assert_array_equal(ax.lines[1].get_ydata(), st["mless"]["original_avg"][k, 21, :60])
    np.testing.assert_array_equal(cond.axes[0].lines[0].get_ydata(), st["none"]["original_avg"][0, 13, :60])
    gemma = ctx.stats["gemma3-4b-it"]
    np.testing.assert_array_equal(drawn["cross-model"].axes[2].lines[0].get_ydata(),
                                  gemma["mless"]["full_avg"][0, 7, :120])
    for fig in drawn.values():
        plt.close(fig)


def test_the_report_puts_the_paper_beside_this_run(dry):
    root, params, dirs, written, html, md = dry
    text = md.read_text()
    assert "Layers and heads are numbered from 1, as in the paper" in text
    assert "Instruction: `Please reason step by step and put your final answer within \\boxed{}.`" in text
    # one comparison table per seed chart, each row a claim, this run's number and a verdict
    tables = re.findall(r"#### The paper beside this run\n\n\| the paper's chart says \| this run \| verdict \|\n"
                        r"\|---\|---\|---\|\n((?:\|.*\n)+)", text)
    assert len(tables) == 6  # layer sweep, Qwen and Llama heads, Head 14, cross-model, accuracy
    rows = [r for t in tables for r in t.splitlines()]
    assert all(r.endswith(("| agrees |", ")|", ") |")) or "does not agree" in r for r in rows)
    assert any("Layer 1 Head 22: with meaningless tokens" in r for r in rows)
    assert sum("Llama-3.1-8B-Instruct Layer 1 Head" in r and "collapses to about 0.00-0.01" in r for r in rows) == 3
    assert any("Gemma-3-4b-it Layer 1 Head 8" in r for r in rows)
    # the accuracy table's last column: the paper's values where the model is the paper's, none for Gemma
    table = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|")[-2].strip()
             for line in text.splitlines() if line.startswith("| Qwen2.5-Math") or line.startswith("| Llama-3.1")
             or line.startswith("| Gemma-3-4b-it |")}
    assert [table[("Qwen2.5-Math-1.5B", c)] for c in ("none", "mless", "mful")] == ["64", "66", "66"]
    assert [table[("Qwen2.5-Math-7B", c)] for c in ("none", "mless", "mful")] == ["73", "76", "74"]
    assert [table[("Llama-3.1-8B-Instruct", c)] for c in ("none", "mless", "mful")] == ["44", "46", "48"]
    assert table[("Gemma-3-4b-it", "none")] == "—"
    # the verdict: the paper's number beside each cell of a model the paper ran, and it is the cell's smallest
    # effect of interest (paper.yaml: the chart's mless and mful gains, Table 2's ARM gains)
    v = json.loads((root / "metrics/verdict.json").read_text())
    cells = {r["key"]: r["cells"] for r in v["claims"]}
    expect = {"g1": {"qwen2_5-math-1_5b": 2, "qwen2_5-math-7b": 3, "llama3_1-8b-instruct": 2},
              "g2": {"qwen2_5-math-1_5b": 2, "qwen2_5-math-7b": 1, "llama3_1-8b-instruct": 4},
              "f1": {"qwen2_5-math-1_5b": 3.2, "qwen2_5-math-7b": 1.0, "llama3_1-8b-instruct": 2.8, "gemma3-4b-it": 1.4}}
    for key, by_model in expect.items():
        for name, value in by_model.items():
            c = cells[key][name]
            if c["word"] == "not run":
                continue
            assert c["paper"] == pytest.approx(value) and c["sesoi"] == pytest.approx(value), (key, name, c)
            assert c["sesoi_from"] == "the paper's effect for this model" and f"the paper: {value:+g} points" in c["detail"]
    assert cells["g1"]["gemma3-4b-it"]["paper"] is None  # the chart has no Gemma bar: the declared value applies
    assert any(c["word"] != "not run" for key in expect for c in cells[key].values())
    page = html.read_text()
    assert page.count("<h4>The paper beside this run</h4>") == 6 and "the paper, % (approx.)" in page
    # every number of the comparison tables, like every other, reads back from its artifact
    from tests.test_report import parse, recompute
    tables = re.findall(r'<table class="paper">.*?</table>', page, re.S)
    assert len(tables) == 6 and all('class="num"' in t for t in tables)
    nums = parse(html).nums
    assert len(nums) > 100
    for n in nums:
        assert recompute(root, n) == pytest.approx(float(n["value"]), rel=1e-9, abs=1e-12), n


def test_the_papers_literal_instruction_is_recorded(dry, tmp_path):
    """`\\boxed{{}}` (the paper code's text) runs as written and the report says which instruction ran."""
    root, params, *_ = dry
    raw = params.model_dump()
    raw["prompt"]["instruction"] = "Please reason step by step and put your final answer within \\boxed{{}}."
    raw["models"] = {"qwen2_5-math-7b": raw["models"]["qwen2_5-math-7b"]}
    raw["evaluate"]["models"] = raw["likelihood"]["models"] = ["qwen2_5-math-7b"]
    raw["figures"]["charts"] = {k: v for k, v in raw["figures"]["charts"].items() if k in ("layer-sweep", "conditions")}
    raw["figures"]["charts"]["accuracy"] = {"models": ["qwen2_5-math-7b"], "layers": None, "heads": None}
    path = root / "params-literal.yaml"  # beside the dry run's prepared models
    path.write_text(yaml.safe_dump(raw))
    p = load_params(path)
    out = extract.run(p, "qwen2_5-math-7b", root=tmp_path)
    import h5py
    with h5py.File(out) as f:
        prov = json.loads(f.attrs["provenance"])
        assert prov["params"]["prompt"]["instruction"].endswith("\\boxed{{}}.")
        ids = f["none/input_ids"][()]
    tok = __import__("transformers").AutoTokenizer.from_pretrained(p.project_path(p.models["qwen2_5-math-7b"].source.path))
    assert "\\boxed{{}}." in tok.decode(ids[:80])


def test_chart_selection_bad_input(dry, tmp_path):
    _, params, *_ = dry
    base = params.model_dump()

    def load(**charts_):
        raw = json.loads(json.dumps(base))
        raw["figures"]["charts"].update(charts_)
        path = dry[0] / "params-bad.yaml"  # beside the dry run's artifacts
        path.write_text(yaml.safe_dump(raw))
        return load_params(path)

    with pytest.raises(ConfigError, match=r"params-bad.yaml: figures.charts.heads.models: \['qwen3-32b'\] not configured"):
        load(heads={"models": ["qwen3-32b"], "layers": [0], "heads": "auto"})
    with pytest.raises(ConfigError, match=r"figures.charts.layer-sweep.layers: \[5\] not extracted for qwen2_5-math-7b"):
        load(**{"layer-sweep": {"models": ["qwen2_5-math-7b"], "layers": [0, 5], "heads": "auto"}})
    with pytest.raises(ConfigError, match=r"figures.charts.heads.layers: this chart shows one layer"):
        load(heads={"models": ["qwen2_5-math-7b"], "layers": [0, 1], "heads": "auto"})
    with pytest.raises(ConfigError, match=r"figures.charts.conditions.heads.llama3_1-8b-instruct: no heads named"):
        load(conditions={"models": ["qwen2_5-math-7b", "llama3_1-8b-instruct"], "layers": [0],
                         "heads": {"qwen2_5-math-7b": [13]}})
    with pytest.raises(ConfigError, match=r"figures.charts.accuracy: the accuracy chart has no layers or heads"):
        load(accuracy={"models": ["qwen2_5-math-7b"], "heads": "auto"})
    with pytest.raises(ConfigError, match=r"figures.charts: unknown chart kind\(s\) \['head-14'\]"):
        load(**{"head-14": {"models": "all"}})
    # a head beyond the model: known once its config is (prepare), one line naming the key, before any work
    p = load(conditions={"models": ["qwen2_5-math-7b"], "layers": [0], "heads": {"qwen2_5-math-7b": [28]}})
    facts = json.loads((dry[0] / "artifacts/models/qwen2_5-math-7b.json").read_text())["facts"]
    with pytest.raises(ConfigError, match=r"params-bad.yaml: figures.charts.conditions.heads.qwen2_5-math-7b: \[28\] out of "
                                          r"range; the model has 28 query heads \(allowed 0..27, Head 1..28 on the charts\)"):
        check_model_facts(p, "qwen2_5-math-7b", facts)
    with pytest.raises(ConfigError, match=r"figures.charts.conditions.heads.qwen2_5-math-7b: \[28\] not among the "
                                          r"extracted heads"):
        figures.run(p, root=tmp_path)
    # the command line: one error line, status 2
    bad = tmp_path / "bad.yaml"
    raw = json.loads(json.dumps(base))
    raw["figures"]["charts"]["cross-model"]["models"].append("gemma-7b")
    bad.write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "meaningless_tokens.config", "check", str(bad)], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "figures.charts.cross-model.models: ['gemma-7b'] not configured" in proc.stderr
