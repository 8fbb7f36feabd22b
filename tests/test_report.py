"""The report stage on a tiny project: numbers traced back to the artifacts, sentences checked against
them, escaping, Markdown links, and the HTML opened in headless Chromium."""

import html.parser
import json
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

from stages import report
from meaningless_tokens.config import load_params
from meaningless_tokens.store import ArtifactError
from tests import tiny
from tests.conftest import ROOT, default_params

EVIL = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
SHOT_DIR = ROOT / "test-output"


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
    raw["extract"].update(n_samples=5, showcase=1)
    raw["evaluate"].update(n_samples=4, max_new_tokens=12, batch_size=6,
                           sampling={"n": 2, "temperature": 1.0, "top_p": 0.95, "top_k": 0, "max_new_tokens": 8,
                                     "seed": 0, })
    raw["stats"].update(n_boot=200)
    raw["activations"].update(n_boot=200)
    raw["sweep"].update(counts=[0, 10, 55], attention_samples=3, accuracy_samples=2, likelihood_samples=3, n_boot=200)
    raw["likelihood"].update(n_samples=5, conditions=["none", "mless", "mful", "arm"], solution_tokens=24, n_boot=200)
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
    for m in re.finditer(r"Mean attention on original tokens \(positions 1 on\): none ([\d.]+); mless ([\d.]+); "
                         r"mful ([\d.]+)\.\s*.*?Original tokens receive the most attention under (\w+) and the "
                         r"least under (\w+)\.", text, re.S):
        means = dict(zip(("none", "mless", "mful"), map(float, m.groups()[:3])))
        assert means[m[4]] == max(means.values()) and means[m[5]] == min(means.values())
        checked += 1
    for m in re.finditer(r"The meaningless span draws (more|less) attention than the meaningful one \(([\d.]+) % "
                         r"vs ([\d.]+) %\)", text):
        assert (float(m[2]) > float(m[3])) == (m[1] == "more") or m[2] == m[3]
        checked += 1
    for m in re.finditer(r"Meaningless tokens lower the mean attention on original tokens in (\d) of (\d) layers", text):
        assert int(m[1]) <= int(m[2]) == len(params.figures.sweep_layers)
        checked += 1
    assert checked == 3 * len(params.models)
    lam = re.findall(r"original queries after the span keep λ = ([\d.]+) \(none\), ([\d.]+) \(mless\)", text)
    assert len(lam) == len(params.models)
    assert all(float(none) == 1 and float(mless) < 1 for none, mless in lam)  # no span: nothing moves to one
    agree = re.findall(r"agrees on all four measures .*? for (\d) of (\d) models", text)
    assert len(agree) == 2 and all(int(a) <= int(b) == len(params.models) for a, b in agree)  # glance + chart
    # the span sweep: "grows at every step" only where the drop over heads rises from count to count
    grows = re.search(r"The drop over all heads grows at every step of the count for (\d) of (\d) model/token series",
                      text)
    assert grows and int(grows[2]) == len(params.models)
    with_falls = re.findall(r"the drop does not grow from ((?:\d+ to \d+(?:, )?)+)\.", text)
    assert int(grows[1]) + len(with_falls) == len(params.models)
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
    table = re.findall(r"^\| (Tiny [^|]+?) \| (llama|gemma) \| ([\d.]+) \| ([\d.]+) \|", md, re.M)
    assert [(v, c, pct) for _, v, c, pct in table] == [("llama", "0.13", "99.5"), ("gemma", "0.25", "0.85")]
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
    links = re.findall(r"\]\(([^)\s]+)\)", md_path.read_text(encoding="utf-8"))
    explore = [link for link in links if link.startswith("explorer.html#")]  # the explorer stage's page, beside it
    links = [link for link in links if link not in explore]
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
    from meaningless_tokens.charts import paper
    from meaningless_tokens.charts.common import load_context

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
