"""The report stage on a tiny project: numbers traced back to the artifacts, sentences checked against
them, escaping, Markdown links, and the HTML opened in headless Chromium."""

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

from stages import likelihood, report
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ArtifactError
from tests import tiny
from tests.conftest import ROOT, default_params

# one worker's (an xdist group): the module's project is built once, its tests read it
pytestmark = pytest.mark.xdist_group("report")

EVIL = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
SHOT_DIR = ROOT / "test-output"
SPAN_COUNT = 21


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_dirs):
    """A tiny project folder with every input of the report: two tiny models, one with a hostile name, on the
    AIME 2024 problems."""
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(ROOT / "data", root / "data")
    raw = default_params()
    # an AIME-layout benchmark: Parquet, no level or subject, zero-padded answers, the 2024 rows by a filter
    raw["dataset"].update(benchmark="aime2024", filter={"field": "url", "contains": "2024_AIME"})
    raw["prompt"]["conditions"] = ["none", "mless", "mful", "arm"]  # all four (the default leaves arm out)
    raw["prompt"]["mless"]["count"] = SPAN_COUNT  # not the default 55: the report must state the span it ran
    raw["extract"].update(n_samples=5, showcase=1)
    raw["evaluate"].update(n_samples=4, max_new_tokens=12, batch_size=6,
                           sampling={"n": 2, "temperature": 1.0, "top_p": 0.95, "top_k": 0, "max_new_tokens": 8,
                                     "seed": 0, })
    raw["stats"].update(n_boot=200)
    raw["activations"].update(n_boot=200)
    raw["sweep"].update(counts=[0, 10, 55], attention_samples=3, accuracy_samples=2, likelihood_samples=3, n_boot=200)
    raw["likelihood"].update(n_samples=5, conditions=["none", "mless", "mful", "arm"], solution_tokens=24, n_boot=200)
    raw["arm_tuning"].update(models=["tiny-llama"], n_samples=3, n_boot=200,
                             grid={"llama": [[0.13, 99.5], [0.32, 90.0]], "gemma": [[0.25, 0.85]]})
    raw["figures"].update(n_heads=2, original_positions=30, full_positions=80)
    raw["evaluate"]["models"] = raw["likelihood"]["models"] = ["tiny-llama", "tiny-gemma"]
    raw["models"] = {
        "tiny-llama": {"display_name": "Tiny llama", "family": "llama",
                       "source": {"kind": "local_dir", "path": str(tiny_dirs["llama"])}, "layers": [0, 1, 2]},
        "tiny-gemma": {"display_name": f"Tiny gemma {EVIL}", "family": "gemma3",
                       "source": {"kind": "local_dir", "path": str(tiny_dirs["gemma3"])}, "layers": [0, 1, 2]},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    params = load_params(root / "params.yaml")
    _, written = tiny.run_pipeline(params, root)
    return root, params, written


class NumParser(html.parser.HTMLParser):
    """Collects every <span class="num"> with its data attributes and text, and every tag name."""

    def __init__(self):
        super().__init__()
        self.nums, self.tags, self.imgs, self._open = [], [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "img":
            self.imgs.append(attrs)
        if tag == "span" and attrs.get("class") == "num":
            self._open = {k[5:]: v for k, v in attrs.items() if k.startswith("data-")} | {"text": ""}

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.nums.append(self._open)
            self._open = None


def parse(path):
    p = NumParser()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def recompute(root, num):
    """The number, read again from its source with h5py / json (not with the report's own reader)."""
    if num["src"].endswith(".json"):
        value = json.loads((root / num["src"]).read_text())
        for k in num["key"].split("."):
            value = value[k]
        return float(value) * float(num["scale"])
    m = re.fullmatch(r"([^\[]+)(?:\[(.*)\])?", num["key"])
    with h5py.File(root / num["src"], "r") as f:
        arr = np.asarray(f.attrs[m[1][1:]]) if m[1].startswith("@") else f[m[1]][()]
    index, start = [], 0
    for part in (m[2].split(",") if m[2] else []):
        if ":" in part:
            a, b = (int(x) if x else None for x in part.split(":"))
            index.append(slice(a, b))
            start = a or 0
        else:
            index.append(int(part))
    sel = arr[tuple(index)]
    value = {"value": lambda: float(sel), "mean": lambda: float(np.mean(sel)), "max": lambda: float(np.max(sel)),
             "argmax": lambda: float(np.argmax(sel) + start)}[num["op"]]()
    return value * float(num["scale"])


def test_every_number_traces_back_to_its_artifact(project):
    root, params, (html_path, md_path) = project
    nums = parse(html_path).nums
    assert len(nums) > 100
    sources = {n["src"] for n in nums}
    for name in params.models:  # every kind of input is quoted
        assert {f"artifacts/stats/{name}.h5", f"metrics/accuracy/{name}.json", f"artifacts/activations/{name}.h5",
                f"artifacts/sweep/{name}.h5", f"metrics/timing/extract-{name}.json",
                f"artifacts/likelihood/{name}.h5"} <= sources
    assert "reports/likelihood.json" in sources
    md = md_path.read_text(encoding="utf-8")
    for n in nums:
        value = recompute(root, n)
        assert value == pytest.approx(float(n["value"]), rel=1e-9, abs=1e-12), n
        shown = format(round(value) if n["fmt"] == "d" else value, n["fmt"])
        assert n["text"] == shown, n
        assert n["text"] in md  # the Markdown quotes the same numbers


def test_sentences_agree_with_the_numbers(project):
    root, params, (html_path, _) = project
    text = re.sub(r"<[^>]+>", "", html_path.read_text(encoding="utf-8"))
    checked = 0
    # each chart's key observations stand above its folded details
    for m in re.finditer(r"Original tokens receive the most attention under (\w+) and the least under (\w+)\..*?"
                         r"Mean attention on original tokens \(positions 1 on\): none ([\d.]+); mless ([\d.]+); "
                         r"mful ([\d.]+)\.", text, re.S):
        means = dict(zip(("none", "mless", "mful"), map(float, m.groups()[2:])))
        assert means[m[1]] == max(means.values()) and means[m[2]] == min(means.values())
        checked += 1
    for m in re.finditer(r"The meaningless span draws (more|less) attention than the meaningful one \(([\d.]+) % "
                         r"vs ([\d.]+) %\)", text):
        assert (float(m[2]) > float(m[3])) == (m[1] == "more") or m[2] == m[3]
        checked += 1
    for m in re.finditer(r"Meaningless tokens lower the mean attention on original tokens in (no layer|all (\d) "
                         r"layers|(\d) of (\d) layers)", text):
        assert m[1] == "no layer" or int(m[2] or m[4]) == len(params.figures.sweep_layers) > int(m[3] or 0)
        checked += 1
    assert checked == 3 * len(params.models)
    lam = re.findall(r"original queries after the span keep λ = ([\d.]+) \(none\), ([\d.]+) \(mless\)", text)
    assert len(lam) == len(params.models)
    assert all(float(none) == 1 and float(mless) < 1 for none, mless in lam)  # no span: nothing moves to one
    agree = re.findall(r"agrees on all four measures .*? for (no model|both models|all \d models|\d of \d models)", text)
    assert len(agree) == 1  # the activation chart's interpretation
    # the span sweep: "grows at every step" only where the drop over heads rises from count to count
    grows = re.search(r"The drop over all heads grows at every step of the count for (no model/token series|both "
                      r"model/token series|all (\d) model/token series|(\d) of (\d) model/token series)", text)
    assert grows
    n_grow = 0 if grows[1].startswith("no") else 2 if grows[1].startswith("both") else int(grows[2] or grows[3])
    with_falls = re.findall(r"the drop does not grow from ((?:\d+ to \d+(?:, )?)+)\.", text)
    assert n_grow + len(with_falls) == len(params.models)
    for name in params.models:
        with h5py.File(root / f"artifacts/sweep/{name}.h5", "r") as f:
            d = f["token_0/drop_heads_pct"][()]
            acc = f["token_0/accuracy"][()]
        counts = list(params.sweep.counts)
        falls = [f"{counts[i]} to {counts[i + 1]}" for i in range(len(d) - 1) if not d[i + 1] > d[i]]
        assert (", ".join(falls) in with_falls) if falls else True
        peaks = [str(c) for c, a in zip(counts, acc) if a == acc.max()]
        assert re.search(rf"accuracy peaks at counts? {', '.join(peaks)} \(", text), peaks
    for section in ("Overview", "Axes and legend", "Detailed analysis", "Key observations", "Interpretation"):
        assert text.count(section) == 3 * len(params.models) + 8  # once per chart (pass@k: sampling ran)


def test_text_from_data_is_escaped_and_output_deterministic(project):
    root, params, (html_path, md_path) = project
    page = html_path.read_text(encoding="utf-8")
    p = parse(html_path)
    assert "script" not in p.tags and all(set(img) == {"src", "alt"} for img in p.imgs)
    assert "Tiny gemma &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;img src=x onerror" in page
    assert "\\<script\\>" in md_path.read_text(encoding="utf-8")
    before = html_path.read_bytes(), md_path.read_bytes()
    assert tuple(p.read_bytes() for p in report.run(params)) == before


def test_arm_is_the_fourth_bar_and_has_its_section(project):
    from meaningless_tokens import arm

    root, params, (html_path, md_path) = project
    md = md_path.read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", html_path.read_text(encoding="utf-8")))
    for page in (md, text):
        assert len(re.findall(r"arm − none: [+-][\d.]+ points", page)) == len(params.models)  # accuracy chart
        assert "ARM (arm: the none prompt, Layer 1's MLP activations redistributed) raises accuracy for" in page
    assert all(d in text for d in arm.DIFFERENCES)
    section = md.split("\n## ARM\n")[1].split("\n## ")[0]
    assert section.count("\n- ") == len(arm.DIFFERENCES)
    table = re.findall(r"^\| (Tiny [^|]+?) \| (evaluate|likelihood) \| (llama|gemma) \| ([\d.]+) \| ([\d.]+) \|", md, re.M)
    # each stage that ran arm, with the setting it ran (the likelihood stage scores arm wherever its conditions hold it)
    evaluated = [("evaluate", "llama", "0.13", "99.5"), ("evaluate", "gemma", "0.25", "0.85")]
    assert [row[1:] for row in table][:2] == evaluated
    assert all(row[2:] == {"llama": ("llama", "0.13", "99.5"), "gemma": ("gemma", "0.25", "0.85")}[row[2]]
               for row in table)
    assert re.findall(r"^\| Tiny llama \| arm \| ", md, re.M)  # the accuracy table's fourth row
    with h5py.File(root / "artifacts/attention/tiny-llama.h5", "r") as f:
        assert list(f.attrs["conditions"]) == ["none", "mless", "mful"] and list(f.attrs["skipped_conditions"]) == ["arm"]


def test_the_benchmark_is_named_and_its_problems_are_the_filtered_rows(project):
    root, params, written = project
    md = written[1].read_text(encoding="utf-8")
    assert "## Accuracy" in md and "AIME 2022-2024 (url holds 2024\\_AIME) accuracy of each model" in md
    assert "the paper, % (approx.)" not in md  # its MATH-500 accuracies are not set beside another benchmark
    # sampling ran: the pass@k chart (pass@2 with 2 samples) and its section, arm beside none
    assert "### Sampling: pass@k and 2-gram diversity" in md and "arm pass@2" in md and "arm − none: pass@2" in md
    assert (root / "reports/figures/pass-at-k.png").is_file()
    with h5py.File(root / "artifacts/eval/tiny-llama.h5", "r") as f:
        index = f["problems/index"][()]
        assert all(60 <= i < 90 for i in index) and set(f["problems/level"][()]) == {-1}
        assert all(len(a) == 3 for a in f["problems/answer"].asstr()[()])  # zero-padded AIME answers
        prov = json.loads(f.attrs["provenance"])
    assert prov["dataset_file"]["label"].startswith("AIME 2022-2024") and prov["dataset_sha256"].startswith("025484a9")


def test_markdown_links_resolve(project):
    root, params, (_, md_path) = project
    md = md_path.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", md)
    explore = [link for link in links if link.startswith("explorer.html#")]  # the explorer stage's page, beside it
    inner = [link for link in links if link.startswith("#")]  # the verdict's links to its sections
    anchors = {m.lower().replace(" ", "-") for m in re.findall(r"^## (.+)$", md, re.M)}
    assert inner and all(link[1:] in anchors for link in inner), set(inner)
    links = [link for link in links if link not in explore and link not in inner]
    assert len(links) == 3 * len(params.models) + 8
    for link in links:
        assert (md_path.parent / link).is_file(), link
    # each attention chart (three per model, and cross-model) opens its first head in the explorer
    assert len(explore) == 3 * len(params.models) + len(params.models)
    assert all(re.fullmatch(r"explorer\.html#model=tiny-(llama|gemma)&layer=\d+&head=\d+&cond=mless", x) for x in explore)


def test_missing_chart_or_metrics_is_named_and_nothing_is_written(project, tmp_path):
    root, params, _ = project
    copy = tmp_path / "p"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("cache"))
    (copy / "reports" / "report.html").unlink()
    (copy / "reports" / "report.md").unlink()
    (copy / "reports" / "figures" / "accuracy.png").unlink()
    bad = load_params(copy / "params.yaml")
    with pytest.raises(ArtifactError, match=r"reports/figures/accuracy\.png: missing chart"):
        report.run(bad)
    (copy / "metrics" / "accuracy" / "tiny-llama.json").write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "stages.report", "--params", str(copy / "params.yaml")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "metrics/accuracy/tiny-llama.json: not valid JSON" in proc.stderr
    assert not (copy / "reports" / "report.html").exists() and not (copy / "reports" / "report.md").exists()
    assert not list((copy / "reports").glob("*.partial"))


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not chromium(), reason="Debian chromium not installed (apt-get install chromium)")
def test_html_opens_in_headless_chromium(project):
    from playwright.sync_api import sync_playwright

    root, params, (html_path, _) = project
    errors, requests, dialogs = [], [], []
    with sync_playwright() as pw:
        # a fresh temporary profile (non-persistent context); any request off the disk is refused
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.route(re.compile(r"^(https?|wss?|ftp):"), lambda route: route.abort())
        page.goto(html_path.as_uri(), wait_until="load")
        images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        title = page.title()
        SHOT_DIR.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOT_DIR / "report-top.png"))
        browser.close()
    assert title.startswith("Meaningless tokens")
    assert len(images) == 3 * len(params.models) + 8 and all(ok and w > 0 for ok, w in images), images
    assert errors == [] and dialogs == []
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert (SHOT_DIR / "report-top.png").stat().st_size > 10_000


