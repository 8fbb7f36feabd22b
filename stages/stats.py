"""stats@<model>: averaged attention statistics from extract's `artifacts/attention/<model>.h5`, the drops of attention
on original tokens under each condition against `none`, with paired bootstrap intervals (DEFINITIONS: each dataset).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from meaningless_tokens import cli, store
from meaningless_tokens.errors import names_the_file
from meaningless_tokens.measures.extract import PROMPT_CONDITIONS
from meaningless_tokens.measures.stats import REQUIRED, Attention, averages, read
from meaningless_tokens.config import Params
from meaningless_tokens.stage import INDEXING, StageContext, header, stage_context
from meaningless_tokens.store import provenance, put, put_json_attr, write_csv_atomic, write_h5, write_timing

# what the artifact's `definitions` attribute says, and `--help`: a constant, not the docstring, so that an edit of the
# docstring leaves the attribute as it is (the file's code hash, in provenance, still changes: the stage reruns)
DEFINITIONS = """stats@<model>: averaged attention statistics from `artifacts/attention/<model>.h5`.

Definitions (j: original token index, i.e. position in the `none` prompt; pos(j): its position in
a condition's prompt; T: that prompt's length; N: the number of original tokens):

  original_avg[c][l, h, j]  attention original token j receives, averaged over the queries of the
                            query set (`stats.query_set`), then over samples that have token j:
                              original: the original tokens at or after j  (N - j queries; default)
                              all:      every token at or after pos(j), span tokens included (T - pos(j))
                              last:     the last prompt token (1 query)
  full_avg[c][l, h, p]      attention position p of the whole prompt receives from all queries at or
                            after p, averaged over those T - p queries, then over samples
  span_mass[c][l, h]        attention mass each original query after the span gives to the span,
                            averaged over those queries, then over samples (0 for none); the rest,
                            1 - span_mass, goes to original tokens
  orig_mean[c][s, l, h]     mean of original_avg over original tokens j >= 1 (j >= 0 when
                            stats.exclude_first is false: position 0 is the attention sink)
  drop[c][l, h]             mean over samples of orig_mean[none] - orig_mean[c]; drop_pct is it in
                            percent of mean orig_mean[none]; both with seeded bootstrap 95% intervals
                            over samples (paired)
  head_rank[c][l]           heads of layer l ordered by drop, largest first
  layer_drop_pct[c][l]      the drop of the layer as a whole: heads averaged before the ratio, in percent of
                            none, with layer_drop_pct_ci (paired bootstrap over samples); the report's verdict
  first_layer_lead_pct[c]   layer_drop_pct of the first analysed layer minus the largest of the later ones,
                            with its paired bootstrap interval (absent with one layer)
  mful_gap_pct[mless][l]    layer_drop_pct of mless minus that of mful (the meaningless span's extra drop),
                            with its paired bootstrap interval (only when mful was run)

Also writes `artifacts/plots/original/<model>.csv` and `artifacts/plots/full/<model>.csv` (the
tables `dvc plots` draws): original_avg and full_avg of the top-ranked head (mless drop) of the
first analysed layer, columns position, none, mless, mful (`nan` where a condition was not run or its
prompts are shorter: plots leave those points out), layer, head (0-based), and the run's sidecar
`metrics/timing/stats-<model>.json` (seconds, git commit of the code).
"""

# the stage's outputs, and its input (src: extract's artifact) relocated with them: role -> artifact kind (store.PATHS)
OUTPUTS = {"src": "attention", "out": "stats", "original": "plots/original", "full": "plots/full",
           "timing": "timing/stats"}


@names_the_file
def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "stats", name, root, **OUTPUTS)
    params, out = ctx.params, ctx.where["out"]
    cfg = params.stats
    att = load_attention(ctx, cfg.query_set)
    results = averages(att, cfg)

    write_artifact(out, params, name, att, results)
    for kind in ("original", "full"):
        write_plot_table(ctx.where[kind], kind, results, att.layers)
    write_timing(ctx.where["timing"], {"seconds": ctx.seconds()})
    print(f"{name}: statistics of {len(att.n_orig)} samples ({cfg.query_set} queries) -> {out}")
    return out


def load_attention(ctx: StageContext, query_set: str) -> Attention:
    """The attention artifact's vectors (`ctx.where["src"]`), refused (one line naming the file) when a dataset is
    missing or the file was made for another model, by another stage or with other params than today's."""
    with ctx.read_h5("src", "attention", REQUIRED) as f:
        return read(f, query_set)


def write_artifact(out: Path, params: Params, name: str, att: Attention, results: dict) -> None:
    """artifacts/stats/<model>.h5: the averages per condition, with the extraction's provenance inside."""
    cfg = params.stats
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, layers=att.layers, heads=att.heads, conditions=att.conditions,
               query_set=cfg.query_set, exclude_first=cfg.exclude_first, n_samples=len(att.n_orig), indexing=INDEXING,
               definitions=DEFINITIONS)
        put_json_attr(f, "provenance", {**provenance("stats"), "source": str(store.path(OUTPUTS["src"], name)),
                                        "extract_provenance": att.provenance,
                                        "params": store.stage_params(params, "stats", name)})
        put(f, "problem_index", att.problem_index)
        for c in att.conditions:
            g = f.create_group(c)
            starts = np.array(sorted({tuple(s) for s in att.spans[c]}), dtype=np.int32)
            g.attrs["span"] = starts[0] if len(starts) == 1 else np.array([-1, -1], dtype=np.int32)
            for k, v in results[c].items():
                put(g, k, v.astype(np.float64) if v.dtype.kind == "f" else v)


def write_plot_table(path: Path, kind: str, results: dict, layers) -> None:
    """`kind`_avg of the top mless-drop head of the first layer, one row per position, for `dvc plots`.

    Fixed columns (position, none, mless, mful, layer, head), whatever conditions ran, so that the
    plot definitions in dvc.yaml hold for every model and experiment."""
    conditions = list(results)
    ref = "mless" if "mless" in results else conditions[-1]
    head = int(results[ref]["head_rank"][0, 0]) if "head_rank" in results[ref] else 0
    avg = {c: results[c][f"{kind}_avg"][0, head] for c in conditions}
    rows = []
    for p in range(max(len(v) for v in avg.values())):
        cells = ["nan" if c not in avg or p >= len(avg[c]) or np.isnan(avg[c][p]) else f"{avg[c][p]:.6g}"
                 for c in PROMPT_CONDITIONS]
        rows.append([p, *cells, int(layers[0]), head])
    write_csv_atomic(path, ["position", *PROMPT_CONDITIONS, "layer", "head"], rows)


def main(argv: list[str] | None = None) -> int:
    return cli.main("stats", DEFINITIONS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
