"""explorer: reports/explorer.html, the showcase prompts one by one, in the browser.

Reads the full attention matrices extract stores for its first `extract.showcase` problems
(`artifacts/attention/<model>.h5`, group `showcase`, [layer, head, query, key]) and the layer-0 MLP
activations of the first `activations.showcase` problems (`artifacts/activations/<model>.h5`), decodes
each prompt token with the model's tokenizer (from any conversion of the model or its source; nothing is
converted and no model is run), and writes one self-contained page: no network request, no library, scripts
and styles written here
(meaningless_tokens/templates/explorer.html.j2). For every model and showcase prompt it shows the heatmap of one
layer, head and condition with the tokens on both axes, the rows and columns as bars, none / mless / mful
aligned over the original tokens, thumbnails of every head of the layer (the heads the report's charts show
marked), and per token the share of near-zero activations and the L1 of `a` under each condition.

Encoding (the page stays a few MB): each attention row i (keys 0..i; causal, so nothing above the diagonal)
is stored as its maximum `s` (float32) and one byte per key, q = round(255 * sqrt(w / s)); the page shows
w' = s * (q / 255)^2, so |w' - w| <= (2 * sqrt(w * s) + s / 510) / 510 (QUANT_BOUND): small weights keep
most of their precision. Each (model, prompt, condition) is one zlib stream, base64 in the page, inflated
by the browser's DecompressionStream when first shown. Activation measures are rounded to 5 significant
digits. Nothing is left out; a prompt that is in the activation showcase but not in the attention showcase
is not shown (the page is organised by the attention showcase).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from meaningless_tokens import TEMPLATES, cli, store
from meaningless_tokens.report import explorer
from meaningless_tokens.config import Params
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.store import atomic_path

OUTPUTS = {"out": "explorer"}  # the stage's output: role -> artifact kind (store.PATHS)


def script_json(data) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' (written as \\u escapes)."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(entries: list[dict], blobs: list[str]) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from markupsafe import Markup

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      keep_trailing_newline=True)
    data = {"models": entries, "levels": explorer.LEVELS}
    # script_json leaves no '<', '>' or '&': the JSON goes into its <script> as it is (HTML escaping would break it)
    return env.get_template("explorer.html.j2").render(data=Markup(script_json(data)), blobs=blobs)


@names_the_file
def run(params: Params, root: Path | None = None) -> Path:
    """The page of the project's showcase prompts, written under `root` (default: the project)."""
    import time

    params = store.params_view(params, "explorer")  # the keys dvc.yaml lists for it, no other
    started = time.perf_counter()
    out = store.outputs(params, None, root, **OUTPUTS)["out"]
    entries, blobs = explorer.explore(params)
    page = render(entries, blobs)
    with atomic_path(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    n = sum(len(e["prompts"]) for e in entries)
    print(f"explorer: {len(entries)} models, {n} prompts in {time.perf_counter() - started:.1f} s -> {out} "
          f"({out.stat().st_size / 2**20:.2f} MiB)")
    return out


def main(argv: list[str] | None = None) -> int:
    return cli.main("explorer", __doc__, run, argv, per_model=False)


if __name__ == "__main__":
    sys.exit(main())