def test_a_model_of_a_paper_models_shape_is_described_with_traced_numbers(project, monkeypatch):
    """The "at a glance" note for a model shaped exactly like one of the paper's (its manifest's facts): the
    Layer 1 drop, λ and the activation shift, each number read back from its file."""
    from meaningless_tokens.report import paper
    from meaningless_tokens.results.context import load_context

    root, params, _ = project
    facts = json.loads((root / "artifacts/models/tiny-llama.json").read_text())["facts"]
    monkeypatch.setitem(paper.SHAPES, "Qwen2.5-Math-1.5B", tuple(facts[k] for k in paper.SHAPE_KEYS))
    notes = paper.shape_notes(load_context(params))
    assert len(notes) == 1
    p = NumParser()
    p.feed(str(notes[0].__html__()))
    text = html.unescape(re.sub(r"<[^>]+>", "", str(notes[0].__html__())))
    assert text.startswith("Tiny llama has the shape of the paper's Qwen2.5-Math-1.5B (4 layers, 4 query / 2 kv heads")
    assert "λ = " in text and "near-zero share" in text
    assert len(p.nums) == 13  # 5 shape facts, the drop, λ, two differences with their intervals
    for num in p.nums:
        assert recompute(root, num) == pytest.approx(float(num["value"]), rel=1e-9, abs=1e-12), num


