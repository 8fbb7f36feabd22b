"""The explorer page (stages/explorer.py): its size for the default profile's showcase, the time to make it, and
the time to first paint in headless Chromium for a 512 x 512 matrix.

1. Size: for each model of params.yaml, the attention of layers models.<name>.layers (all heads) on the
   default showcase prompts (the first `extract.showcase` problems of the extraction subset, none / mless /
   mful), captured with the extract stage's own code, encoded as the page encodes them; compared with the
   naive embedding (float16, base64, full T x T).
2. 512 x 512: one model (default: qwen2_5-coder-0_5b, 14 heads) on a prompt made 512 tokens long under mless
   (problem statements glued together), its page written with the stage's `render`, then opened from disk in
   headless Chromium (/usr/bin/chromium through playwright): time to first paint (navigation start to the
   first frame after heatmap, thumbnails, bars and aligned view are drawn) and the time one keyboard step
   (next head: every view redrawn) takes; medians of --repeat page loads.

    python benchmarks/bench_explorer.py [--model NAME] [--repeat 5]
"""

from __future__ import annotations

import argparse
import base64
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import OtherLoad, load_params, machine  # noqa: E402 (puts the project root on sys.path)

import numpy as np


def showcase_attention(params, name: str, n_tokens: int | None = None):
    """{condition: (ids, PromptIds, probs [L, H, T, T])} per showcase prompt, and the tokenizer."""
    from meaningless_tokens import capture, models
    from meaningless_tokens.config import model_spec
    from meaningless_tokens.dataset import Problem, dataset_spec, load_math500, select_problems
    from meaningless_tokens.prompts import builder_for

    spec = model_spec(params, name)
    setup = models.setup_for(params, name)
    prepared = setup.prepared
    heads = list(range(prepared.facts["num_heads"])) if spec.heads == "all" else list(spec.heads)
    layers = list(spec.layers)
    model, tok = models.load(setup, layers=layers)
    capture.install_capture(model)
    builder = builder_for(params.prompt, setup, tok)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    if n_tokens is None:
        chosen = select_problems(problems, params.extract.n_samples, params.extract.seed)[: params.extract.showcase]
    else:  # one problem statement long enough that the mless prompt has n_tokens tokens
        words = " ".join(p.problem for p in problems[:40]).split()
        lo, hi = 1, len(words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            pr = Problem(0, "bench", " ".join(words[:mid]), "", "", "", 1)
            lo, hi = (mid, hi) if len(builder.build(pr)["mless"].input_ids) <= n_tokens else (lo, mid - 1)
        chosen = [Problem(0, "bench", " ".join(words[:lo]), "", "", "bench", 1)]
    out = []
    for p in chosen:
        built = builder.build(p)
        per = {}
        for c in ("none", "mless", "mful"):
            if c in built:
                cap = capture.attention(model, built[c].input_ids, layers)
                per[c] = (built[c], np.stack([cap[layer][heads].cpu().numpy() for layer in layers]))
        out.append((p, per))
    return out, tok, layers, heads


def entry(name: str, disp: str, prompts, tok, layers, heads, blobs: list[str]) -> dict:
    """A model's entry of the page, as meaningless_tokens.report.explorer.collect builds it (without the activation strip)."""
    from meaningless_tokens.report import explorer

    items = []
    for p, per in prompts:
        conds = {}
        for c, (built, probs) in per.items():
            blobs.append(base64.b64encode(explorer.encode(probs)).decode("ascii"))
            conds[c] = {"tokens": [tok.decode([i]) for i in built.input_ids], "span": list(built.span),
                        "original": list(built.original_pos), "blob": len(blobs) - 1}
        items.append({"key": "000", "index": p.index, "level": p.level, "subject": p.subject,
                      "text": tok.decode(list(per["none"][0].input_ids)), "conds": conds, "act": None})
    return {"name": name, "disp": disp, "layers": layers, "heads": heads, "conditions": list(prompts[0][1]),
            "marks": {}, "prompts": items, "sources": ["benchmark"]}


def size_table(params) -> None:
    print("| model | prompt | tokens (none / mless / mful) | heads x layers | naive float16, MiB | page, MiB | encode s |")
    print("|---|---|---|---|---:|---:|---:|")
    total_naive = total_page = 0.0
    for name in params.models:
        prompts, tok, layers, heads = showcase_attention(params, name)
        for p, per in prompts:
            blobs: list[str] = []
            t0 = time.perf_counter()
            entry(name, name, [(p, per)], tok, layers, heads, blobs)
            secs = time.perf_counter() - t0
            naive = sum(probs.astype(np.float16).nbytes * 4 / 3 for _, probs in per.values()) / 2**20
            page = sum(len(b) for b in blobs) / 2**20
            total_naive, total_page = total_naive + naive, total_page + page
            lens = " / ".join(str(len(b.input_ids)) for b, _ in per.values())
            print(f"| {name} | {p.index} | {lens} | {len(heads)} x {len(layers)} | {naive:.2f} | {page:.2f} | {secs:.2f} |")
    print(f"| all | | | | {total_naive:.2f} | {total_page:.2f} | |")
    print(f"\nmatrices of the default showcase: {total_page:.2f} MiB in the page, {total_naive:.2f} MiB as float16 base64")


def first_paint(params, name: str, repeat: int) -> None:
    from playwright.sync_api import sync_playwright

    from stages import explorer

    prompts, tok, layers, heads = showcase_attention(params, name, n_tokens=512)
    blobs: list[str] = []
    t0 = time.perf_counter()
    page_text = explorer.render([entry(name, name, prompts, tok, layers, heads, blobs)], blobs)
    gen = time.perf_counter() - t0
    folder = Path(tempfile.mkdtemp(prefix="explorer-bench."))
    path = folder / "explorer.html"
    path.write_text(page_text, encoding="utf-8")
    T = len(prompts[0][1]["mless"][0].input_ids)
    paints, steps = [], []
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(repeat):
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.goto(path.as_uri() + f"#model={name}&prompt=0&layer=1&head=1&cond=mless", wait_until="load")
            while not page.evaluate("() => window.explorerFirstPaint !== undefined"):
                time.sleep(0.01)
            paints.append(page.evaluate("window.explorerFirstPaint"))
            for _ in range(3):
                old = page.evaluate("document.body.dataset.view")
                t = time.perf_counter()
                page.keyboard.press("ArrowRight")
                while page.evaluate("document.body.dataset.view") == old:
                    time.sleep(0.002)
                steps.append(1000 * (time.perf_counter() - t))
            page.close()
        browser.close()
    shutil.rmtree(folder)
    print(f"\n512 x 512: {name}, mless prompt of {T} tokens, {len(heads)} heads x {len(layers)} layers x 3 conditions; "
          f"page {len(page_text) / 2**20:.2f} MiB, made in {gen:.2f} s")
    print(f"time to first paint: median {statistics.median(paints):.0f} ms (min {min(paints):.0f}, max {max(paints):.0f}, "
          f"{repeat} loads); next head (full redraw): median {statistics.median(steps):.0f} ms")
    print(f"ratio: first paint / 1 s = {statistics.median(paints) / 1000:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2_5-coder-0_5b")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    params = load_params()
    load = OtherLoad()
    import torch

    print(machine(torch.get_num_threads()))
    size_table(params)
    first_paint(params, args.model, args.repeat)
    print(load)


if __name__ == "__main__":
    main()