def test_likelihood_section_is_a_proxy_and_its_links_recompute(project):
    """The likelihood section says it is a proxy; reports/likelihood.json's rank correlations and accuracy flips
    equal a recomputation from the artifacts with scipy (problems matched by index)."""
    from scipy.stats import spearmanr

    root, params, (html_path, _) = project
    text = re.sub(r"<[^>]+>", "", html_path.read_text(encoding="utf-8"))
    assert "Likelihood is a proxy" in text and "it cannot replace accuracy" in text
    link = json.loads((root / "reports/likelihood.json").read_text())
    for name in params.models:
        with h5py.File(root / f"artifacts/likelihood/{name}.h5", "r") as f:
            index = list(f["problems/index"][()])
            gain = dict(zip(index, f["contrasts/mless-none/solution/diff"][()]))
        with h5py.File(root / f"artifacts/stats/{name}.h5", "r") as f:
            drop = dict(zip(f["problem_index"][()], (f["none/orig_mean"][()] - f["mless/orig_mean"][()])[:, 0].mean(-1)))
        common = [i for i in index if i in drop]
        entry = link["models"][name]["contrasts"]["mless-none"]["solution"]["attention_drop"]
        assert entry["n"] == len(common) >= 3
        assert entry["rho"] == pytest.approx(spearmanr([gain[i] for i in common], [drop[i] for i in common])[0], abs=1e-6)
        assert entry["ci95_low"] <= entry["rho"] <= entry["ci95_high"]
        assert "arm-none" in link["models"][name]["contrasts"]  # arm: its activation shift (no attention shift)
        assert "attention_drop" not in link["models"][name]["contrasts"]["arm-none"]["solution"]
        with h5py.File(root / f"artifacts/eval/{name}.h5", "r") as f:
            ev = dict(zip(f["problems/index"][()], zip(f["none/correct"][()], f["mless/correct"][()])))
        acc = link["models"][name]["accuracy"]["mless-none"]
        both = [i for i in index if i in ev]
        assert acc["n"] == len(both)
        assert acc["to_right"]["n"] == sum(ev[i][1] and not ev[i][0] for i in both)
        assert acc["unchanged"]["n"] == sum(ev[i][1] == ev[i][0] for i in both)
        assert re.search(rf"{re.escape(params.models[name].display_name)}, mless-none: rank correlation of the solution "
                         r"gain with attention drop ρ = [+-]\d", text) or "Tiny gemma" in params.models[name].display_name


# ---- the verdict, the power, the prose and the page's shape (issue: the report as a reader wants it) ----------

KEYS_BEFORE = ROOT / "tests" / "data" / "report_keys_before.json"  # traced keys and page height of the report before


def test_the_verdict_rule_on_hand_made_intervals():
    from meaningless_tokens.report.verdict import word

    assert word(0.1, 2.0) == "reproduced" and word(0.1, 2.0, +1) == "reproduced"
    assert word(-2.0, -0.1) == "contradicted"
    assert word(-2.0, -0.1, -1) == "reproduced" and word(0.1, 2.0, -1) == "contradicted"
    assert word(-1.0, 1.0) == word(-1.0, 1.0, -1) == "inconclusive"
    assert word(0.0, 1.0) == word(-1.0, 0.0) == word(0.0, 0.0) == "inconclusive"  # an end on zero includes it
    for bad in ((float("nan"), 1.0), (0.0, float("inf")), (2.0, 1.0)):
        with pytest.raises(ValueError):
            word(*bad)
    with pytest.raises(ValueError):
        word(0.1, 1.0, 0)
    with pytest.raises(ValueError):
        word(0.1, 1.0, 1, 0.0)


def test_five_words_one_rule_each():
    """'ruled out' apart from 'inconclusive': the far end on the predicted side below the smallest effect of
    interest, whether or not the interval excludes zero; 'contradicted' stays; no width decides nothing."""
    from meaningless_tokens.report.verdict import RULES, WORDS, word

    assert list(RULES) == list(WORDS)
    assert word(-0.5, 1.5, +1, 2.0) == "ruled out"       # includes zero, excludes 2 or more
    assert word(0.2, 1.5, +1, 2.0) == "ruled out"        # excludes zero too: an effect, smaller than of interest
    assert word(0.2, 2.5, +1, 2.0) == "reproduced"       # reaches 2
    assert word(-0.5, 2.5, +1, 2.0) == "inconclusive"    # includes zero and 2: too few problems
    assert word(-3.0, -0.5, +1, 2.0) == "contradicted"   # the other side wins over ruled out
    assert word(-1.5, 0.5, -1, 2.0) == "ruled out"       # predicted negative: its far end is the low one
    assert word(-2.5, 0.5, -1, 2.0) == "inconclusive"
    assert word(0.0, 0.0, +1, 2.0) == "inconclusive"     # no problem changed its grade: nothing is excluded
    assert word(-0.5, 1.5, +1, None) == "inconclusive"   # no smallest effect of interest: never ruled out


def test_p_values_agree_with_the_words_and_holm_corrects_them():
    from meaningless_tokens.report import pooling
    from meaningless_tokens.report.verdict import word

    rng = np.random.default_rng(0)
    for _ in range(500):
        est = rng.normal()
        low, high = est - rng.uniform(0.01, 2), est + rng.uniform(0.01, 2)  # skewed intervals too
        p = pooling.p_value(est, low, high)
        assert (p < 0.05) == (word(low, high) in ("reproduced", "contradicted")), (est, low, high, p)
    assert pooling.p_value(0.0, -1.0, 1.0) == 1.0 and pooling.p_value(1.0, 1.0, 1.0) == 1.0
    # Holm: the smallest p against alpha / m, the next against alpha / (m - 1), ...; it stops at the first failure
    assert pooling.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert pooling.holm([0.001, 0.002]) == [True, True] and pooling.holm([]) == []


def test_pooling_across_models_by_random_effects():
    from meaningless_tokens.report import pooling

    se = 0.5
    half = pooling.Z95 * se
    same = pooling.pool([1.0, 1.0, 1.0], [1.0 - half] * 3, [1.0 + half] * 3)
    assert same.estimate == pytest.approx(1.0) and same.tau2 == pytest.approx(0.0, abs=1e-12) and same.i2 == 0.0
    assert same.k == 3 and same.low < 1.0 < same.high
    apart = pooling.pool([-3.0, 0.0, 3.0], [-3.0 - half, -half, 3.0 - half], [-3.0 + half, half, 3.0 + half])
    assert apart.estimate == pytest.approx(0.0, abs=1e-9) and apart.tau2 > 8 and apart.i2 > 0.9
    assert apart.high - apart.low > same.high - same.low  # disagreement widens the pooled interval
    assert pooling.pool([1.0], [0.0], [2.0]) is None                        # one model: nothing to pool
    assert pooling.pool([1.0, 0.0], [0.0, 0.0], [2.0, 0.0]) is None         # a zero-width interval has no weight


def test_the_paper_beside_a_cell_of_its_own_model():
    """A model the paper ran: the cell states the paper's number, whether it lies in our interval and the ratio;
    the paper's effect is then the smallest effect of interest."""
    from meaningless_tokens.report import paper
    from meaningless_tokens.report.verdict import Cell, judge

    g1 = paper.reported("g1")
    assert g1.values == {"Qwen2.5-Math-1.5B": 2, "Qwen2.5-Math-7B": 3, "Llama-3.1-8B-Instruct": 2}
    assert g1.status == "figure" and paper.reported("f1").status == "unchecked"
    assert paper.reported("f1").values["Llama-3.1-8B-Instruct"] == pytest.approx(2.8)
    assert paper.reported("a") is None
    for block in paper.numbers().values():
        assert block["source"] and block["status"] in ("figure", "unchecked")
    c = Cell("", low=-0.5, high=3.5, estimate=1.5, unit="points", fmt="+.1f")
    judge(c, +1, 3.0, "the paper's effect for this model", 3.0)
    assert c.word == "inconclusive" and "the paper: +3 points for this model, inside the interval" in c.detail
    assert "ours is 0.5 of it" in c.detail
    c = Cell("", low=0.2, high=1.8, estimate=1.0, unit="points", fmt="+.1f")
    judge(c, +1, 3.0, "the paper's effect for this model", 3.0)
    assert c.word == "ruled out" and "excludes +3.0 points or more" in c.detail
    assert "above the interval" in c.detail


def _text(html_path):
    return html.unescape(re.sub(r"<[^>]+>", "", html_path.read_text(encoding="utf-8")))


def test_both_formats_open_with_the_verdict_table(project):
    from meaningless_tokens.report.verdict import WORDS

    root, params, (html_path, md_path) = project
    md = md_path.read_text(encoding="utf-8")
    assert re.findall(r"^## .*$", md, re.M)[:2] == ["## Verdict", "## Power"]
    table = md.split("## Verdict\n")[1].strip().split("\n\n")[0].splitlines()
    assert table[0].count("Tiny llama") == 1 and len(table) >= 2 + 10
    anchors = {m.lower().replace(" ", "-") for m in re.findall(r"^## (.+)$", md, re.M)}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 2 + len(params.models) + 1, line  # claim, the paper, the models, pooled
        target = re.match(r"\[\(([a-h]\d?)\) .*?\]\(#([a-z-]+)\)", cells[0])
        assert target and target[2] in anchors, line
        assert re.match(r"\*\*([a-z ]+)\*\* |fewer than two models", cells[-1]), cells[-1]
        for cell in cells[2:-1]:
            w = re.match(r" ?\[\*\*([a-z ]+)\*\*\]\(#([a-z-]+)\)", cell)
            assert w and w[1] in WORDS and w[2] == target[2], cell
    page = html_path.read_text(encoding="utf-8")
    first_h2 = re.search(r"<h2 id=\"([^\"]+)\"", page)
    assert first_h2[1] == "verdict"
    verdict_html = page.split('<table class="verdict">')[1].split("</table>")[0]
    p = NumParser()
    p.feed(verdict_html)
    assert len(p.nums) >= 3 * 10  # value, low, high per measured cell: each traced (file and key in data-src/-key)
    for n in p.nums:
        assert recompute(root, n) == pytest.approx(float(n["value"]), rel=1e-9, abs=1e-12), n
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert set(re.findall(r'href="#([^"]+)"', verdict_html)) <= ids
    # the rule is stated once, under the table
    from meaningless_tokens.report.verdict import RULE
    assert _text(html_path).count(RULE) == 1 and md.count("Reproduced: the 95 % interval excludes zero") == 1
    assert md.count("After a Holm correction over the table's") == 1


def test_arm_rows_state_their_setting_and_never_vanish(project, tmp_path):
    """(f2) says which setting it judged and how it was chosen (tuned on other problems for tiny-llama, the
    variant's fallback for tiny-gemma); the ARM section sets the tuning beside the in-sample choice; where ARM did
    not run, the (f) rows stay, their cells naming the command that runs it."""
    from meaningless_tokens.report import claims
    from meaningless_tokens.results.context import load_context

    root, params, (_, md_path) = project
    v = json.loads((root / "metrics/verdict.json").read_text())
    f2 = next(r for r in v["claims"] if r["key"] == "f2")["cells"]
    tuned = json.loads((root / "metrics/arm_tuning/tiny-llama.json").read_text())
    assert f2["tiny-llama"]["note"].startswith(f"c {tuned['chosen']['c']:g}, percentile ")
    assert "chosen on 3 other problems among 2 settings" in f2["tiny-llama"]["note"]
    assert f2["tiny-llama"]["low"] == tuned["out_of_sample"]["ci95"][0] or \
        f2["tiny-llama"]["low"] == pytest.approx(tuned["out_of_sample"]["ci95"][0], abs=1e-6)
    assert f2["tiny-gemma"]["note"] == "c 0.25, quantile 0.85, fallback (gemma variant); not tuned"
    md = md_path.read_text(encoding="utf-8")
    assert "| model | grid | tuning / tested problems | chosen (on tuning) |" in md and "selection effect" in md
    # the same project without arm in tiny-gemma's likelihood: f2 not run there, with the command, the row kept
    copy = tmp_path / "p"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("cache"))
    raw = yaml.safe_load((copy / "params.yaml").read_text())
    raw["likelihood"]["conditions"] = ["none", "mless"]
    (copy / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    changed = load_params(copy / "params.yaml")
    os.environ["MLESS_CACHE"], before = str(root / "cache"), os.environ.get("MLESS_CACHE")
    try:
        likelihood.run(changed, "tiny-gemma")
    finally:
        os.environ.pop("MLESS_CACHE") if before is None else os.environ.__setitem__("MLESS_CACHE", before)
    rows = {r.key: r for r in claims.claims(load_context(changed))}
    assert {"f1", "f2"} <= set(rows)
    cell = rows["f2"].cells["tiny-gemma"]
    assert (cell.word, cell.why, cell.run) == ("not run", "arm not scored",
                                               "dvc exp run -S 'likelihood.conditions=[none,mless,arm]'")


def test_verdict_cells_follow_the_rule_from_the_files(project):
    """Each cell's word equals the rule applied to the interval read back with h5py/json (not the report's reader)."""
    from meaningless_tokens.report.verdict import word

    root, params, _ = project
    v = json.loads((root / "metrics/verdict.json").read_text())
    with h5py.File(root / "artifacts/stats/tiny-llama.h5", "r") as f:
        lo, hi = f["mless/layer_drop_pct_ci"][:, 0]
    cell = next(r for r in v["claims"] if r["key"] == "a")["cells"]["tiny-llama"]
    assert cell["word"] == word(lo, hi) and (cell["low"], cell["high"]) == (lo, hi)
    acc = json.loads((root / "metrics/accuracy/tiny-llama.json").read_text())["mless-none"]
    cell = next(r for r in v["claims"] if r["key"] == "g1")["cells"]["tiny-llama"]
    assert cell["word"] == word(100 * acc["ci95_low"], 100 * acc["ci95_high"], 1, params.verdict.sesoi["g1"])
    for r in v["claims"]:
        assert r["direction"] == (-1 if r["key"] in ("e1", "e2") else 1)
        for c in r["cells"].values():
            assert c["word"] == "not run" or c["word"] == word(c["low"], c["high"], r["direction"], c["sesoi"]), (r, c)
            # the tiny models are none of the paper's: their smallest effect of interest is the declared one
            assert c["word"] == "not run" or c["sesoi"] == params.verdict.sesoi.get(r["key"]), (r, c)
        if r["pooled"]:
            assert r["pooled"]["word"] == word(r["pooled"]["low"], r["pooled"]["high"], r["direction"],
                                               params.verdict.sesoi.get(r["key"]))


def test_results_md_is_rendered_from_the_verdict_json_alone(project, tmp_path):
    root, params, _ = project
    written = (root / "docs/results.md").read_text(encoding="utf-8")
    summary = json.loads((root / "metrics/verdict.json").read_text())
    assert report.results_md(summary, root) == written
    assert written.count("](../reports/report.md#") >= len(summary["claims"])
    assert sorted(p.name for p in (root / "docs/results").iterdir()) == ["accuracy.png", "cross-model.png",
                                                                        "likelihood.png"]
    assert "Power" in written and "80 % power" in written


def test_one_model_gets_no_pooled_column(project):
    root, params, _ = project
    summary = json.loads((root / "metrics/verdict.json").read_text())
    assert "pooled over the models" in report.results_md(summary, root)
    one = next(iter(summary["models"]))
    summary["models"] = {one: summary["models"][one]}
    for r in summary["claims"]:
        r["cells"] = {one: r["cells"][one]}
    for outcome in ("accuracy", "likelihood"):
        summary["power"][outcome] = {n: p for n, p in summary["power"][outcome].items() if n == one}
    md = report.results_md(summary, root)
    assert "pooled over the models" not in md and "random-effects" not in md


def test_committed_results_md_matches_the_committed_verdict():
    """On a clean clone: docs/results.md is what the report stage renders from the committed metrics/verdict.json."""
    summary_path, results = ROOT / "metrics/verdict.json", ROOT / "docs/results.md"
    if not summary_path.is_file():
        pytest.skip("metrics/verdict.json not committed yet (dvc repro report writes it)")
    summary = json.loads(summary_path.read_text())
    assert report.results_md(summary, ROOT) == results.read_text(encoding="utf-8")


def test_power_is_stated_beside_the_papers_effect(project):
    root, params, (html_path, md_path) = project
    v = json.loads((root / "metrics/verdict.json").read_text())
    with h5py.File(root / "artifacts/eval/tiny-llama.h5", "r") as f:
        diff = 100 * (f["mless/correct"][()].astype(float) - f["none/correct"][()].astype(float))
    a = v["power"]["accuracy"]["tiny-llama"]
    assert a["n"] == len(diff)
    from statsmodels.stats.power import TTestPower

    def exact(x, n):  # a paired t-test's MDE on n problems at x's spread (tests/test_power.py checks the function)
        return TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8) * x.std(ddof=1)

    if diff.std() > 0:
        assert a["mde_points"] == pytest.approx(exact(diff, len(diff)), rel=1e-2)
    with h5py.File(root / "artifacts/likelihood/tiny-llama.h5", "r") as f:
        d = f["contrasts/mless-none/solution/diff"][()]
    lk = v["power"]["likelihood"]["tiny-llama"]
    assert lk["mde_nats_per_token"] == pytest.approx(exact(d, len(d)), rel=1e-2)
    assert lk["mde_at_500"] == pytest.approx(exact(d, 500), rel=1e-2)
    text = _text(html_path)
    power = text.split("Power")[1].split("Contents")[0]
    assert power.count("Accuracy, ") == power.count("Likelihood, ") == len(params.models)
    assert "the paper reports" in power and "dvc exp run -S" in power


def test_prose_reads_as_written(project):
    """Rules on the rendered reports: signs said with words, no zero counts, no list of every model."""
    root, params, (html_path, md_path) = project
    disp = [m.display_name for m in params.models.values()]
    for page in (_text(html_path), md_path.read_text(encoding="utf-8").replace("\\", "")):
        assert not re.search(r"\b0 of \d", page), re.search(r".{80}\b0 of \d.{40}", page)
        assert not re.search(r"(drop|rise|gain|fall) of [+-]\d", page)
        assert not re.search(r"(drops|rises) by [+-]", page)
        assert "At a glance" not in page
        for a in disp:
            for b in disp:
                if a != b:
                    assert f"({a}, {b})" not in page  # every model named: "all models" says it
    assert "rises by" in _text(html_path) or "drops by" in _text(html_path)


def test_paper_grader_column_never_shows_a_bare_percentage(project):
    root, params, (html_path, md_path) = project
    md = md_path.read_text(encoding="utf-8")
    rows = re.findall(r"^\| Tiny llama \| (none|mless|mful|arm) \|.*$", md, re.M)
    assert rows
    for line in re.findall(r"^\| Tiny llama \| (?:none|mless|mful|arm) \|.*$", md, re.M):
        grader = line.strip("|").split(" | ")[6].strip()
        assert re.fullmatch(r"\d+ % of \d+ boxed|n/a \(no box in (\d+) of \1\)", grader), grader


def test_markdown_payload_stays_text_in_a_commonmark_renderer(project):
    """report.md rendered by markdown-it-py (CommonMark, raw HTML allowed as GitHub does before sanitising): the
    hostile display name never becomes a live tag."""
    from markdown_it import MarkdownIt

    root, params, (_, md_path) = project
    out = MarkdownIt("commonmark").render(md_path.read_text(encoding="utf-8"))
    p = NumParser()
    p.feed(out)
    assert "script" not in p.tags and not any("onerror" in img for img in p.imgs)
    assert "&lt;script&gt;" in out


def test_the_span_stated_is_the_span_extracted(project):
    """The span's count and token come from the artifacts' provenance: the fixture's count, not the default's."""
    root, params, (html_path, md_path) = project
    default = default_params()["prompt"]["mless"]["count"]
    assert params.prompt.mless.count == SPAN_COUNT != default
    html, md = _text(html_path), md_path.read_text(encoding="utf-8")
    assert f'instruction + {SPAN_COUNT} meaningless “/” tokens + question' in html
    assert f'instruction + {SPAN_COUNT} meaningless "/" tokens + question' in md
    for page in (html, md):
        assert f"with {SPAN_COUNT} meaningless tokens (mless)" in page  # the layer-sweep chart's overview
        assert not re.search(rf"\b{default} meaningless", page)


def test_no_traced_number_is_lost(project):
    """Every (file, key) the report traced before the verdict-first layout is still traced."""
    root, params, (html_path, _) = project
    before = set(json.loads(KEYS_BEFORE.read_text())["keys"])
    after = {f"{n['src']}::{n['key']}" for n in parse(html_path).nums}
    assert not before - after, sorted(before - after)[:20]


@pytest.mark.skipif(not chromium(), reason="Debian chromium not installed (apt-get install chromium)")
def test_verdict_above_the_fold_the_first_figure_under_it_and_the_page_half_as_tall(project):
    from playwright.sync_api import sync_playwright

    root, params, (html_path, _) = project
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.route(re.compile(r"^(https?|wss?|ftp):"), lambda route: route.abort())
        page.goto(html_path.as_uri(), wait_until="load")
        table = page.eval_on_selector("table.verdict", "e => e.getBoundingClientRect().bottom")
        figure = page.eval_on_selector("figure.first img", "e => [e.getBoundingClientRect().top, e.naturalWidth]")
        height = page.evaluate("document.documentElement.scrollHeight")
        folded = page.evaluate("Array.from(document.querySelectorAll('details')).every(d => !d.open)")
        SHOT_DIR.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOT_DIR / "report-verdict.png"))
        browser.close()
    # the whole verdict table above the fold; the first figure right under its rules (the paper's numbers, the
    # pooled column and what each word rests on made the table taller than the fold leaves room for both)
    assert table <= 1000 and figure[0] < table + 250 and figure[1] > 0, (table, figure)
    before = json.loads(KEYS_BEFORE.read_text())["height_1280"]
    assert folded and height <= before / 2, (height, before)


def test_lookups_name_their_axes_and_write_the_same_keys():
    """A traced number's element is named by its axes; the key a reader sees is the index text it always was."""
    from meaningless_tokens.results.trace import ALL, index_text

    cases = [("stats", "mless/orig_mean", dict(sample=ALL, layer=1, head=2), ":,1,2"),
             ("stats", "mless/drop_pct_ci", dict(bound="high", layer=0, head=3), "1,0,3"),
             ("stats", "mless/drop_pct", dict(layer=2, head=ALL), "2,:"),
             ("stats", "none/original_avg", dict(layer=0, head=1, position=slice(1, 30)), "0,1,1:30"),
             ("stats", "mless/full_avg", dict(layer=0, head=1, position=7), "0,1,7"),
             ("stats", "mless/layer_drop_pct_ci", dict(bound="low", layer=0), "0,0"),
             ("activations", "mless/original/near_zero_robust_diff_ci", dict(bound="high", layer=0), "1,0"),
             ("activations", "mless/original/l1_diff_p", dict(layer=0), "0"),
             ("activations", "mless/lambda_mean", dict(layer=0, head=ALL), "0,:"),
             ("sweep", "token_0/drop_heads_pct_ci", dict(count=2, bound="low"), "2,0"),
             ("sweep", "token_1/accuracy", dict(count=1), "1"),
             ("likelihood", "contrasts/mless-none/solution/ci", dict(group=0, bound="high"), "0,1"),
             ("likelihood", "contrasts/mless-none/solution/level_n", dict(level=3), "3"),
             ("arm_tuning", "out_of_sample/ci", dict(bound="low"), "0")]
    for kind, ds, at, text in cases:
        assert index_text(kind, ds, at) == text, (kind, ds, at)
    with pytest.raises(ValueError, match=r"no axis \['hi'\].*layer, head"):
        index_text("stats", "mless/drop_pct", dict(layer=0, hi=1))
    with pytest.raises(ValueError, match=r"name the axes \['sample'\]"):
        index_text("stats", "mless/orig_mean", dict(layer=0, head=1))
    with pytest.raises(ValueError, match="no axes known"):
        index_text("stats", "mless/not_a_dataset", dict(layer=0))


def test_a_lookup_refuses_an_index_in_its_key(project):
    from meaningless_tokens.results.trace import Sources

    root, _, _ = project
    src = Sources(root)
    n = src.h5("artifacts/stats/tiny-llama.h5", "mless/drop_pct_ci", fmt="+.1f", bound="high", layer=0, head=1)
    assert (n.key, n.src) == ("mless/drop_pct_ci[1,0,1]", "artifacts/stats/tiny-llama.h5")
    with h5py.File(root / n.src, "r") as f:
        assert n.value == float(f["mless/drop_pct_ci"][1, 0, 1])
    with pytest.raises(ValueError, match=r"name the index by its axes"):
        src.h5("artifacts/stats/tiny-llama.h5", "mless/drop_pct_ci[1,0,1]")


def test_prose_macros_keep_their_values_and_wrap_freely(tmp_path, monkeypatch):
    """A sentence written in a template becomes a Text: a Num keeps its trace, a string from data is escaped for
    each format and keeps its own line breaks, the template's line breaks are one space, a constant is kept."""
    from markupsafe import Markup

    from meaningless_tokens.results import prose
    from meaningless_tokens.results.trace import Num

    (tmp_path / "t.j2").write_text('{% macro s(name, x, xs) -%}\n{{ name }} has\n   {{ x }} [{{ xs | join(", ") }}]'
                                   '{{ " " }}\n{%- endmacro %}\n', encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    prose._environment.cache_clear()
    try:
        num = Num(0.25, "artifacts/stats/m.h5", "mless/drop_pct[0,1]", fmt=".2f")
        text = prose.say("t.j2", "s", name="a_<b>\nc", x=num, xs=[1, 2])
        assert list(text.parts) == ["a_<b>\nc", " has ", num, " [", "1, 2", "]", " "]
        assert str(text) == "a\\_\\<b\\>\nc has 0.25 \\[1, 2\\] "
        assert Markup(text.__html__()).startswith("a_&lt;b&gt;\nc has <span class=\"num\"")
        assert 'data-key="mless/drop_pct[0,1]"' in text.__html__()
        # a second call renders the compiled macro with its own values
        assert str(prose.say("t.j2", "s", name="d", x=num, xs=[])) == "d has 0.25 \\[\\] "
    finally:
        prose._environment.cache_clear()


def test_plain_sentences_join_values_unescaped(tmp_path, monkeypatch):
    """A stored sentence (results/prose.py, plain: metrics/verdict.json's) is the text as written: its values joined
    unescaped (the format that shows it escapes it), the template's line breaks one space."""
    from meaningless_tokens.results import prose

    (tmp_path / "t.j2").write_text('{% macro s(name, n) -%}\n({{ name }}) reproduced\n   for {{ n }} of_2'
                                   '{% if n > 1 %} models{% endif %}.\n{%- endmacro %}\n', encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    prose._environment.cache_clear()
    try:
        assert prose.plain("t.j2", "s", name="a_<b>", n=2) == "(a_<b>) reproduced for 2 of_2 models."
        assert prose.plain("t.j2", "s", name="c", n=1) == "(c) reproduced for 1 of_2."
    finally:
        prose._environment.cache_clear()
